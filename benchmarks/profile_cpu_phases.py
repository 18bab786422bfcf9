"""Where a CPU run of the loop spends its time, by method: the target's steps and prefills, the drafter's block passes
(staged: ``first_drafts`` / ``rest_drafts``) and appends, each wrapped with a wall-clock timer, in one process.

    python benchmarks/profile_cpu_phases.py --target ../shared/targets/qwen3-27m-sharegpt --drafter EXPORT \
        --batch-size 4 --threads 1 --questions 8

MT-Bench's first ``--questions`` conversations, both turns, 128 new tokens a turn, greedy, through
``eval.runner.run_conversations`` in one process (``--batch-size 4 --threads 1`` is what each of a batch-8 run's two
one-thread workers does on a 2-core machine). Prints tokens/s, then per method: seconds, share of the wall time,
calls and milliseconds a call ("other": the rest of the loop).
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eval.runner import run_conversations  # noqa: E402
from infer.loading import eos_ids, load_models  # noqa: E402
from infer.prompts import mt_bench  # noqa: E402
from models.sampling import SamplingConfig  # noqa: E402

TARGET_METHODS = ("step", "prefill", "prefill_rows")
DRAFTER_METHODS = ("block_logits", "first_drafts", "rest_drafts", "append")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--drafter", required=True)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--questions", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    target, drafter, tokenizer = load_models(args.target, args.drafter, "cpu", batch_size=args.batch_size)
    seconds, calls = collections.defaultdict(float), collections.Counter()

    def timed(owner, name: str, label: str) -> None:
        method = getattr(owner, name)

        def wrapper(*a, **k):
            t = time.perf_counter()
            out = method(*a, **k)
            seconds[label] += time.perf_counter() - t
            calls[label] += 1
            return out
        setattr(owner, name, wrapper)

    for name in TARGET_METHODS:
        if hasattr(target, name):
            timed(target, name, f"target.{name}")
    for name in DRAFTER_METHODS:
        if hasattr(drafter, name):
            timed(drafter, name, f"drafter.{name}")
    t0 = time.perf_counter()
    records = run_conversations(target, drafter, tokenizer, mt_bench(args.questions), prefill_tokens=0, sampling=SamplingConfig(),
                                max_new_tokens=args.max_new_tokens, eos_token_ids=eos_ids(tokenizer, target.model), baseline=False,
                                batch_size=args.batch_size, desc="profile", workers=1)
    wall = time.perf_counter() - t0
    new = sum(r["stats"]["new_tokens"] for r in records)
    steps = [a for r in records for a in r["stats"]["accepted_per_step"]]
    print(f"batch {args.batch_size}, {args.threads} thread(s): {new} tokens in {wall:.1f} s, {new / wall:.1f} tokens/s, "
          f"{len(steps)} row-steps, τ {sum(a + 1 for a in steps) / len(steps):.3f}")
    print("| method | s | share | calls | ms a call |\n|---|---:|---:|---:|---:|")
    for label, s in sorted(seconds.items(), key=lambda kv: -kv[1]):
        print(f"| {label} | {s:.2f} | {100 * s / wall:.1f}% | {calls[label]} | {1e3 * s / calls[label]:.2f} |")
    print(f"| other | {wall - sum(seconds.values()):.2f} | {100 * (wall - sum(seconds.values())) / wall:.1f}% | | |")


if __name__ == "__main__":
    main()
