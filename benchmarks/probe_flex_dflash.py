"""DFlash's training attention at the small-target trainer's shapes, forward and backward timed apart, under
flex_attention kernel options: which configuration the trainer should ask for.

    python benchmarks/probe_flex_dflash.py [--batch 16 --ctx 2048 --anchors 256 --heads 8 --kv-heads 2 --head-dim 64]
    python benchmarks/probe_flex_dflash.py --variants bwd --masks packed --best-json best.json   # the backward's tiles

Rows are right-padded to random lengths in [ctx/2, ctx] with sorted random anchors below each length (the
trainer's batches), the mask is the trainer's (``flex_packed_block_mask``, or ``flex_block_mask`` with GQA for
the "unpacked" rows), bf16. Each variant's output and dq are checked against the first variant's. Prints ms per call
(CUDA events, median of --repeats) and the forward's TFLOP/s over the visible pairs (4 * D * pairs * Hq);
``--best-json`` writes the fastest packed variant's options beyond the forward's 64 x 64, in the form
``+trainer.flex_kernel_options`` takes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from swa_kernels.attention import attention  # noqa: E402
from models.dflash import LayerMaskSpec, dense_mask, flex_block_mask, flex_packed_block_mask  # noqa: E402
from benchmarks.measure import require_cuda  # noqa: E402
require_cuda(__doc__, __name__, flags=True)  # one line on a machine without a CUDA GPU

VARIANTS = {
    "default": None,
    "M64 N64": {"BLOCK_M": 64, "BLOCK_N": 64},
    "M128 N64": {"BLOCK_M": 128, "BLOCK_N": 64},
    "M64 N128": {"BLOCK_M": 64, "BLOCK_N": 128},
    "M128 N128 w8": {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8},
    "M128 N64 w4 s3": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
}

# The backward's tiles (BLOCK_M1/N1: the dK/dV pass, BLOCK_M2/N2: the dQ pass) with the forward at 64 x 64: flex's
# BLOCK_M/N set only the forward, and the backward's sm90 default at head_dim 64 is M1 64, N1 128, M2 128, N2 64,
# 3 stages, 8 warps. bwd_-prefixed warps and stages leave the forward's alone.
FWD = {"BLOCK_M": 64, "BLOCK_N": 64}
BWD_VARIANTS = {
    "bwd default": FWD,
    "64/64/64/64 w4s3": {**FWD, "BLOCK_M1": 64, "BLOCK_N1": 64, "BLOCK_M2": 64, "BLOCK_N2": 64, "bwd_num_warps": 4, "bwd_num_stages": 3},
    "32/64/64/32 w4s3": {**FWD, "BLOCK_M1": 32, "BLOCK_N1": 64, "BLOCK_M2": 64, "BLOCK_N2": 32, "bwd_num_warps": 4, "bwd_num_stages": 3},
    "64/128/128/64 w4s3": {**FWD, "BLOCK_M1": 64, "BLOCK_N1": 128, "BLOCK_M2": 128, "BLOCK_N2": 64, "bwd_num_warps": 4, "bwd_num_stages": 3},
    "32/128/128/32 w4s3": {**FWD, "BLOCK_M1": 32, "BLOCK_N1": 128, "BLOCK_M2": 128, "BLOCK_N2": 32, "bwd_num_warps": 4, "bwd_num_stages": 3},
    "64/64/64/64 w4s2": {**FWD, "BLOCK_M1": 64, "BLOCK_N1": 64, "BLOCK_M2": 64, "BLOCK_N2": 64, "bwd_num_warps": 4, "bwd_num_stages": 2},
    "64/128/128/64 w8s2": {**FWD, "BLOCK_M1": 64, "BLOCK_N1": 128, "BLOCK_M2": 128, "BLOCK_N2": 64, "bwd_num_warps": 8, "bwd_num_stages": 2},
    "128/128/128/128 w8s2": {**FWD, "BLOCK_M1": 128, "BLOCK_N1": 128, "BLOCK_M2": 128, "BLOCK_N2": 128, "bwd_num_warps": 8, "bwd_num_stages": 2},
    "32/64/64/32 w4s2": {**FWD, "BLOCK_M1": 32, "BLOCK_N1": 64, "BLOCK_M2": 64, "BLOCK_N2": 32, "bwd_num_warps": 4, "bwd_num_stages": 2},
    "64/64/64/64 w8s3": {**FWD, "BLOCK_M1": 64, "BLOCK_N1": 64, "BLOCK_M2": 64, "BLOCK_N2": 64, "bwd_num_warps": 8, "bwd_num_stages": 3},
}


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats + 2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[2:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--ctx", type=int, default=2048)
    parser.add_argument("--anchors", type=int, default=256)
    parser.add_argument("--block", type=int, default=16)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--window", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--variants", choices=["fwd", "bwd"], default="fwd",
                        help="fwd: the forward's tiles (VARIANTS); bwd: the backward's, forward at 64 x 64 (BWD_VARIANTS)")
    parser.add_argument("--masks", nargs="+", choices=["packed", "unpacked"], default=["packed", "unpacked"])
    parser.add_argument("--best-json", default=None, help="write the fastest variant's options (forward + backward) here")
    args = parser.parse_args()

    torch.manual_seed(0)
    device, b, n, blk = "cuda", args.batch, args.anchors, args.block
    lengths = torch.randint(args.ctx // 2, args.ctx + 1, (b,))
    anchors = torch.stack([torch.randperm(int(length) - 1)[:n].sort().values for length in lengths]).to(device)
    ctx_valid = (torch.arange(args.ctx)[None] < lengths[:, None]).to(device)
    spec = LayerMaskSpec(args.window, True)
    groups = args.heads // args.kv_heads
    shape_q = (b, args.heads, n * blk, args.head_dim)
    shape_kv = (b, args.kv_heads, args.ctx + n * blk, args.head_dim)
    q = torch.randn(shape_q, device=device, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(shape_kv, device=device, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(shape_kv, device=device, dtype=torch.bfloat16, requires_grad=True)
    dout = torch.randn(shape_q, device=device, dtype=torch.bfloat16)
    pairs = sum(int(dense_mask(anchors[i:i + 1], ctx_valid[i:i + 1], blk, spec).sum()) for i in range(b))
    fwd_flop = 4 * args.head_dim * pairs * args.heads
    packed = flex_packed_block_mask(anchors, ctx_valid, blk, spec, groups)
    plain = flex_block_mask(anchors, ctx_valid, blk, spec)
    print(f"{b} rows x {args.ctx} context, {n} anchors x {blk}, {args.heads}/{args.kv_heads} heads of {args.head_dim}: "
          f"{pairs / 1e6:.1f}M visible pairs per head")
    print(f"{'mask':8} {'kernel options':20} {'fwd ms':>8} {'fwd+bwd ms':>11} {'bwd ms':>8} {'fwd TFLOP/s':>12} {'max |diff|':>10} "
          f"{'max |dq diff|':>13}")
    reference = grad_reference = None
    best = None  # (fwd+bwd ms, options)
    masks = {"packed": packed, "unpacked": plain}
    for mask_name in args.masks:
        mask = masks[mask_name]
        for name, options in (VARIANTS if args.variants == "fwd" else BWD_VARIANTS).items():
            try:
                def forward():
                    return attention(q, k, v, mask, kernel_options=options)

                def both():
                    q.grad = k.grad = v.grad = None
                    forward().backward(dout)

                out = forward()
                both()
                dq = q.grad.detach().clone()
                with torch.no_grad():
                    fwd = timed(forward, args.repeats)
                total = timed(both, args.repeats)
            except Exception as error:  # a configuration the kernel rejects: say so, go on
                print(f"{mask_name:8} {name:20} failed: {type(error).__name__}: {str(error).splitlines()[0][:100]}")
                continue
            reference = out.detach() if reference is None else reference
            grad_reference = dq if grad_reference is None else grad_reference
            diff = float((out.detach().float() - reference.float()).abs().max())
            dq_diff = float((dq.float() - grad_reference.float()).abs().max())
            print(f"{mask_name:8} {name:20} {fwd:8.2f} {total:11.2f} {total - fwd:8.2f} {fwd_flop / fwd / 1e9:12.1f} {diff:10.3g} "
                  f"{dq_diff:13.3g}")
            if mask_name == "packed" and (best is None or total < best[0]):
                best = (total, options)
    if args.best_json and best is not None:
        import json

        Path(args.best_json).write_text(json.dumps({k: v for k, v in (best[1] or {}).items() if k not in FWD}) + "\n")
        print(f"fastest (packed): {best[1]} -> {args.best_json}")


if __name__ == "__main__":
    main()
