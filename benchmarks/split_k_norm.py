"""A few-row product whose K splits are added by the kernel after it: o_proj and down_proj at Qwen3-8B's widths, each
followed by what follows it in a decoder layer (the residual add and the next RMSNorm), compiled as the static target
compiles its layers and captured in a CUDA graph of 20 calls over 20 distinct copies of the matrix (a forward reads
each layer's once, never from L2).

Three ways, at 1 and 16 rows:
- ``cublas``: ``F.linear`` (cuBLAS; split-K with its own reduction kernel where it chooses) then the fused add + norm;
- ``skinny``: ``swa_kernels/skinny_gemm.py`` with its splits added by ``_sum_splits`` (a second kernel);
- ``fused``: the same kernel's fp32 partials added inside the add + norm kernel (``skinny_gemm.split_partials``:
  inductor unrolls the sum over at most 8 splits into the kernel that reads it).

    python benchmarks/split_k_norm.py --out split_k_norm.json
    python benchmarks/split_k_norm.py --shapes w2 --tiling 64,128,4 --tiling 32,256,2     # these tilings at 1 and 16 rows
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
from models.static_target import rms_norm  # noqa: E402
from swa_kernels import skinny_gemm  # noqa: E402
require_cuda(__doc__, __name__, flags=True)  # one line on a machine without a CUDA GPU

SHAPES = {"wo": (4096, 4096), "w2": (4096, 12288)}
CALLS = 20
EPS = 1e-6


def tilings(n: int, k: int, sms: int, only: list[tuple[int, int, int]] | None = None):
    # at least one program an SM, at most eight; four tiles in flight where shared memory holds them, else three
    for block_n, block_k, splits in only or itertools.product((32, 64, 128), (128, 256), (1, 2, 4, 8)):
        programs = -(-n // block_n) * splits
        if k % (splits * block_k) or not sms <= programs <= 8 * sms:
            continue
        num_stages = 4 if 4 * (block_n + 16) * 2 * block_k <= 220 * 1024 else 3
        yield skinny_gemm.Config(block_n, block_k, splits, 4, num_stages)


def kernels_per_call(fn) -> int:
    """GPU kernels one call of ``fn`` launches (torch.profiler)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and "Memcpy" not in e.name)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--tiling", action="append", metavar="BN,BK,SPLITS", help="time only these tilings (repeatable); "
                   "default: a grid")
    p.add_argument("--out")
    args = p.parse_args()
    torch._dynamo.config.cache_size_limit = 1024
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"# {torch.cuda.get_device_name()} | torch {torch.__version__} | {sms} SMs | {CALLS} calls per graph over "
          f"{CALLS} copies")
    print("matrix | rows | way | us (product + add + norm) | TB/s of the matrix | kernels a call | tiling")
    results = []
    for name in args.shapes:
        n, k = SHAPES[name]
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
        copies = [w] + [w.clone() for _ in range(CALLS - 1)]
        gb = w.numel() * 2 / 1e9
        norm_w = torch.rand(n, device="cuda", dtype=torch.bfloat16) + 0.5
        for rows in args.rows:
            x = torch.randn(1, rows, k, device="cuda", dtype=torch.bfloat16)
            resid = torch.randn(1, rows, n, device="cuda", dtype=torch.bfloat16)

            def way(product):
                @torch.compile(dynamic=False)
                def f(x, resid, w, norm_w):
                    h = resid + product(x, w)
                    return h, rms_norm(h, norm_w, EPS)
                return f

            ref = way(F.linear)(x, resid, w, norm_w)

            def timed(label, fn, tiling=None):
                got = fn(x, resid, w, norm_w)
                for a, b in zip(got, ref):
                    torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=5e-2)
                turn = itertools.cycle(copies)
                us = captured_us(lambda: fn(x, resid, next(turn), norm_w), CALLS)
                row = {"matrix": name, "rows": rows, "way": label, "us": us, "TBps": gb / us * 1e3,
                       "kernels": kernels_per_call(lambda: fn(x, resid, w, norm_w)),
                       "tiling": None if tiling is None else vars(tiling)}
                return row

            best, timed_rows = {"cublas": timed("cublas", way(F.linear))}, []
            only = [tuple(int(v) for v in t.split(",")) for t in args.tiling] if args.tiling else None
            for tiling in tilings(n, k, sms, only):
                for label, product in (("skinny", lambda x, w, c=tiling: skinny_gemm.linear(x, w, c)),
                                       ("fused", lambda x, w, c=tiling: skinny_gemm.split_partials(x, w, c))):
                    try:
                        row = timed(label, way(product), tiling)
                    except Exception as error:  # noqa: BLE001  (a tiling this GPU cannot run: say so, go on)
                        print(f"  skipped {label} {tiling}: {type(error).__name__}: {str(error)[:120]}", flush=True)
                        continue
                    timed_rows.append(row)
                    if label not in best or row["us"] < best[label]["us"]:
                        best[label] = row
            if only:  # every tiling asked for, not the best alone
                best = {"cublas": best["cublas"]}
                best.update({f"{r['way']} {r['tiling']['block_n']},{r['tiling']['block_k']},{r['tiling']['splits']}": r
                             for r in timed_rows})
            for row in best.values():
                results.append(row)
                print(f"{name} | {rows} | {row['way']} | {row['us']:.2f} | {row['TBps']:.2f} | {row['kernels']} | "
                      f"{row['tiling']}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "results": results}, indent=2))


if __name__ == "__main__":
    main()
