"""On-policy data: regenerate every assistant turn with the target itself, through an engine.

EAGLE-3, DFlash and vLLM speculators all train on target-regenerated replies: the drafter then
learns the distribution it will be asked to predict at serving time. Turns are regenerated in
order (turn k's prompt holds the target's own replies to turns < k), greedy or sampled, by one of
four engines (``data.regenerate.engine``):

    hf      Hugging Face ``generate``, batches of ``batch_size`` left-padded prompts (in process)
    ours    our decoding loop on the target alone (static KV cache, captured steps on a GPU), ``batch_size`` in flight;
            greedy, each conversation's turns one after another in one row (``reuse_turns``, default): a later turn's
            prompt is prefilled only past the earlier turns and the reply its row holds, and no turn waits for the
            whole turn before it (the other engines, and ``ours`` sampled, go turn by turn, every prompt whole)
    vllm    vLLM in its own environment (``SWA_VLLM_PYTHON``), ``concurrency`` prompts per request
    server  a running OpenAI-compatible server (``server_url``: ``vllm serve``, SGLang), ``concurrency`` in flight

Every finished reply is appended to ``<cache>.partial.jsonl`` as it arrives (flushed; split over
``data.regenerate.processes``, process i appends to ``<cache>.partial.i.jsonl``), so a killed run
loses at most the requests in flight and the same command resumes; the finished set is written as
``<cache>.jsonl`` (``messages`` layout) by temp name and rename, keyed by the source data, the target's
files, the template and the generation settings, and the partial file removed.

A reply the engine stopped at its token budget, before the target's end of sequence, is stored with
``"complete": false`` on its message: the chat template closes every turn with an end-of-turn token, and
trained on, that token would teach the drafter an end the target never produced there (at the recipes'
budgets most replies of the repetitive 27M target are cut). ``ChatRenderer`` leaves it out of the loss
mask; the reply's own tokens are the target's and stay in.

Each reply is stored with its ``token_ids`` too (engines that return ids: all but ``server``), and the training rows
are built from them (``ChatRenderer``): decoded and tokenized again, 10% of the quickstart's trained labels were not
the target's own greedy tokens (``benchmarks/on_policy_check.py``). Turn k's prompt holds the earlier replies as their
ids too, so a regenerated conversation's row is token for token the sequence its replies were generated in.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Iterator, NamedTuple, Sequence

import torch

from common.atomic import atomic_open
from infer.serving import cut_at_eos, reply_ended
from models.hub import cached_snapshot, is_hub_id
from .chat import ChatRenderer
from .readers import Conversation

log = logging.getLogger(__name__)

# Changes what a regenerated file holds (its cache key carries it): 2 = cut replies marked ``"complete": false``;
# 3 = replies carry their ``token_ids`` and later turns' prompts hold them (decoded without cleaning up spaces).
REPLIES_VERSION = 3


class Reply(NamedTuple):
    """One engine answer: ``tokens`` (end of sequence cut) or, from a server without token ids, ``text``; ``complete``:
    the target ended it (an end-of-sequence token within its budget), not the budget."""

    index: int
    tokens: list[int] | None
    text: str | None
    complete: bool


def reply_within(index: int, tokens: list[int], eos: list[int], budget: int) -> Reply:
    """An engine's tokens for prompt ``index`` as its reply: cut to its own budget (a run for several prompts decodes
    to the largest) and at its end of sequence, complete where the target ended it within the budget."""
    return Reply(index, cut_at_eos(tokens[:budget], eos), None, reply_ended(tokens, eos, budget))


def hashed_seed(key: str) -> int:
    """A 63-bit seed drawn from ``key`` (the same on every machine and run, unlike ``hash``)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") & (2**63 - 1)


def reply_seed(seed: int, conversation: int, turn: int) -> int:
    """The sampling seed of one reply: ``data.regenerate.seed`` with the conversation's index and the turn. Every prompt
    drew from one seed before (``ours``): replies to the same prompt (a prompt sampled several times) came out alike,
    and different prompts shared their random draws."""
    return hashed_seed(f"{seed}/{conversation}/{turn}")


def target_fingerprint(path: str) -> list[Any]:
    """What the regenerated replies' cache key holds of the target: a local folder's files; a hub id's name and the
    revision of its cached snapshot (a new revision behind the same id keyed by its name alone reused the replies of the
    old one); else the name alone."""
    folder = Path(path)
    if folder.is_dir():
        return [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in sorted(folder.iterdir()) if f.is_file()]
    if not is_hub_id(path):
        return [path]
    snapshot = cached_snapshot(path)
    if snapshot is None:
        log.warning("target.path=%r: a hub id without a snapshot in the local Hugging Face cache; the regenerated replies "
                    "are keyed by its name alone, and a new revision behind it would reuse replies of the old one", path)
        return [path]
    # the snapshot's folder name is its commit hash: it fixes every file's content (its file list grows as other tools
    # fetch more files into it, and copies of the cache change modification times: neither changes the replies)
    return [path, snapshot.name]


class HFReplies:
    """Hugging Face ``generate`` on the target, ``batch_size`` prompts of similar length per batch, left-padded.

    A reply depends on its batch (its neighbours' padding; with sampling, the random draws of the whole batch): the
    batches are formed over every prompt of a turn, those a killed run answered included (``skip``: answered, not
    handed out again), so a resumed run generates the same batches as an uninterrupted one, each seeded from its
    members' ``seeds`` (a resumed sampled run drew other replies than the uninterrupted one: the batches after the kill
    held other prompts and the global generator stood elsewhere)."""

    whole_batches = True  # regenerate_conversations hands it the prompts already answered too, in ``skip``

    def __init__(self, model: Any, tokenizer: Any, cfg: Any):
        self.model, self.tokenizer, self.cfg = model, tokenizer, cfg
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    @torch.no_grad()
    def replies(self, prompts: list[list[int]], budgets: list[int], seeds: list[int] | None = None,
                skip: frozenset[int] | set[int] = frozenset()) -> Iterator[Reply]:
        from transformers import GenerationConfig

        cfg, device = self.cfg, next(self.model.parameters()).device
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths share a batch
        sampling = (dict(do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k or None) if cfg.temperature > 0
                    else dict(do_sample=False, temperature=None, top_p=None, top_k=None))
        for b in range(0, len(order), cfg.batch_size):
            batch = order[b : b + cfg.batch_size]
            if all(i in skip for i in batch):  # answered before a kill
                continue
            if cfg.temperature > 0:  # the batch's draws follow its members, not the batches before it
                members = [cfg.seed if seeds is None else seeds[i] for i in batch]
                torch.manual_seed(hashed_seed(json.dumps(members)))
            width = max(len(prompts[i]) for i in batch)
            input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
            attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, i in enumerate(batch):  # left padding: every prompt ends at the last column
                input_ids[row, width - len(prompts[i]) :] = torch.as_tensor(prompts[i])
                attention_mask[row, width - len(prompts[i]) :] = 1
            # the batch's largest budget, each reply cut to its own (the smallest, the longest prompt's room in a batch
            # sorted by prompt length, cut every reply of the batch to it)
            # the target's plain distribution: the model's own generation_config.json filled every setting not passed
            # here (Qwen2.5-Instruct's repetition_penalty 1.05, a no_repeat_ngram_size, num_beams...), and the replies
            # were neither the target's greedy ones nor those ``ours`` gives
            saved, self.model.generation_config = self.model.generation_config, GenerationConfig()
            try:
                out = self.model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                                          max_new_tokens=max(budgets[i] for i in batch), pad_token_id=self.pad_id,
                                          eos_token_id=self.tokenizer.eos_token_id, **sampling)
            finally:
                self.model.generation_config = saved
            eos = [self.tokenizer.eos_token_id]
            for row, i in enumerate(batch):
                if i in skip:
                    continue
                raw = out[row, width:width + budgets[i]].tolist()  # a row that ended is padded past its end of sequence
                yield reply_within(i, raw, eos, budgets[i])


class OurReplies:
    """Our decoding loop on the target alone: the static target (KV buffers written by position, captured steps on a
    GPU) with ``batch_size`` prompts in flight (``infer.batch``: finished rows refilled in waves of prefills), each row's
    tokens those of batch 1. Replies are handed out per chunk of 16 batches' prompts (a chunk ends with its rows
    draining), so a kill loses at most the chunk in flight."""

    def __init__(self, model: Any, tokenizer: Any, cfg: Any):
        from infer.batch import generate_batch
        from infer.loading import decoding_target
        from models.sampling import SamplingConfig

        self.generate_batch, self.batch_size, self.run_steps = generate_batch, cfg.batch_size, cfg.run_steps
        self.max_new_tokens, self.reuse_turns, self.run_ahead = cfg.max_new_tokens, cfg.reuse_turns, cfg.run_ahead
        self.target = decoding_target(model, [])
        self.eos = [tokenizer.eos_token_id]
        self.sampling = SamplingConfig(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, seed=cfg.seed)

    def replies(self, prompts: list[list[int]], budgets: list[int], seeds: list[int] | None = None) -> Iterator[Reply]:
        from models.static_target import StaticTarget

        if not isinstance(self.target, StaticTarget):  # a target only the eager one runs (gpt-oss): one prompt at a time
            yield from self.replies_one_by_one(prompts, budgets, seeds)
            return
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths share a chunk: a smaller capacity
        chunk = 16 * self.batch_size
        for start in range(0, len(order), chunk):
            part = order[start:start + chunk]
            # one budget per chunk (the largest), each reply cut to its own: a longer run only extends a reply's tail
            outs = self.generate_batch(self.target, None, [prompts[i] for i in part], max(budgets[i] for i in part),
                                       batch_size=self.batch_size, sampling=self.sampling, eos_token_ids=self.eos,
                                       run_steps=self.run_steps, seeds=None if seeds is None else [seeds[i] for i in part],
                                       run_ahead=self.run_ahead)
            for i, out in zip(part, outs):
                yield reply_within(i, out.tokens, self.eos, budgets[i])

    @property
    def streams(self) -> bool:
        """Whether ``replies_in_streams`` runs (``data.regenerate.reuse_turns``, greedy, the static target)."""
        from models.static_target import StaticTarget

        return self.reuse_turns and self.sampling.greedy and isinstance(self.target, StaticTarget)

    def replies_in_streams(self, num_streams: int, next_prompt: Any, max_length: int) -> None:
        """Each stream's prompts one after another in one row (a conversation's turns): ``next_prompt(stream, reply)``
        returns the stream's next ``(prompt ids, budget)`` after ``reply`` (None at its start), or None when the stream
        is done. A prompt is prefilled only past what its row holds already: the earlier turns and the reply just
        generated (``infer.batch.generate_streams``' prefix reuse), where turn by turn (``replies``) every prompt is
        prefilled whole, and every turn waits for the whole turn before it. Greedy only: a stream's requests share its
        seed, where the turn-by-turn path seeds each reply by its conversation and turn (``reply_seed``)."""
        from infer.batch import generate_streams

        if not self.streams:
            raise ValueError("replies_in_streams: greedy on the static target with data.regenerate.reuse_turns=true only "
                             f"(temperature={self.sampling.temperature}, reuse_turns={self.reuse_turns}, target {type(self.target).__name__})")
        budgets: dict[int, int] = {}

        def driver(stream: int, finished: Any) -> list[int] | None:
            reply = None
            if finished is not None:  # one budget for the run (the largest); each reply cut to its own, as in ``replies``
                reply = reply_within(stream, finished.tokens, self.eos, budgets.pop(stream))
            request = next_prompt(stream, reply)
            if request is None:
                return None
            prompt, budgets[stream] = request
            return prompt

        if num_streams:
            generate_streams(self.target, None, driver, num_streams, batch_size=self.batch_size,
                             capacity=max_length + self.max_new_tokens + 1, max_new_tokens=self.max_new_tokens,
                             sampling=self.sampling, eos_token_ids=self.eos, run_steps=self.run_steps, run_ahead=self.run_ahead)

    def replies_one_by_one(self, prompts: list[list[int]], budgets: list[int], seeds: list[int] | None) -> Iterator[Reply]:
        """``generate`` on each prompt, its generator seeded as ``generate_batch`` seeds the prompt's row (the same reply)."""
        from dataclasses import replace

        from infer.generate import generate

        for i, (prompt, budget) in enumerate(zip(prompts, budgets)):
            sampling = self.sampling if seeds is None else replace(self.sampling, seed=int(seeds[i]))
            tokens = generate(self.target, None, prompt, budget, sampling, eos_token_ids=self.eos).tokens
            yield reply_within(i, tokens, self.eos, budget)

    def close(self) -> None:
        """Drop the static target (fused weight copies and the KV buffers of ``batch_size`` rows, held into training
        otherwise: a reference cycle inside it waits for the collector) and hand the memory back."""
        self.target = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


class EngineReplies:
    """vLLM in its own process (``concurrency`` prompts per request, batched by vLLM) or a running server
    (``concurrency`` requests in flight), through ``infer.serving``."""

    def __init__(self, engine: Any, cfg: Any):
        from models.sampling import SamplingConfig

        self.engine, self.concurrency = engine, cfg.concurrency
        self.sampling = SamplingConfig(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, seed=cfg.seed)

    def replies(self, prompts: list[list[int]], budgets: list[int], seeds: list[int] | None = None) -> Iterator[Reply]:
        # seeds: one per reply (``reply_seed``), as ``ours`` and ``hf`` draw them; one seed for all gave a repeated
        # prompt identical sampled replies
        if hasattr(self.engine, "complete_many"):  # a server: replies in the order they arrive
            for i, tokens, text, complete in self.engine.complete_many(prompts, budgets, self.sampling, seeds):
                yield Reply(i, tokens, text, complete)
            return
        for start in range(0, len(prompts), self.concurrency):
            chunk = list(range(start, min(start + self.concurrency, len(prompts))))
            outs = self.engine.generate_many([prompts[i] for i in chunk], [budgets[i] for i in chunk], self.sampling,
                                              None if seeds is None else [seeds[i] for i in chunk])
            for i, (tokens, complete) in zip(chunk, outs):
                yield Reply(i, tokens, None, complete)

    def close(self) -> None:
        self.engine.close()


def reply_engine(cfg: Any, target: Any, max_length: int):
    """The engine ``data.regenerate.engine`` names, started (vLLM's start-up or the server's first answer fail here,
    in one line)."""
    from infer.serving import ServerEngine, VllmEngine
    from models.builtin_targets import resolve_target_path

    eos = [target.tokenizer.eos_token_id]
    if cfg.engine == "hf":
        return HFReplies(target.model, target.tokenizer, cfg)
    if cfg.engine == "ours":
        return OurReplies(target.model, target.tokenizer, cfg)
    if cfg.engine == "vllm":
        return EngineReplies(VllmEngine(cfg.vllm_python, resolve_target_path(target.path), None, None, 0, eos, max_length,
                                        max_num_seqs=cfg.concurrency, python_setting="data.regenerate.vllm_python"), cfg)
    return EngineReplies(ServerEngine(cfg.server_url, eos, cfg.concurrency), cfg)


def read_partial(path: Path) -> dict[tuple[int, int], tuple[str, bool, list[int] | None]]:
    """Replies a killed run finished: (conversation index, assistant turn k) -> (content, complete, token ids or None).
    A line cut by the kill is dropped."""
    done = {}
    if path.exists():
        # line by line from bytes: a kill (or a full disk) can cut a line inside a multi-byte character, and decoding the
        # whole file first failed every resume on it
        for raw in path.read_bytes().split(b"\n"):
            try:
                row = json.loads(raw.decode("utf-8"))
                done[(row["conversation"], row["turn"])] = (row["content"], bool(row["complete"]), row.get("token_ids"))
            except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
                continue
    return done


def open_partial(path: Path):
    """``path`` opened for appending replies. A killed run's last line may be cut (no newline at the end): the next reply
    then starts a line of its own, not glued to the fragment, which would lose it too on the next resume."""
    cut_line = False
    if path.exists() and path.stat().st_size > 0:
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            cut_line = f.read(1) != b"\n"
    sink = open(path, "a", encoding="utf-8")
    if cut_line:
        sink.write("\n")
    return sink


def set_reply(message: dict[str, Any], content: str, complete: bool, token_ids: list[int] | None = None) -> None:
    message["content"] = content
    message.pop("complete", None)
    if not complete:  # only cut replies carry the key: a file of finished replies reads as any messages file
        message["complete"] = False
    message.pop("token_ids", None)  # a source's own ids belong to the reply replaced
    if token_ids is not None:
        message["token_ids"] = list(token_ids)


def regenerate_conversations(
    conversations: list[Conversation],
    engine: Any,
    renderer: ChatRenderer,
    cfg: Any,
    max_length: int,
    progress: bool = True,
    partial: Path | None = None,
    resume: Sequence[Path] = (),
    indices: Sequence[int] | None = None,
) -> tuple[list[Conversation], dict[str, int]]:
    """Replace each assistant turn with the target's reply to the (regenerated) turns before it.

    Args:
        conversations: source conversations.
        engine: ``HFReplies``, ``OurReplies`` or ``EngineReplies`` (``reply_engine``), or an HF causal LM (``hf``).
        renderer: renders prompts with the target's chat template.
        cfg: ``RegenerateConfig`` (max_new_tokens, temperature, top_p, top_k, batch_size, seed, ...).
        max_length: a turn whose prompt already holds this many tokens ends the conversation there (kept ones too).
        partial: JSONL file each reply is appended to as it arrives; replies already there are not asked again.
        resume: more such files to read replies from (another split's parts: ``regenerate_in_processes``).
        indices: each conversation's index in the whole data (default: its position here), which its replies' seeds and
            the partial files' lines are keyed by: a share of the data regenerates as it does within the whole.

    Returns:
        The regenerated conversations (same ids; turns after a too-long prompt are cut) and counts.
    """
    messages, stats = regenerate_messages(conversations, engine, renderer, cfg, max_length, progress, partial, resume, indices)
    return [Conversation(id=c.id, messages=ms) for c, ms in zip(conversations, messages) if ms], stats


def regenerate_messages(conversations: list[Conversation], engine: Any, renderer: ChatRenderer, cfg: Any, max_length: int,
                        progress: bool = True, partial: Path | None = None, resume: Sequence[Path] = (),
                        indices: Sequence[int] | None = None) -> tuple[list[list[dict[str, Any]]], dict[str, int]]:
    """``regenerate_conversations``' work: each conversation's messages (empty where its first prompt was too long)."""
    from tqdm.auto import tqdm

    tokenizer = renderer.tokenizer
    if not hasattr(engine, "replies"):
        engine = HFReplies(engine, tokenizer, cfg)
    whole_batches = getattr(engine, "whole_batches", False)
    torch.manual_seed(cfg.seed)
    messages = [[dict(m) for m in c.messages] for c in conversations]
    # The k-th assistant turn of each conversation, as message indices.
    assistant_turns = [[i for i, m in enumerate(ms) if m["role"] == "assistant"] for ms in messages]
    cut_at = [None] * len(messages)
    stats = {"turns_regenerated": 0, "conversations_cut": 0, "turns_resumed": 0, "turns_kept": 0, "replies_cut_at_budget": 0}
    max_turns = max((len(t) for t in assistant_turns), default=0)
    index = list(range(len(conversations))) if indices is None else list(indices)
    done = {}
    for path in dict.fromkeys([*resume, *([partial] if partial is not None else [])]):
        done.update(read_partial(path))
    sink = None
    if partial is not None:
        partial.parent.mkdir(parents=True, exist_ok=True)
        sink = open_partial(partial)
    bar = tqdm(total=sum(len(t) for t in assistant_turns), desc="regenerate", unit="turn", disable=not progress, leave=False)

    def turn_prompt(c: int, k: int) -> list[int] | None:
        """Conversation c's turn k: its prompt ids to answer, or None where there is nothing to generate (the conversation
        cut at max_length from this turn on, a kept reply, or one answered before a kill: filled in here)."""
        turn = assistant_turns[c][k]
        ids = renderer.prompt_ids(messages[c][:turn], conversations[c].id)  # earlier replies as their ids
        if len(ids) >= max_length:
            cut_at[c] = turn
            stats["conversations_cut"] += 1
            bar.update(len(assistant_turns[c]) - k)
            return None
        if k < cfg.keep_replies:  # already the target's (data.regenerate.keep_replies)
            stats["turns_kept"] += 1
            bar.update(1)
            return None
        if (index[c], k) in done:  # answered before a kill
            set_reply(messages[c][turn], *done[(index[c], k)])
            stats["turns_resumed"] += 1
            stats["replies_cut_at_budget"] += not done[(index[c], k)][1]
            bar.update(1)
            return ids if whole_batches else None
        return ids

    def reply_budget(ids: list[int]) -> int:  # what max_length leaves a prompt, at most max_new_tokens
        return min(cfg.max_new_tokens, max_length - len(ids))

    def record(c: int, k: int, tokens: list[int] | None, text: str | None, complete: bool) -> None:
        content = (tokenizer.decode(tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)
                   if tokens is not None else text)
        set_reply(messages[c][assistant_turns[c][k]], content, complete, tokens)
        stats["turns_regenerated"] += 1
        stats["replies_cut_at_budget"] += not complete
        if sink is not None:
            sink.write(json.dumps({"conversation": index[c], "turn": k, "content": content, "complete": complete,
                                   "token_ids": None if tokens is None else list(tokens)}, ensure_ascii=False) + "\n")
            sink.flush()
        bar.update(1)

    try:
        if getattr(engine, "streams", False):  # our loop, greedy: each conversation's turns in one row, one after another
            next_turn = [0] * len(messages)

            def next_prompt(c: int, reply: Reply | None) -> tuple[list[int], int] | None:
                if reply is not None:
                    record(c, next_turn[c], reply.tokens, reply.text, reply.complete)
                    next_turn[c] += 1
                while next_turn[c] < len(assistant_turns[c]) and cut_at[c] is None:
                    ids = turn_prompt(c, next_turn[c])
                    if ids is not None:
                        return ids, reply_budget(ids)
                    next_turn[c] += cut_at[c] is None
                return None

            engine.replies_in_streams(len(messages), next_prompt, max_length)
        else:  # turn by turn: every turn's prompts whole, after the whole turn before
            for k in range(max_turns):
                todo, prompts = [], []
                for c in range(len(messages)):
                    if k >= len(assistant_turns[c]) or cut_at[c] is not None:
                        continue
                    ids = turn_prompt(c, k)
                    if ids is not None:
                        todo.append(c)
                        prompts.append(ids)
                budgets = [reply_budget(p) for p in prompts]
                seeds = [reply_seed(cfg.seed, index[c], k) for c in todo]
                if whole_batches:  # the answered prompts too, to batch as the uninterrupted run did; not handed out again
                    answers = engine.replies(prompts, budgets, seeds, skip={i for i, c in enumerate(todo) if (index[c], k) in done})
                else:
                    answers = engine.replies(prompts, budgets, seeds)
                for i, tokens, text, complete in answers:
                    record(todo[i], k, tokens, text, complete)
    finally:
        bar.close()
        if sink is not None:
            sink.close()
    for c in range(len(messages)):
        if cut_at[c] is not None:  # keep up to the last regenerated reply
            last_reply = max((i for i in assistant_turns[c] if i < cut_at[c]), default=-1)
            messages[c] = messages[c][: last_reply + 1]
    return messages, stats


def partial_files(path: Path) -> tuple[Path, list[Path]]:
    """Where the replies of a regeneration into ``path`` are appended as they arrive: ``<key>.partial.jsonl``, and with
    several processes one file each, ``<key>.partial.N.jsonl`` (N >= 1; process 0 appends to the first); and every such
    file there already, which a resume reads whatever the number of processes that wrote them."""
    first = path.with_suffix(".partial.jsonl")
    existing = sorted(path.parent.glob(f"{path.stem}.partial*.jsonl"))
    return first, existing


def share_devices(device: str, processes: int, device_count: int, world_size: int = 1) -> list[str]:
    """Each process's device: with several GPUs visible to a run of one process (no torchrun/DeepSpeed ranks, which own
    one GPU each), round robin over them from the run's own; else all on the run's device. On one GPU the processes
    share it by time slices (no overlap of their kernels without MPS): 4 regenerated at 0.92x one process's rate on an
    H100 (BENCHMARKS.md, fifteenth session)."""
    kind, _, index = device.partition(":")
    if kind != "cuda" or device_count < 2 or world_size > 1:
        return [device] * processes
    first = int(index or 0)
    return [f"cuda:{(first + i) % device_count}" for i in range(processes)]


def regenerate_in_processes(conversations: list[Conversation], target: Any, renderer: ChatRenderer, cfg: Any, max_length: int,
                            progress: bool, partial: Path, resume: Sequence[Path]) -> tuple[list[Conversation], dict[str, int]]:
    """``regenerate_conversations`` split over ``cfg.processes`` processes on the target's device: process i takes
    conversations i, i + N, i + 2N, ... (the lengths mix alike in every share), keyed by their index in the whole data
    (seeds, partial files), and this process takes share 0 with the target it holds. The others each load the target
    as it was loaded here (on another GPU where several are visible: ``share_devices``) and append to a partial file
    of their own. With our engine each row's tokens are those of batch 1, so in fp32 the replies equal one process's
    (tested); in bf16 on a GPU a reply depends on its batch's shapes, as with any ``batch_size``. A failed share raises
    after the others end, naming it, its replies kept for the resume."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    n = cfg.processes
    settings = getattr(target, "load_settings", None)
    if settings is None:
        raise ValueError(f"data.regenerate.processes={n}: the other processes load the target as this one did, and this "
                         "target was not loaded from a folder (TargetModel.from_pretrained)")
    shares = [list(range(i, len(conversations), n)) for i in range(n)]
    from train.config import RegenerateConfig

    # every setting, as plain values (the run's may be an OmegaConf node): the other processes rebuild the same config
    plain_cfg = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(RegenerateConfig)}
    threads = max(1, torch.get_num_threads() // n)  # on a CPU the processes share its cores
    devices = share_devices(settings["device"], n, torch.cuda.device_count() if torch.cuda.is_available() else 0,
                            int(os.environ.get("WORLD_SIZE", "1")))
    log.info("regenerating %d conversations in %d processes on %s (the progress bar counts this process's share)",
             len(conversations), n, ", ".join(dict.fromkeys(devices)))
    messages: list[list[dict[str, Any]] | None] = [None] * len(conversations)
    total: dict[str, int] = {}
    failed = []
    threads_before = torch.get_num_threads()
    # spawned: a forked child would inherit this process's CUDA context, which CUDA does not allow
    with ProcessPoolExecutor(max_workers=n - 1, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {i: pool.submit(regenerate_share, {**settings, "device": devices[i]}, renderer, plain_cfg, max_length,
                                  [conversations[c] for c in shares[i]], shares[i], partial.with_suffix(f".{i}.jsonl"),
                                  list(resume), threads) for i in range(1, n)}
        torch.set_num_threads(threads)
        engine = reply_engine(cfg, target, max_length)
        try:
            results = {0: regenerate_messages([conversations[c] for c in shares[0]], engine, renderer, cfg, max_length,
                                              progress, partial, resume, shares[0])}
        finally:
            getattr(engine, "close", lambda: None)()
            torch.set_num_threads(threads_before)
        for i, future in futures.items():
            try:
                results[i] = future.result()
            except Exception as e:  # noqa: BLE001 - every share is waited for before one failure is raised
                failed.append(f"share {i} ({type(e).__name__}: {' '.join(str(e).split())[:300]})")
    if failed:
        raise RuntimeError(f"data.regenerate.processes={n}: {'; '.join(failed)}; the replies that arrived are kept in "
                           f"{partial.parent}/{partial.stem.removesuffix('.partial')}.partial*.jsonl and the same command resumes")
    for i, (share_messages, stats) in results.items():
        for c, ms in zip(shares[i], share_messages):
            messages[c] = ms
        for k, v in stats.items():
            total[k] = total.get(k, 0) + v
    return [Conversation(id=c.id, messages=ms) for c, ms in zip(conversations, messages) if ms], total


def regenerate_share(settings: dict[str, str], renderer: ChatRenderer, cfg: dict[str, Any], max_length: int,
                     conversations: list[Conversation], indices: list[int], partial: Path, resume: list[Path],
                     threads: int) -> tuple[list[list[dict[str, Any]]], dict[str, int]]:
    """One process's share (``regenerate_in_processes``), in a process of its own: the target loaded as the first
    process loaded it, the same engine."""
    from models.target import TargetModel
    from train.config import RegenerateConfig

    torch.set_num_threads(threads)
    target = TargetModel.from_pretrained(**settings)
    regen = RegenerateConfig(**cfg)
    engine = reply_engine(regen, target, max_length)
    try:
        return regenerate_messages(conversations, engine, renderer, regen, max_length, False, partial, resume, indices)
    finally:
        getattr(engine, "close", lambda: None)()


def write_jsonl_atomic(conversations: list[Conversation], path: Path) -> None:
    with atomic_open(path) as f:
        for c in conversations:
            f.write(json.dumps({"id": c.id, "messages": c.messages}, ensure_ascii=False) + "\n")
