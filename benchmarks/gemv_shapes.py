"""One-token linears at a real shape (default Qwen3-8B's): microseconds and TB/s per BLAS path, to pick where
cuBLAS's heuristics leave bandwidth unused. ``python benchmarks/gemv_shapes.py``"""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.decode_speed import cuda_ms  # noqa: E402
from benchmarks.measure import require_cuda  # noqa: E402
require_cuda(__doc__, __name__, flags=False)  # one line on a machine without a CUDA GPU

SHAPES = {"wqkv": (6144, 4096), "wo": (4096, 4096), "w13": (24576, 4096), "w2": (4096, 12288), "lm_head": (151936, 4096)}


def main() -> None:
    print(f"# {torch.cuda.get_device_name()} | torch {torch.__version__}")
    print("matrix | rows | path | us | TB/s")
    for name, (out, inp) in SHAPES.items():
        w = torch.randn(out, inp, device="cuda", dtype=torch.bfloat16)
        for rows in (1, 4, 16):
            x = torch.randn(rows, inp, device="cuda", dtype=torch.bfloat16)
            paths = {"F.linear (cublasLt)": lambda: F.linear(x, w), "x @ w.T": lambda: x @ w.t()}
            if rows == 1:
                paths["torch.mv"] = lambda: torch.mv(w, x[0])
            for path, fn in paths.items():
                for lib in ("cublaslt", "cublas"):
                    torch.backends.cuda.preferred_blas_library(lib)
                    us = 1e3 * cuda_ms(lambda: [fn() for _ in range(10)], repeats=10) / 10
                    print(f"{name} | {rows} | {path} [{lib}] | {us:.1f} | {w.numel() * 2 / us / 1e6:.2f}", flush=True)
        torch.backends.cuda.preferred_blas_library("cublaslt")


if __name__ == "__main__":
    main()
