"""Where a CPU run of the loop spends its time, by method: the target's steps and prefills, the drafter's block passes
(staged: ``first_drafts`` / ``rest_drafts``) and appends, each wrapped with a wall-clock timer, in one process.

    python benchmarks/profile_cpu_phases.py --target ../shared/targets/qwen3-27m-sharegpt --drafter EXPORT \
        --batch-size 4 --threads 1 --questions 8

MT-Bench's first ``--questions`` conversations, both turns, 128 new tokens a turn, greedy, through
``eval.runner.run_conversations`` in one process (``--batch-size 4 --threads 1`` is what each of a batch-8 run's two
one-thread workers does on a 2-core machine). Prints tokens/s, then per method: seconds, share of the wall time,
calls and milliseconds a call ("other": the rest of the loop). Then, untimed, prompt lookup's τ on the same turns (as many
drafts a step as the drafter's block, eval's rule; ``--no-pld`` skips it).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.script import run_main  # noqa: E402

from benchmarks.profile_regen import Timed  # noqa: E402
from eval.runner import run_conversations  # noqa: E402
from infer.loading import eos_ids, load_models  # noqa: E402
from infer.prompt_lookup import PromptLookupDrafter  # noqa: E402
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
    p.add_argument("--pld", action=argparse.BooleanOptionalAction, default=True, help="prompt lookup's τ on the same turns, untimed")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    target, drafter, tokenizer = load_models(args.target, args.drafter, "cpu")
    timers, wrapped = {}, []  # label -> the method's timer (``profile_regen.Timed``; its device sync is a no-op on the CPU)
    for owner, prefix, names in ((target, "target", TARGET_METHODS), (drafter, "drafter", DRAFTER_METHODS)):
        for name in names:
            if hasattr(owner, name):
                timers[f"{prefix}.{name}"] = Timed(getattr(owner, name))
                setattr(owner, name, timers[f"{prefix}.{name}"])
                wrapped.append((owner, name, timers[f"{prefix}.{name}"]))

    def run(d, desc: str) -> list[dict]:
        return run_conversations(target, d, tokenizer, mt_bench(args.questions), prefill_tokens=0, sampling=SamplingConfig(),
                                 max_new_tokens=args.max_new_tokens, eos_token_ids=eos_ids(tokenizer, target.model), baseline=False,
                                 batch_size=args.batch_size, desc=desc, workers=1)

    def tau(records: list[dict]) -> tuple[float, int]:
        steps = [a for r in records for a in r["stats"]["accepted_per_step"]]
        return sum(a + 1 for a in steps) / max(len(steps), 1), len(steps)

    t0 = time.perf_counter()
    records = run(drafter, "profile")
    wall = time.perf_counter() - t0
    new = sum(r["stats"]["new_tokens"] for r in records)
    (drafter_tau, row_steps), pld_note = tau(records), "not run (--no-pld)"
    if args.pld and not isinstance(drafter, PromptLookupDrafter):  # after the timed run: the profile stays the drafter's alone
        for owner, name, timer in wrapped:
            setattr(owner, name, timer.fn)  # the method as it was: the profile stays the drafter's run alone
        pld = PromptLookupDrafter(num_draft_tokens=drafter.block_size - 1, vocab_size=target.lm_head.weight.shape[0])
        pld_note = f"{tau(run(pld, 'prompt lookup'))[0]:.3f}"
    print(f"batch {args.batch_size}, {args.threads} thread(s): {new} tokens in {wall:.1f} s, {new / wall:.1f} tokens/s, "
          f"{row_steps} row-steps, τ {drafter_tau:.3f} (prompt lookup on the same turns: {pld_note})")
    print("| method | s | share | calls | ms a call |\n|---|---:|---:|---:|---:|")
    used = sorted((t for t in timers.items() if t[1].calls), key=lambda t: -t[1].seconds)
    for label, t in used:
        print(f"| {label} | {t.seconds:.2f} | {100 * t.seconds / wall:.1f}% | {t.calls} | {1e3 * t.seconds / t.calls:.2f} |")
    other = wall - sum(t.seconds for _, t in used)
    print(f"| other | {other:.2f} | {100 * other / wall:.1f}% | | |")


if __name__ == "__main__":
    run_main(main)  # bad input (a flag, a missing or malformed file): one line, not a traceback
