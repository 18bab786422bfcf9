"""Is regenerated ("on-policy") data what the decoding loop produces? One candidate cause of a
training/serving τ gap, measured (BENCHMARKS.md "τ you can trust").

For the first N ShareGPT conversations' first turns: the reply ``data.regenerate`` writes (HF
``generate``, batched, left-padded; decoded to text and re-tokenized by the chat template) against
the loop's batch-1 greedy decode (``infer.generate`` with no drafter) of the same prompt.

    python benchmarks/regen_vs_loop.py --target ../shared/targets/qwen3-27m-sharegpt --num 32 --max-new-tokens 128 [--device cuda]

Prints how many replies are token-identical, the mean common prefix, and how many survive the
text round trip (decode -> chat template -> tokenize) unchanged.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from infer.generate import generate  # noqa: E402
from models.target import CachedTarget  # noqa: E402
from models.builtin_targets import resolve_target_path  # noqa: E402
from train.config import RegenerateConfig  # noqa: E402
from train.data.chat import ChatRenderer  # noqa: E402
from train.data.readers import Conversation, read_conversations  # noqa: E402
from train.data.regenerate import regenerate_conversations  # noqa: E402
from models.target import TargetModel  # noqa: E402


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--data", default="builtin:sharegpt-sample")
    p.add_argument("--num", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    from train.data.dataset import resolve_source

    target = TargetModel.from_pretrained(resolve_target_path(args.target, "--target"), device=args.device)
    renderer = ChatRenderer(target.tokenizer)
    conversations, _ = read_conversations(resolve_source(args.data), max_records=args.num)
    first_turns = []
    for c in conversations:
        i = next(i for i, m in enumerate(c.messages) if m["role"] == "assistant")
        first_turns.append(Conversation(id=c.id, messages=[dict(m) for m in c.messages[: i + 1]]))
    cfg = RegenerateConfig(enabled=True, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size)  # the trainer's own settings
    regenerated, _ = regenerate_conversations(first_turns, target.model, renderer, cfg, max_length=1 << 20, progress=False)
    cached = CachedTarget(target.model, [])
    tok = target.tokenizer
    same = roundtrip_same = 0
    prefixes = []
    for conv in regenerated:
        prompt_msgs = conv.messages[:-1]
        prompt = tok(renderer.render(prompt_msgs, add_generation_prompt=True), add_special_tokens=False)["input_ids"]
        loop = generate(cached, None, prompt, args.max_new_tokens, eos_token_ids=[tok.eos_token_id]).tokens
        loop = loop[:-1] if loop and loop[-1] == tok.eos_token_id else loop
        full = tok(renderer.render(conv.messages), add_special_tokens=False)["input_ids"]  # the training row's tokens
        reply = full[len(prompt):len(prompt) + len(loop)]
        same += reply == loop
        prefixes.append(common_prefix(reply, loop) / max(len(loop), 1))
        roundtrip_same += tok(tok.decode(loop), add_special_tokens=False)["input_ids"] == loop
    n = len(regenerated)
    print("| replies | token-identical to the loop | mean common prefix | text round trip unchanged | device | dtype |")
    print("|---:|---:|---:|---:|---|---|")
    print(f"| {n} | {same}/{n} | {100 * sum(prefixes) / n:.1f}% | {roundtrip_same}/{n} | {args.device} | {target.model.dtype} |")


if __name__ == "__main__":
    main()
