"""What every benchmark script measures with: one timer and one counter of visible query-key pairs."""

from __future__ import annotations

import time

import torch


def median_ms(fn, warmup: int = 3, repeats: int = 10) -> float:
    """Median milliseconds of ``fn()`` over ``repeats`` calls after ``warmup`` untimed ones: CUDA
    events on the GPU, a synchronised host clock otherwise (CPU smoke runs)."""
    for _ in range(warmup):
        fn()
    on_gpu = torch.cuda.is_available() and torch.cuda.is_initialized()
    times = []
    for _ in range(repeats):
        if on_gpu:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            start_s = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start_s) * 1e3)
    return sorted(times)[len(times) // 2]


def count_pairs(visible, q_len: int, kv_len: int, device: torch.device | str = "cuda", chunk: int = 1024) -> int:
    """Visible (query, key) pairs of a mask rule ``visible(b, q_idx, kv_idx)`` for sequence 0, ``chunk`` query rows at a time."""
    total = 0
    kv = torch.arange(kv_len, device=device)[None]
    b = torch.zeros((), dtype=torch.long, device=device)
    for start in range(0, q_len, chunk):
        q = torch.arange(start, min(start + chunk, q_len), device=device)[:, None]
        total += int(visible(b, q, kv).sum())
    return total
