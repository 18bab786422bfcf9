"""Where the autoregressive loop's time goes at a real shape: kernels per token, their time, and the GPU's idle time.

Builds the random-init target as ``decode_speed.py`` does, decodes ``--tokens`` tokens with and without running a
step ahead of the host (``generate(run_ahead=...)``), timed by wall clock over the whole call, then profiles one
run-ahead generation under ``torch.profiler``: the top kernels by GPU time, the kernel count per token, and the gap
between the first kernel's start and the last one's end that no kernel covers (GPU idle).

    python benchmarks/profile_decode_loop.py --context 1024 --tokens 128
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
    args = p.parse_args()
    model, _, _ = build(args.shape)
    target = StaticTarget(model, [], compile_layers=True)
    ids = torch.randint(100, 100_000, (args.context,)).tolist()
    target.allocate(args.context + args.tokens + 16)
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
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() > 0),
                     key=lambda e: e.time_range.start)
    busy, end, idle = 0.0, None, 0.0
    for e in kernels:
        start, stop = e.time_range.start, e.time_range.end
        if end is not None and start > end:
            idle += start - end
        end = stop if end is None else max(end, stop)
        busy += e.time_range.elapsed_us()
    span = kernels[-1].time_range.end - kernels[0].time_range.start
    print(f"GPU events {len(kernels)} ({len(kernels) / args.tokens:.0f} per token); span {span / 1e3:.1f} ms, "
          f"idle {idle / 1e3:.2f} ms ({100 * idle / span:.1f}%), kernel time {busy / 1e3:.1f} ms")


if __name__ == "__main__":
    main()
