"""Regeneration throughput per engine (``data.regenerate.engine``): turns/s on the same conversations, and
whether each engine's greedy replies equal HF ``generate``'s.

    python benchmarks/regen_engines.py --target ../shared/targets/qwen3-27m-sharegpt --num 32 --max-new-tokens 64 \
        --engines hf ours vllm [--server-url http://localhost:8000] [--concurrency 16]
    # ours alone, rows in flight x decode steps per host sync (1 = a sync after every step, the loop before run_steps)
    python benchmarks/regen_engines.py --target TARGET --data prompts.jsonl --num 300 --max-new-tokens 512 \
        --engines ours --batch-size 128 256 --run-steps 1 8 16 --device cuda
    # ours, each conversation's turns in one row (its later prompts prefilled past what the row holds) or turn by turn
    python benchmarks/regen_engines.py ... --engines ours --reuse-turns on off

Every engine regenerates the first ``--num`` multi-turn conversations of the bundled ShareGPT sample (all
assistant turns, in order), greedy; vLLM needs ``SWA_VLLM_PYTHON``. Time counts from the engine's first
request to its last reply (vLLM's start-up is printed apart). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.target import TargetModel  # noqa: E402
from models.builtin_targets import resolve_target_path  # noqa: E402
from train.config import RegenerateConfig  # noqa: E402
from train.data.chat import ChatRenderer  # noqa: E402
from train.data.dataset import resolve_source  # noqa: E402
from train.data.readers import read_conversations  # noqa: E402
from train.data.regenerate import regenerate_conversations, reply_engine  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--data", default="builtin:sharegpt-sample")
    p.add_argument("--num", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--max-length", type=int, default=2048)
    p.add_argument("--engines", nargs="+", default=["hf", "ours", "vllm"])
    p.add_argument("--batch-size", type=int, nargs="+", default=[16], help="hf: prompts per call; ours: rows in flight (each a row)")
    p.add_argument("--run-steps", type=int, nargs="+", default=[8], help="ours: decode steps between host syncs (each a row)")
    p.add_argument("--reuse-turns", nargs="+", choices=["on", "off"], default=["on"],
                   help="ours: data.regenerate.reuse_turns (each a row)")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--server-url")
    p.add_argument("--device", default="cpu")
    args = p.parse_args()

    target = TargetModel.from_pretrained(resolve_target_path(args.target, "--target"), device=args.device)
    renderer = ChatRenderer(target.tokenizer)
    conversations, _ = read_conversations(resolve_source(args.data), max_records=args.num)
    rows, reference = [], None
    runs = [(name, b, k, reuse) for name in args.engines for b in args.batch_size
            for k in (args.run_steps if name == "ours" else [None]) for reuse in (args.reuse_turns if name == "ours" else [None])]
    for name, batch_size, run_steps, reuse in runs:
        cfg = RegenerateConfig(enabled=True, engine=name, max_new_tokens=args.max_new_tokens, batch_size=batch_size,
                               run_steps=run_steps or RegenerateConfig.run_steps, concurrency=args.concurrency,
                               server_url=args.server_url,  # the trainer's own settings (a namespace missed keep_replies)
                               reuse_turns=reuse != "off")
        start = time.perf_counter()
        engine = reply_engine(cfg, target, args.max_length)
        startup = time.perf_counter() - start
        start = time.perf_counter()
        out, stats = regenerate_conversations(conversations, engine, renderer, cfg, args.max_length, progress=False)
        seconds = time.perf_counter() - start
        getattr(engine, "close", lambda: None)()
        replies = [m["content"] for c in out for m in c.messages if m["role"] == "assistant"]
        reference = reference if reference is not None else replies
        same = sum(a == b for a, b in zip(replies, reference))
        label = name if run_steps is None else f"{name}, {run_steps} steps per sync" + (", turns reused" if reuse == "on" else ", turn by turn" if reuse else "")
        rows.append((label, batch_size, stats["turns_regenerated"], seconds, stats["turns_regenerated"] / seconds, startup, same,
                     len(reference)))
    print("| engine | batch | turns | seconds | turns/s | start-up s | replies equal to the first row's |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, batch_size, turns, seconds, rate, startup, same, n in rows:
        print(f"| {name} | {batch_size} | {turns} | {seconds:.1f} | {rate:.2f} | {startup:.1f} | {same}/{n} |")


if __name__ == "__main__":
    main()
