"""What every benchmark script measures with: one timer and one counter of visible query-key pairs."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch


def median_ms(fn, warmup: int = 3, repeats: int = 10, queued: bool = False) -> float:
    """Median milliseconds of ``fn()`` over ``repeats`` calls after ``warmup`` untimed ones: CUDA
    events on the GPU, a synchronised host clock otherwise (CPU smoke runs).

    ``queued`` (GPU): the GPU is first held busy (``torch.cuda._sleep``, ~20 ms) so that the host
    has queued all of ``fn``'s kernels before the start event runs: the time is the GPU's alone, as
    in a training step where the host runs ahead of the device. Without it, the host's launch time
    before and between the kernels counts too (a stricter number for short calls). Should the host
    take longer than the sleep, the queued time degrades to the synchronised one, never below it."""
    for _ in range(warmup):
        fn()
    on_gpu = torch.cuda.is_available() and torch.cuda.is_initialized()
    times = []
    for _ in range(repeats):
        if on_gpu:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if queued:
                torch.cuda._sleep(_SLEEP_CYCLES)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            start_s = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start_s) * 1e3)
    return statistics.median(times)  # the middle two averaged for an even count (the upper one before)


def sync() -> None:
    """Wait for the GPU's queued work (nothing on a machine without one)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class Timed:
    """A function (a model's method) wrapped in a device-synchronising timer: its calls and their seconds add up. The
    syncs remove any overlap of host and device around the calls (an upper bound of a plain run's time)."""

    def __init__(self, fn):
        self.fn, self.calls, self.seconds = fn, 0, 0.0

    def __call__(self, *args, **kwargs):
        sync()
        t0 = time.perf_counter()
        out = self.fn(*args, **kwargs)
        sync()
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return out


_SLEEP_CYCLES = 40_000_000  # ~20 ms at the H100's ~1.98 GHz


def captured_us(fn, calls: int = 20) -> float:
    """Microseconds per call of ``fn()`` with ``calls`` calls captured in one CUDA graph (no launch gaps between them),
    the graph's median replay (``median_ms``) divided by ``calls``; one call first, outside the capture (compile)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return 1e3 * median_ms(graph.replay) / calls


def count_pairs(visible, q_len: int, kv_len: int, device: torch.device | str = "cuda", chunk: int = 1024) -> int:
    """Visible (query, key) pairs of a mask rule ``visible(b, q_idx, kv_idx)`` for sequence 0, ``chunk`` query rows at a time."""
    total = 0
    kv = torch.arange(kv_len, device=device)[None]
    b = torch.zeros((), dtype=torch.long, device=device)
    for start in range(0, q_len, chunk):
        q = torch.arange(start, min(start + chunk, q_len), device=device)[:, None]
        total += int(visible(b, q, kv).sum())
    return total


def require_cuda(doc: str | None, name: str, flags: bool) -> None:
    """A GPU-only benchmark script run as a script (``name`` its ``__name__``) on a machine without a CUDA GPU: one line
    and exit 2 (was a CUDA assertion traceback, some even for ``--help``). ``flags``: the script parses its arguments
    (argparse answers ``--help``); a script without flags prints its docstring for ``--help``. Imported: no effect."""
    if name != "__main__":
        return
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        if flags:
            return
        print((doc or "").strip())
        sys.exit(0)
    if not torch.cuda.is_available():
        print(f"error: {Path(sys.argv[0]).name} times GPU kernels; this machine has no CUDA GPU", file=sys.stderr)
        sys.exit(2)
