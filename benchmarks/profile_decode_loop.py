"""Where the autoregressive loop's time goes at a real shape: kernels per token, their time, and the GPU's idle time.

Builds the random-init target as ``decode_speed.py`` does, decodes ``--tokens`` tokens with and without running a
step ahead of the host (``generate(run_ahead=...)``), timed by wall clock over the whole call, then profiles one
run-ahead generation under ``torch.profiler``: the top kernels by GPU time, the kernel count per token, and the gap
between the first kernel's start and the last one's end that no kernel covers (GPU idle).

    python benchmarks/profile_decode_loop.py --context 1024 --tokens 128
    python benchmarks/profile_decode_loop.py --drafter dflash --tau 3     # a speculative loop forced to accept τ-1
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.decode_speed import build  # noqa: E402
from infer.generate import generate  # noqa: E402
from models.static_target import StaticTarget  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="qwen3-8b")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--drafter", choices=["none", "dflash", "eagle3"], default="none")
    p.add_argument("--tau", type=int, default=3, help="with a drafter: every step accepts τ-1 drafts")
    args = p.parse_args()
    model, dflash_model, eagle3_model = build(args.shape)
    target = StaticTarget(model, [], compile_layers=True)
    ids = torch.randint(100, 100_000, (args.context,)).tolist()
    target.allocate(args.context + args.tokens + 16)
    if args.drafter != "none":
        from models.dflash import StaticDFlashDrafter
        from models.eagle3 import StaticEagle3Drafter

        drafter = (StaticDFlashDrafter(dflash_model, target.embed_tokens, target.lm_head) if args.drafter == "dflash"
                   else StaticEagle3Drafter(eagle3_model, steps=args.tau))
        target.set_feature_layers(drafter.target_layer_ids)
        run = lambda: generate(target, drafter, ids, args.tokens, accept_per_step=args.tau - 1)  # noqa: E731
        run()
        run = run()
        s = run.stats
        print(f"{args.drafter} τ {s.tau:.2f}: {s.tokens_per_s:.1f} tok/s, {1e3 * s.decode_s / s.steps:.2f} ms/step: draft "
              f"{1e3 * s.draft_s / s.steps:.2f}, verify {1e3 * s.verify_s / s.steps:.2f}, other {1e3 * s.other_s / s.steps:.2f}")
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            generate(target, drafter, ids, args.tokens, accept_per_step=args.tau - 1)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=70))
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=70))
        report_idle(prof, s.steps, "step")
        return
    generate(target, None, ids, args.tokens)  # compile and capture
    for ahead in (False, True, False, True):
        torch.cuda.synchronize()
        t = time.perf_counter()
        run = generate(target, None, ids, args.tokens, run_ahead=ahead)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t - run.stats.prefill_s
        print(f"run_ahead={ahead}: {args.tokens / wall:.1f} tok/s by wall clock (prefill excluded), "
              f"{run.stats.tokens_per_s:.1f} by the loop's events, outside forward {100 * run.stats.other_s / run.stats.decode_s:.1f}%")
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        generate(target, None, ids, args.tokens, run_ahead=True)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70))
    report_idle(prof, args.tokens, "token")


def report_idle(prof, units: int, unit: str) -> None:
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() > 0),
                     key=lambda e: e.time_range.start)
    busy, end, idle, gaps, previous = 0.0, None, 0.0, [], None
    for e in kernels:
        start, stop = e.time_range.start, e.time_range.end
        if end is not None and start > end:
            idle += start - end
            gaps.append((start - end, previous.name[:60], e.name[:60]))
        end = stop if end is None else max(end, stop)
        busy += e.time_range.elapsed_us()
        previous = e
    gaps.sort(reverse=True)
    by_pair: dict = {}
    for gap, before, after in gaps:
        total, count = by_pair.get((before, after), (0.0, 0))
        by_pair[(before, after)] = (total + gap, count + 1)
    print("largest GPU idle gaps, summed by the kernels around them (us total, count, before -> after):")
    for (before, after), (total, count) in sorted(by_pair.items(), key=lambda kv: -kv[1][0])[:12]:
        print(f"  {total:9.0f} {count:5d}  {before} -> {after}")
    span = kernels[-1].time_range.end - kernels[0].time_range.start
    print(f"GPU events {len(kernels)} ({len(kernels) / units:.0f} per {unit}); span {span / 1e3:.1f} ms, "
          f"idle {idle / 1e3:.2f} ms ({100 * idle / span:.1f}%), kernel time {busy / 1e3:.1f} ms")


if __name__ == "__main__":
    main()
