"""Few-row products at a real shape: cuBLAS (``F.linear``) against ``kernels/skinny_gemm.py`` over a grid of tilings,
each captured in a CUDA graph of 20 calls (no launch gaps in the figure), at 1 and 16 rows. Prints µs per product and
TB/s of weights read, the best tiling per shape, and writes them as JSON (``--out``).

    python benchmarks/skinny_gemm.py --out skinny.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.measure import captured_us  # noqa: E402
from kernels import skinny_gemm  # noqa: E402

# Qwen3-8B's target matrices (q|k|v and gate|up fused) and a DFlash drafter's (fc over 5 features, a 32K draft head)
SHAPES = {"wqkv": (6144, 4096), "wo": (4096, 4096), "w13": (24576, 4096), "w2": (4096, 12288), "lm_head": (151936, 4096),
          "dflash_fc": (4096, 20480), "draft_head_32k": (32000, 4096)}
CALLS = 20


def configs(n: int, k: int, sms: int):
    for block_n, block_k, warps, stages, splits in itertools.product((32, 64, 128), (128, 256), (4, 8), (3, 4, 6), (1, 2, 4, 8)):
        programs = -(-n // block_n) * splits
        if k % (splits * block_k) or not sms <= programs <= 16 * sms or (splits > 1 and programs > 4 * sms):
            continue
        if stages * (block_n + skinny_gemm.MAX_ROWS) * block_k * 2 > 220 * 1024:  # the tiles in flight must fit shared memory
            continue
        yield skinny_gemm.Config(block_n, block_k, splits, warps, stages)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--out")
    args = p.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"# {torch.cuda.get_device_name()} | torch {torch.__version__} | {sms} SMs | {CALLS} calls per graph")
    print("matrix | rows | cuBLAS us | TB/s | best skinny_gemm us | TB/s | its config | configs tried")
    results = []
    for name in args.shapes:
        n, k = SHAPES[name]
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        gb = w.numel() * w.element_size() / 1e9
        for rows in args.rows:
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            ref = F.linear(x, w)
            cublas = captured_us(lambda: F.linear(x, w), CALLS)
            best, tried = None, 0
            for config in configs(n, k, sms):
                tried += 1
                try:
                    got = skinny_gemm.linear(x, w, config)
                except Exception as error:  # noqa: BLE001  (a tiling this GPU cannot run: say so, try the next)
                    print(f"  skipped {config}: {type(error).__name__}", flush=True)
                    continue
                torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=2e-1)
                us = captured_us(lambda: skinny_gemm.linear(x, w, config), CALLS)
                if best is None or us < best[0]:
                    best = (us, config)
            row = {"matrix": name, "rows": rows, "n": n, "k": k, "cublas_us": cublas, "cublas_TBps": gb / cublas * 1e3,
                   "skinny_us": best[0], "skinny_TBps": gb / best[0] * 1e3, "config": vars(best[1]), "tried": tried}
            results.append(row)
            print(f"{name} | {rows} | {cublas:.1f} | {row['cublas_TBps']:.2f} | {best[0]:.1f} | {row['skinny_TBps']:.2f} | {best[1]} | {tried}",
                  flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "results": results}, indent=2))


if __name__ == "__main__":
    main()
