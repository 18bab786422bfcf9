"""The training cross-entropy's forward statistics (each row's log-sum-exp and argmax over bf16 logits): Inductor's
compiled ``torch.logsumexp`` + ``argmax`` (what the step ran before) against ``swa_kernels/row_stats.py``'s one-pass
kernel over a grid of chunk sizes and warps, at DFlash's small-target shape (65,536 block rows x 8,192) and a 152K head.
Prints ms per call (CUDA events, median) and TB/s of logits read once; ``*`` marks the kernel's default config.

    python benchmarks/row_stats_speed.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.measure import median_ms, require_cuda  # noqa: E402
from swa_kernels import row_stats  # noqa: E402
require_cuda(__doc__, __name__, flags=False)  # one line on a machine without a CUDA GPU

SHAPES = [(65536, 8192), (8192, 151936)]


def main() -> None:
    if not (torch.cuda.is_available() and row_stats.available):
        raise SystemExit("row_stats_speed: needs a CUDA device and Triton")
    import triton
    compiled = torch.compile(row_stats.reference_row_stats)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"| rows x vocab | implementation | ms | TB/s (bytes read once) |\n|---|---|---:|---:|")
    for n, v in SHAPES:
        x = torch.randn(n, v, device="cuda", dtype=torch.bfloat16) * 4
        gb = x.numel() * x.element_size() / 1e9
        ref_lse, ref_top = compiled(x)
        rows = [("Inductor: logsumexp + argmax", lambda: compiled(x))]
        default = row_stats.block_for(v)
        for block in (1024, 2048, 4096, 8192):
            for warps in (4, 8, 16):
                if block > triton.next_power_of_2(v):
                    continue
                lse, top = torch.ops.swa_drafters.row_logsumexp_argmax(x, block, warps)
                assert torch.equal(top, ref_top) and torch.allclose(lse, ref_lse, rtol=1e-5, atol=1e-5), (block, warps)
                mark = " *" if block == default and warps == row_stats.NUM_WARPS else ""
                rows.append((f"one pass, BLOCK {block}, {warps} warps{mark}",
                             lambda b=block, w=warps: torch.ops.swa_drafters.row_logsumexp_argmax(x, b, w)))
        for name, fn in rows:
            ms = median_ms(fn, warmup=5, repeats=20)
            print(f"| {n} x {v} | {name} | {ms:.3f} | {gb / ms:.2f} |")


if __name__ == "__main__":
    main()
