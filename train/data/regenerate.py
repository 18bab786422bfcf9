"""On-policy data: regenerate every assistant turn with the target itself.

EAGLE-3, DFlash and vLLM speculators all train on target-regenerated replies: the drafter then
learns the distribution it will be asked to predict at serving time. Turns are regenerated in
order (turn k's prompt holds the target's own replies to turns < k), batched across conversations
with left padding, greedy or sampled. The result is cached as JSONL (``messages`` layout) keyed by
the source data, the target's files and the generation settings.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from common.atomic import atomic_open
from .chat import ChatRenderer
from .readers import Conversation

log = logging.getLogger(__name__)


def target_fingerprint(path: str) -> list[Any]:
    folder = Path(path)
    if not folder.is_dir():
        return [path]
    return [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in sorted(folder.iterdir()) if f.is_file()]


@torch.no_grad()
def regenerate_conversations(
    conversations: list[Conversation],
    model: Any,
    renderer: ChatRenderer,
    cfg: Any,
    max_length: int,
    progress: bool = True,
) -> tuple[list[Conversation], dict[str, int]]:
    """Replace each assistant turn with the target's reply to the (regenerated) turns before it.

    Args:
        conversations: source conversations.
        model: the target (an HF causal LM; ``generate`` is used).
        renderer: renders prompts with the target's chat template.
        cfg: ``RegenerateConfig`` (max_new_tokens, temperature, top_p, top_k, batch_size, seed).
        max_length: a turn whose prompt already holds this many tokens ends the conversation there.

    Returns:
        The regenerated conversations (same ids; turns after a too-long prompt are cut) and counts.
    """
    from tqdm.auto import tqdm

    tokenizer = renderer.tokenizer
    device = next(model.parameters()).device
    generator_seed = cfg.seed
    torch.manual_seed(generator_seed)
    messages = [[dict(m) for m in c.messages] for c in conversations]
    # The k-th assistant turn of each conversation, as message indices.
    assistant_turns = [[i for i, m in enumerate(ms) if m["role"] == "assistant"] for ms in messages]
    cut_at = [None] * len(messages)
    stats = {"turns_regenerated": 0, "conversations_cut": 0}
    max_turns = max((len(t) for t in assistant_turns), default=0)
    bar = tqdm(total=sum(len(t) for t in assistant_turns), desc="regenerate", unit="turn", disable=not progress, leave=False)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    for k in range(max_turns):
        todo = [c for c in range(len(messages)) if k < len(assistant_turns[c]) and cut_at[c] is None]
        prompts = {}
        for c in todo:
            turn = assistant_turns[c][k]
            ids = tokenizer(renderer.render(messages[c][:turn], add_generation_prompt=True), add_special_tokens=False)["input_ids"]
            if len(ids) >= max_length:
                cut_at[c] = turn
                stats["conversations_cut"] += 1
                bar.update(len(assistant_turns[c]) - k)
                continue
            prompts[c] = ids
        order = sorted(prompts, key=lambda c: len(prompts[c]))  # similar lengths share a batch
        for b in range(0, len(order), cfg.batch_size):
            batch = order[b : b + cfg.batch_size]
            width = max(len(prompts[c]) for c in batch)
            input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
            attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, c in enumerate(batch):  # left padding: every prompt ends at the last column
                input_ids[row, width - len(prompts[c]) :] = torch.as_tensor(prompts[c])
                attention_mask[row, width - len(prompts[c]) :] = 1
            sampling = dict(do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k or None) if cfg.temperature > 0 else dict(do_sample=False, temperature=None, top_p=None, top_k=None)
            out = model.generate(
                input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                max_new_tokens=min(cfg.max_new_tokens, max_length - width), pad_token_id=pad_id,
                eos_token_id=tokenizer.eos_token_id, **sampling,
            )
            for row, c in enumerate(batch):
                new_tokens = out[row, width:].tolist()
                if tokenizer.eos_token_id in new_tokens:
                    new_tokens = new_tokens[: new_tokens.index(tokenizer.eos_token_id)]
                messages[c][assistant_turns[c][k]]["content"] = tokenizer.decode(new_tokens, skip_special_tokens=True)
                stats["turns_regenerated"] += 1
            bar.update(len(batch))
    bar.close()
    result = []
    for c, conversation in enumerate(conversations):
        ms = messages[c]
        if cut_at[c] is not None:  # keep up to the last regenerated reply
            last_reply = max((i for i in assistant_turns[c] if i < cut_at[c]), default=-1)
            ms = ms[: last_reply + 1]
        if ms:
            result.append(Conversation(id=conversation.id, messages=ms))
    return result, stats


def write_jsonl_atomic(conversations: list[Conversation], path: Path) -> None:
    with atomic_open(path) as f:
        for c in conversations:
            f.write(json.dumps({"id": c.id, "messages": c.messages}, ensure_ascii=False) + "\n")
