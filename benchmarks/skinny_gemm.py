"""Few-row products at a real shape: cuBLAS (``F.linear``) against ``swa_kernels/skinny_gemm.py`` over a grid of tilings,
each captured in a CUDA graph of 20 calls (no launch gaps in the figure), at 1 and 16 rows. Prints µs per product and
TB/s of weights read, the best tiling per shape, and writes them as JSON (``--out``). ``--int8``: the same kernel on
weight-only int8 copies (``swa_kernels/int8_weights.py``): its default tiling (``config_for``) and the best of the grid,
beside cuBLAS on the bf16 matrix (TB/s of the bytes each reads).

    python benchmarks/skinny_gemm.py --out skinny.json
    python benchmarks/skinny_gemm.py --copies 20 --shapes wo w2      # 20 distinct copies read in turn, as a forward's layers
    python benchmarks/skinny_gemm.py --int8 --rows 16 --out int8.json
    python benchmarks/skinny_gemm.py --rows 16 --copies 20 --same-sums --shapes wqkv w13 lm_head   # a verify's own tiling
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
from benchmarks.measure import captured_us, require_cuda  # noqa: E402
from swa_kernels import skinny_gemm  # noqa: E402
from swa_kernels.int8_weights import config_for, dequantized, int8_weight  # noqa: E402
require_cuda(__doc__, __name__, flags=True)  # one line on a machine without a CUDA GPU

# Qwen3-8B's target matrices (q|k|v and gate|up fused) and a DFlash drafter's (fc over 5 features, a 32K draft head)
SHAPES = {"wqkv": (6144, 4096), "wo": (4096, 4096), "w13": (24576, 4096), "w2": (4096, 12288), "lm_head": (151936, 4096),
          "dflash_fc": (4096, 20480), "draft_head_32k": (32000, 4096), "dflash_wkv": (10240, 4096)}
CALLS = 20


def configs(n: int, k: int, sms: int, w_bytes: int = 2, rows: int = skinny_gemm.MAX_ROWS, warps=(4, 8), stages=(3, 4, 6),
            block_ks=(128, 256), splits_of=(1, 2, 4, 8)):
    # at least ~3/4 of the SMs busy: a 4096-wide output in 32-wide tiles is 128 programs, one short of an H100's or
    # H200's 132, and runs without a second kernel adding K splits
    for block_n, block_k, num_warps, num_stages, splits in itertools.product((16, 32, 64, 128), block_ks, warps, stages, splits_of):
        programs = -(-n // block_n) * splits
        if k % (splits * block_k) or not 0.75 * sms <= programs <= 16 * sms or (splits > 1 and programs > 4 * sms):
            continue
        if num_stages * (block_n * w_bytes + rows * 2) * block_k > 220 * 1024:  # the tiles in flight must fit shared memory
            continue
        yield skinny_gemm.Config(block_n, block_k, splits, num_warps, num_stages)


def fastest(run, ref: torch.Tensor, candidates, atol: float, best: tuple | None = None) -> tuple[tuple, int]:
    """The fastest of ``candidates`` (tilings) for ``run(config)`` captured, each checked against ``ref`` first (rtol 2e-2,
    ``atol``); ``best`` (us, config) to beat. Returns (us, config) and how many were tried."""
    tried = 0
    for config in candidates:
        tried += 1
        try:
            got = run(config)
        except Exception as error:  # noqa: BLE001  (a tiling this GPU cannot run: say so, try the next)
            print(f"  skipped {config}: {type(error).__name__}", flush=True)
            continue
        torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=atol)
        us = captured_us(lambda: run(config), CALLS)
        if best is None or us < best[0]:
            best = (us, config)
    return best, tried


def int8_rows(name: str, n: int, k: int, rows: int, sms: int, search: bool = True, block_m: int | None = None) -> dict:
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    weight = int8_weight(w)
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    ref = F.linear(x, dequantized(weight, torch.bfloat16))
    gb8, gb16 = (weight.q.numel() + 4 * n) / 1e9, w.numel() * 2 / 1e9
    cublas = captured_us(lambda: F.linear(x, w), CALLS)
    default, default_block_m = config_for(rows, n, k)
    block_m = block_m or default_block_m
    run = lambda c: skinny_gemm._products(x, weight.q, c, weight.scale, block_m)  # noqa: E731
    torch.testing.assert_close(run(default).float(), ref.float(), rtol=2e-2, atol=2e-2 * ref.abs().max().item())
    default_us = captured_us(lambda: run(default), CALLS)
    best, tried = fastest(run, ref, configs(n, k, sms, w_bytes=1, rows=block_m) if search else [], 2e-2 * ref.abs().max().item(),
                          best=(default_us, default))
    row = {"matrix": name, "rows": rows, "block_m": block_m, "n": n, "k": k, "cublas_bf16_us": cublas, "cublas_TBps": gb16 / cublas * 1e3,
           "int8_default_us": default_us, "int8_default_TBps": gb8 / default_us * 1e3, "default_config": vars(default),
           "int8_best_us": best[0], "int8_best_TBps": gb8 / best[0] * 1e3, "best_config": vars(best[1]), "tried": tried}
    print(f"{name} | {rows} | {cublas:.1f} | {row['cublas_TBps']:.2f} | {default_us:.1f} | {row['int8_default_TBps']:.2f} | "
          f"{best[0]:.1f} | {row['int8_best_TBps']:.2f} | {best[1]} | {tried}", flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--int8", action="store_true", help="the kernel on int8 copies of the matrices (see the docstring)")
    p.add_argument("--default-only", action="store_true", help="--int8: time the default tiling only (no search)")
    p.add_argument("--block-m", type=int, help="--int8: rows per row block (default: config_for's)")
    p.add_argument("--warps", type=int, nargs="+", default=[4, 8], help="the grid's warp counts")
    p.add_argument("--stages", type=int, nargs="+", default=[3, 4, 6], help="the grid's pipeline depths")
    p.add_argument("--same-sums", action="store_true",
                   help="only tilings with the shape's TUNED block_k and splits (the order each output's sum is taken in: "
                        "a row's result the same whatever the tiling's block_n, warps and stages)")
    p.add_argument("--copies", type=int, default=1,
                   help="distinct copies of each matrix, the captured calls reading them in turn (a forward reads each layer's "
                        "once: with 1, a matrix that fits L2, 50 MB on an H100, is read from it after the first call)")
    p.add_argument("--out")
    args = p.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"# {torch.cuda.get_device_name()} | torch {torch.__version__} | {sms} SMs | {CALLS} calls per graph | "
          f"{args.copies} copies of each matrix")
    results = []
    if args.int8:
        print("matrix | rows | cuBLAS bf16 us | TB/s | int8 default us | TB/s | int8 best us | TB/s | its config | configs tried")
        for name in args.shapes:
            for rows in args.rows:
                results.append(int8_rows(name, *SHAPES[name], rows, sms, not args.default_only, args.block_m))
        if args.out:
            Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "int8": True, "results": results}, indent=2))
        return
    print("matrix | rows | cuBLAS us | TB/s | best skinny_gemm us | TB/s | its config | configs tried")
    for name in args.shapes:
        n, k = SHAPES[name]
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        gb = w.numel() * w.element_size() / 1e9
        copies = [w] + [w.clone() for _ in range(args.copies - 1)]  # the same values: one reference checks every copy
        for rows in args.rows:
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            ref = F.linear(x, w)
            turn = itertools.cycle(copies)
            cublas = captured_us(lambda: F.linear(x, next(turn)), CALLS)
            tuned = skinny_gemm.TUNED.get((n, k))
            same = {"block_ks": (tuned.block_k,), "splits_of": (tuned.splits,)} if args.same_sums and tuned else {}
            grid = configs(n, k, sms, warps=args.warps, stages=args.stages, **same)
            best, tried = fastest(lambda c: skinny_gemm.linear(x, next(turn), c), ref, grid, 2e-1)
            if tuned is not None:  # the shape's tiling now, beside the best of the grid
                row_tuned = captured_us(lambda: skinny_gemm.linear(x, next(turn), tuned), CALLS)
                print(f"{name} | {rows} | TUNED {tuned}: {row_tuned:.1f} us", flush=True)
            row = {"matrix": name, "rows": rows, "n": n, "k": k, "copies": args.copies, "cublas_us": cublas, "cublas_TBps": gb / cublas * 1e3,
                   "skinny_us": best[0], "skinny_TBps": gb / best[0] * 1e3, "config": vars(best[1]), "tried": tried}
            results.append(row)
            print(f"{name} | {rows} | {cublas:.1f} | {row['cublas_TBps']:.2f} | {best[0]:.1f} | {row['skinny_TBps']:.2f} | {best[1]} | {tried}",
                  flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "results": results}, indent=2))


if __name__ == "__main__":
    main()
