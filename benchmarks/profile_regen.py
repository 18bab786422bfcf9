"""Where regeneration's time goes (``data.regenerate.engine=ours``): the captured decode step alone at several batch
sizes and positions, then a real regeneration with each phase timed.

    python benchmarks/profile_regen.py --target TARGET --data prompts.jsonl --num 1000 --batch-size 256 --run-steps 8 --device cuda

Part 1 times the target's captured one-token step (CUDA events, median of 30) with every row at the same position.
Part 2 regenerates the first ``--num`` conversations (every assistant turn, greedy, ``--max-new-tokens``) with
``target.step`` and ``target.prefill_rows`` wrapped in timers that synchronise the device: the sums say how much of the
wall time is decode steps, prefill waves and everything else (rendering, tokenizing, the loop's host work). The
synchronising timers remove the overlap of host and device, so part 2's wall time is an upper bound of a plain run's.
``--no-timers`` leaves the methods unwrapped: the wall time of a plain run (what ``--run-ahead``, whose gain is that
overlap, is judged by), without the phases.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.measure import Timed  # noqa: E402
from infer.loading import decoding_target  # noqa: E402
from models.target import TargetModel  # noqa: E402
from models.builtin_targets import resolve_target_path  # noqa: E402
from train.config import RegenerateConfig  # noqa: E402
from train.data.chat import ChatRenderer  # noqa: E402
from train.data.dataset import resolve_source  # noqa: E402
from train.data.readers import read_conversations  # noqa: E402
from train.data.regenerate import OurReplies, regenerate_conversations  # noqa: E402


def time_steps(target, batch: int, capacity: int, positions: list[int], repeats: int = 30) -> list[tuple[int, float]]:
    target.allocate(capacity, batch=batch)
    ids = torch.zeros(batch, 1, dtype=torch.long, device=target.device)
    out = []
    for p in positions:
        pos = torch.full((batch,), p, dtype=torch.long, device=target.device)
        for _ in range(3):
            target.step(ids, pos)
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            target.step(ids, pos)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        out.append((p, statistics.median(times)))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--num", type=int, default=1000)
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--max-length", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--run-steps", type=int, default=8)
    p.add_argument("--reuse-turns", choices=["on", "off"], default="on",
                   help="data.regenerate.reuse_turns: each conversation's turns in one row (on) or turn by turn (off)")
    p.add_argument("--run-ahead", action="store_true",
                   help="data.regenerate.run_ahead: the next run queued before the host books the last (timers: see above)")
    p.add_argument("--step-batches", type=int, nargs="*", default=[128, 256, 512])
    p.add_argument("--step-positions", type=int, nargs="*", default=[256, 1024, 2048])
    p.add_argument("--device", default="cuda")
    p.add_argument("--no-timers", action="store_true", help="no synchronising timers: a plain run's wall time, no phases")
    args = p.parse_args()

    target = TargetModel.from_pretrained(resolve_target_path(args.target, "--target"), device=args.device)
    static = decoding_target(target.model, [])
    capacity = args.max_length + args.max_new_tokens + 1 + args.run_steps
    if static.capture and args.step_batches:
        print("| rows | position | captured step ms | ms per row |\n|---:|---:|---:|---:|")
    for b in args.step_batches if static.capture else []:
        for pos, ms in time_steps(static, b, capacity, args.step_positions):
            print(f"| {b} | {pos} | {ms:.3f} | {ms / b * 1000:.2f} µs |")

    cfg = RegenerateConfig(enabled=True, engine="ours", max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                           run_steps=args.run_steps, reuse_turns=args.reuse_turns == "on", run_ahead=args.run_ahead)
    engine = OurReplies(target.model, target.tokenizer, cfg)
    step, prefill = Timed(engine.target.step), Timed(engine.target.prefill_rows)
    if not args.no_timers:
        engine.target.step, engine.target.prefill_rows = step, prefill
    conversations, _ = read_conversations(resolve_source(args.data), max_records=args.num)
    start = time.perf_counter()
    out, stats = regenerate_conversations(conversations, engine, ChatRenderer(target.tokenizer), cfg, args.max_length, progress=False)
    wall = time.perf_counter() - start
    replies = [m["content"] for c in out for m in c.messages if m["role"] == "assistant"]
    new_tokens = sum(len(target.tokenizer(r, add_special_tokens=False)["input_ids"]) for r in replies)
    print(f"\n{stats['turns_regenerated']} turns, ~{new_tokens} reply tokens (re-tokenized), {wall:.1f} s wall "
          f"({stats['turns_regenerated'] / wall:.1f} turns/s, ~{new_tokens / wall:.0f} tokens/s), {args.batch_size} rows, "
          f"{args.run_steps} steps per sync, turns {'reused in their rows' if args.reuse_turns == 'on' else 'one by one'}"
          f"{', runs queued ahead' if args.run_ahead else ''}")
    if args.no_timers:
        return
    print("| phase | calls | seconds | share of wall | per call ms |\n|---|---:|---:|---:|---:|")
    for name, t in (("decode steps (target.step)", step), ("prefill waves (target.prefill_rows)", prefill)):
        print(f"| {name} | {t.calls} | {t.seconds:.1f} | {t.seconds / wall:.0%} | {t.seconds / max(t.calls, 1) * 1000:.2f} |")
    rest = wall - step.seconds - prefill.seconds
    print(f"| everything else (host: loop, rendering, tokenizing) | - | {rest:.1f} | {rest / wall:.0%} | - |")
    print(f"reply tokens per decode step and row: {new_tokens / max(step.calls, 1) / args.batch_size:.2f} (1 = every row busy)")


if __name__ == "__main__":
    main()
