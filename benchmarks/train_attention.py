"""Training attention alone, forward + backward: the masks the trainers build, against baselines.

    python benchmarks/train_attention.py --seq 2048 8192 32768 --window 2048 [--heads 32 --kv-heads 8 --head-dim 128]

Rows (bf16, one sequence, GQA as given):
  sdpa causal (full)            SDPA's own causal kernel, no mask: the dense-work reference
  sdpa dense window mask        SDPA with a boolean [T, T] sliding-window mask (skipped past --dense-max)
  flex window                   flex_attention, a plain sliding-window BlockMask (the issue's baseline)
  flex eagle3 ttt step j        train/eagle3.py at TTT step j: T queries over (j+1)*T keys, one mask
  ... context + diagonal (LSE)  a candidate, defined here: flex over the T step-0 keys returning its
                                log-sum-exp, the j diagonal keys as elementwise dot products, merged
                                (measured slower in eager PyTorch; the trainer keeps the single mask)
  flex dflash blocks            models/dflash.py: T context keys + N blocks of B queries (one sliding layer),
                                the dflash_swa recipe's 512 anchors, spread evenly or drawn at random
  flex dflash packed            the same mask with the queries packed by KV group (flex_packed_block_mask):
                                the trainer's DFlash attention on the GPU
  flex (FLASH) ...              the same block masks run by FlashAttention-4's kernels (flex's
                                kernel_options BACKEND=FLASH; needs flash-attn-4)
  fa4 key intervals dflash      swa_kernels/key_intervals.py: FlashAttention-4's SM90 kernels with each query's
                                two key intervals (context window, own block) instead of a mask function
  cudnn (chunked) window        swa_kernels/window_attention.py: the band cut into cuDNN causal pieces
                                (--with-chunked)
  cudnn (band) window           swa_kernels/window_attention.py: cuDNN's native band, one call
                                (needs nvidia-cudnn-frontend)
  fa4 (band) window             swa_kernels/window_attention.py: FlashAttention-4's sliding window, one
                                call (needs flash-attn-4)
  ... eagle3 ttt step j         the same with window W - j + the j diagonal keys: the TTT mask of step j
  whole training-time test      the steps' times summed (step 0 is the plain window): the attention
                                of one EAGLE-3 training step per layer

Every row is timed twice (benchmarks/measure.py): from a synchronised start (the host's launch time
counts), and queued behind a busy GPU (the GPU's time alone, as in a training step whose host runs ahead).

TFLOP/s counts 4 * D * (visible query-key pairs) * Hq for the forward and 3.5x that for forward +
backward (FlashAttention's benchmark convention: the backward does 2.5x the forward's work), so a
mask that skips work is not credited for it. The visible pairs are counted from the same mask
function, in chunks, on the GPU. At the smallest T the cuDNN rows are checked against the flex
rows (same mask) on the output and the three gradients.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.measure import count_pairs, median_ms, require_cuda  # noqa: E402
from swa_kernels.attention import FLASH_KERNELS, attention, compiled_flex_attention  # noqa: E402
from swa_kernels.window_attention import CUDNN, band_ops, cudnn_band_available, fa4_available, window_attention  # noqa: E402
from train.eagle3 import ttt_flex_block_mask, ttt_visible  # noqa: E402
from models.dflash import LayerMaskSpec, dflash_visible, flex_block_mask, flex_packed_block_mask  # noqa: E402
from swa_kernels.key_intervals import ctx_keys_for, dflash_key_intervals, key_interval_attention, plan_key_intervals  # noqa: E402
require_cuda(__doc__, __name__, flags=True)  # one line on a machine without a CUDA GPU


def ttt_context_block_mask(ctx_valid: torch.Tensor, step: int, window: int | None):
    """The step-0 part of ``ttt_flex_block_mask`` ([T, T]): the same rule, keys of step 0 only."""
    from torch.nn.attention.flex_attention import create_block_mask

    seq_len = ctx_valid.shape[1]
    return create_block_mask(lambda b, h, q, kv: ttt_visible(b, q, kv, step, ctx_valid, window), B=1, H=None, Q_LEN=seq_len,
                             KV_LEN=seq_len, device=ctx_valid.device)


def attention_with_diagonal(q, k_ctx, v_ctx, k_diag, v_diag, ctx_mask, scale: float):
    """Softmax over [context keys under ctx_mask ; each query's own S keys], by log-sum-exp merging.
    q [B, Hq, T, D]; k_ctx/v_ctx [B, Hkv, T, D]; k_diag/v_diag [S, B, Hkv, T, D]."""
    out_ctx, lse_ctx = compiled_flex_attention()(q, k_ctx, v_ctx, block_mask=ctx_mask, scale=scale, enable_gqa=True, return_lse=True)
    rep = q.shape[1] // k_diag.shape[2]
    k_diag, v_diag = k_diag.repeat_interleave(rep, dim=2).float(), v_diag.repeat_interleave(rep, dim=2).float()
    scores = (q.float()[None] * k_diag).sum(-1) * scale  # [S, B, Hq, T]
    lse = torch.logsumexp(torch.cat([lse_ctx.float()[None], scores]), dim=0)
    out = out_ctx.float() * torch.exp(lse_ctx.float() - lse)[..., None] + (torch.exp(scores - lse)[..., None] * v_diag).sum(0)
    return out.to(q.dtype)


def run_case(name: str, q, k, v, attend, pairs: int, rows: list) -> None:
    def step():
        for t in (q, k, v):
            t.grad = None
        out = attend(q, k, v)
        out.backward(torch.ones_like(out))

    try:
        ms = median_ms(step, warmup=2, repeats=5)
        gpu_ms = median_ms(step, warmup=0, repeats=5, queued=True)
    except torch.OutOfMemoryError:
        rows.append((name, q.shape[2], k.shape[2], pairs, None, None, None, None))
        torch.cuda.empty_cache()
        return
    except Exception as error:  # a kernel that cannot run this case (e.g. a compiler refusal): say so, go on
        print(f"{name}: failed: {type(error).__name__}: {str(error).strip().splitlines()[0][:200]}", flush=True)
        rows.append((name, q.shape[2], k.shape[2], pairs, "failed", None, None, None))
        return
    flops = 3.5 * 4 * q.shape[-1] * pairs * q.shape[1]
    rows.append((name, q.shape[2], k.shape[2], pairs, ms, flops / ms / 1e9, gpu_ms, flops / gpu_ms / 1e9))
    print(f"{name}: {ms:.2f} ms, {flops / ms / 1e9:.0f} TFLOP/s; queued {gpu_ms:.2f} ms, {flops / gpu_ms / 1e9:.0f} TFLOP/s",
          flush=True)  # as it goes: a long run may be cut short


def check_same(label: str, q, k, v, fn, reference) -> None:
    """Print the relative difference of fn against reference: output and the three gradients."""
    results = []
    for f in (fn, reference):
        for x in (q, k, v):
            x.grad = None
        try:
            out = f(q, k, v)
            out.float().square().sum().backward()
        except Exception as error:
            print(f"{label}: failed: {type(error).__name__}: {str(error).strip().splitlines()[0][:200]}", flush=True)
            return
        results.append([out.detach().float(), q.grad.float(), k.grad.float(), v.grad.float()])
    diffs = [float((a - b).norm() / b.norm()) for a, b in zip(*results)]
    print(f"{label}: relative difference out/dq/dk/dv " + " ".join(f"{x:.1e}" for x in diffs), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq", type=int, nargs="+", default=[2048, 8192, 32768])
    parser.add_argument("--window", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--ttt-steps", type=int, nargs="+", default=[0, 6])
    parser.add_argument("--block", type=int, default=16)
    parser.add_argument("--anchors", type=int, default=512, help="DFlash anchors per sequence (the dflash_swa recipe's 512)")
    parser.add_argument("--no-lse-candidate", action="store_true", help="skip the rejected eager LSE-merge rows")
    parser.add_argument("--dense-max", type=int, default=8192)
    parser.add_argument("--parts", nargs="+", choices=["window", "ttt", "dflash"], default=["window", "ttt", "dflash"])
    parser.add_argument("--with-chunked", action="store_true", help="also the chunked cuDNN path (the fallback)")
    parser.add_argument("--layout", choices=["bhsd", "bshd"], default="bhsd", help="memory layout of q, k, v")
    args = parser.parse_args()
    flex = compiled_flex_attention()
    hq, hkv, d, w = args.heads, args.kv_heads, args.head_dim, args.window
    rows: list = []
    engines = ([("cudnn (chunked)", CUDNN)] if args.with_chunked else []) + ([("cudnn (band)", band_ops("cudnn-band"))] if cudnn_band_available() else []) \
        + ([("fa4 (band)", band_ops("fa4-band"))] if fa4_available() else [])
    print("window kernels:", ", ".join(name for name, _ in engines), flush=True)
    flash = FLASH_KERNELS if fa4_available() else None  # flex's block masks run by FlashAttention-4
    ttt_ms: dict = {}  # (T, attention) -> {step: ms}, for the whole-TTT rows

    def tensors(q_len: int, kv_len: int):
        if args.layout == "bshd":  # the models' projections, [B, T, H, D] viewed as [B, H, T, D]
            make = lambda n, h: torch.randn(1, n, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()  # noqa: E731
        else:
            make = lambda n, h: torch.randn(1, h, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)  # noqa: E731
        return make(q_len, hq), make(kv_len, hkv), make(kv_len, hkv)

    for t in args.seq:
        q, k, v = tensors(t, t)
        valid = torch.ones(1, t, dtype=torch.bool, device="cuda")
        pos = torch.arange(t, device="cuda")
        window_pairs = int(((pos[:, None] >= pos[None]) & (pos[:, None] - pos[None] < w)).sum()) if t <= 8192 else \
            sum(min(i + 1, w) for i in range(t))
        if "window" in args.parts:
            causal_pairs = t * (t + 1) // 2
            run_case("sdpa causal (full)", q, k, v, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                     causal_pairs, rows)
            if t <= args.dense_max:
                dense = (pos[:, None] >= pos[None]) & (pos[:, None] - pos[None] < w)
                run_case(f"sdpa dense window mask W={w}", q, k, v,
                         lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=dense, enable_gqa=True), window_pairs, rows)
                del dense
            # A plain window is TTT step 0 on a sequence without padding.
            block_mask = ttt_flex_block_mask(valid, 0, w)
            run_case(f"flex window W={w}", q, k, v, lambda q, k, v: flex(q, k, v, block_mask=block_mask, enable_gqa=True), window_pairs, rows)
            ttt_ms.setdefault((t, "flex"), {})[0] = rows[-1][4], rows[-1][6], window_pairs
            if flash:
                run_case(f"flex (FLASH) window W={w}", q, k, v,
                         lambda q, k, v: flex(q, k, v, block_mask=block_mask, enable_gqa=True, kernel_options=flash), window_pairs, rows)
            for kind, ops in engines:
                run_case(f"{kind} window W={w}", q, k, v, lambda q, k, v, ops=ops: window_attention(q, k, v, w, ops=ops), window_pairs, rows)
                ttt_ms.setdefault((t, kind), {})[0] = rows[-1][4], rows[-1][6], window_pairs
                if t == min(args.seq):
                    check_same(f"T={t} {kind} window vs flex window", q, k, v,
                               lambda q, k, v, ops=ops: window_attention(q, k, v, w, d**-0.5, ops=ops),
                               lambda q, k, v: flex(q, k, v, block_mask=block_mask, enable_gqa=True, scale=d**-0.5))
        for j in (args.ttt_steps if "ttt" in args.parts else []):
            if j == 0:
                continue
            qj, kj, vj = tensors(t, (j + 1) * t)
            mask_j = ttt_flex_block_mask(valid, j, w)
            pairs = count_pairs(lambda b, qi, ki: ttt_visible(b, qi, ki, j, valid, w), t, (j + 1) * t)
            run_case(f"flex eagle3 ttt step {j} W={w}", qj, kj, vj, lambda q, k, v: flex(q, k, v, block_mask=mask_j, enable_gqa=True),
                     pairs, rows)
            ttt_ms.setdefault((t, "flex"), {})[j] = rows[-1][4], rows[-1][6], pairs
            # the trainer's tensors: step 0's keys, and the j earlier steps' keys stacked [j, 1, Hkv, T, D]
            k0, v0 = (x.unflatten(2, (j + 1, t))[:, :, 0].detach().clone().requires_grad_() for x in (kj, vj))
            kd, vd = (x.unflatten(2, (j + 1, t))[:, :, 1:].movedim(2, 0).detach().contiguous().requires_grad_() for x in (kj, vj))
            for kind, ops in engines:
                def ttt_band(q, k, v, j=j, ops=ops):
                    k_steps, v_steps = k.unflatten(2, (j + 1, t)), v.unflatten(2, (j + 1, t))  # [1, Hkv, j+1, T, D]
                    return window_attention(q, k_steps[:, :, 0], v_steps[:, :, 0], w - j, d**-0.5, k_steps[:, :, 1:].movedim(2, 0),
                                            v_steps[:, :, 1:].movedim(2, 0), ops=ops)

                def ttt_band_steps(q, k, v, j=j, ops=ops, kd=kd, vd=vd):
                    kd.grad = vd.grad = None
                    return window_attention(q, k, v, w - j, d**-0.5, kd, vd, ops=ops)

                run_case(f"{kind} eagle3 ttt step {j} W={w}", qj, k0, v0, ttt_band_steps, pairs, rows)
                ttt_ms.setdefault((t, kind), {})[j] = rows[-1][4], rows[-1][6], pairs
                if t == min(args.seq):
                    check_same(f"T={t} step {j}: {kind} window + diagonal vs the flex TTT mask", qj, kj, vj, ttt_band,
                               lambda q, k, v: flex(q, k, v, block_mask=mask_j, enable_gqa=True, scale=d**-0.5))
            del k0, v0, kd, vd
            if args.no_lse_candidate:
                del qj, kj, vj
                continue
            ctx_mask = ttt_context_block_mask(valid, j, w)

            def split(q, k, v, j=j, ctx_mask=ctx_mask):
                k_steps, v_steps = k.unflatten(2, (j + 1, t)), v.unflatten(2, (j + 1, t))  # [1, Hkv, j+1, T, D]
                return attention_with_diagonal(q, k_steps[:, :, 0], v_steps[:, :, 0], k_steps[:, :, 1:].movedim(2, 0),
                                               v_steps[:, :, 1:].movedim(2, 0), ctx_mask, scale=d**-0.5)

            if t == min(args.seq):  # the same numbers as the single mask, gradients included
                outs = []
                for fn in (lambda q, k, v: flex(q, k, v, block_mask=mask_j, enable_gqa=True, scale=d**-0.5), split):
                    for x in (qj, kj, vj):
                        x.grad = None
                    out = fn(qj, kj, vj)
                    out.float().square().sum().backward()
                    outs.append([out.float(), qj.grad.float(), kj.grad.float(), vj.grad.float()])
                diffs = [float((a - b).abs().max() / b.abs().max()) for a, b in zip(*(map(torch.Tensor.detach, o) for o in outs))]
                print(f"T={t} step {j}: context+diagonal vs one mask, max relative diff out/dq/dk/dv: " + " ".join(f"{x:.1e}" for x in diffs))
            run_case(f"flex eagle3 ttt step {j} context + diagonal (LSE) W={w}", qj, kj, vj, split, pairs, rows)
            del qj, kj, vj
        if "dflash" not in args.parts:
            del q, k, v
            torch.cuda.empty_cache()
            continue
        # DFlash: T context keys, --anchors blocks spread evenly, or drawn at random as the trainer does
        n = max(1, min(args.anchors, t // args.block))
        spec = LayerMaskSpec(window=w, block_causal=True)
        qd, kd, vd = tensors(n * args.block, t + n * args.block)
        generator = torch.Generator(device="cuda").manual_seed(t)
        for layout, anchors in (("even", torch.linspace(args.block, t - args.block, n, device="cuda").long()[None]),
                                ("random", torch.randperm(t - args.block, device="cuda", generator=generator)[:n].sort().values[None])):
            dmask = flex_block_mask(anchors, valid, args.block, spec)
            packed = flex_packed_block_mask(anchors, valid, args.block, spec, hq // hkv)
            pairs = count_pairs(lambda b, qi, ki: dflash_visible(b, qi, ki, anchors, valid, args.block, spec), n * args.block,
                                t + n * args.block)
            run_case(f"flex dflash blocks ({layout}) B={args.block} W={w}", qd, kd, vd,
                     lambda q, k, v: flex(q, k, v, block_mask=dmask, enable_gqa=True), pairs, rows)
            if packed is None:
                continue
            run_case(f"flex dflash packed ({layout}) B={args.block} W={w}", qd, kd, vd,
                     lambda q, k, v: attention(q, k, v, packed), pairs, rows)
            if t == min(args.seq):
                check_same(f"T={t} dflash ({layout}): packed vs plain flex", qd, kd, vd, lambda q, k, v: attention(q, k, v, packed),
                           lambda q, k, v: flex(q, k, v, block_mask=dmask, enable_gqa=True))
            if flash:
                run_case(f"flex (FLASH) dflash packed ({layout}) B={args.block} W={w}", qd, kd, vd,
                         lambda q, k, v: attention(q, k, v, packed, kernel_options=flash), pairs, rows)
                one_block = flex_packed_block_mask(anchors, valid, args.block, spec, hq // hkv, q_tile=(hq // hkv) * args.block,
                                                   kernel_options=flash)
                if one_block is not None:  # a query tile of one block: one key range per tile
                    run_case(f"flex (FLASH) dflash packed, {(hq // hkv) * args.block}-row tiles ({layout}) B={args.block} W={w}",
                             qd, kd, vd, lambda q, k, v: attention(q, k, v, one_block), pairs, rows)
                    if t == min(args.seq):
                        check_same(f"T={t} dflash ({layout}): packed FLASH one-block tiles vs plain flex", qd, kd, vd,
                                   lambda q, k, v: attention(q, k, v, one_block),
                                   lambda q, k, v: flex(q, k, v, block_mask=dmask, enable_gqa=True))
                if t == min(args.seq):
                    check_same(f"T={t} dflash ({layout}): packed FLASH vs plain flex", qd, kd, vd,
                               lambda q, k, v: attention(q, k, v, packed, kernel_options=flash),
                               lambda q, k, v: flex(q, k, v, block_mask=dmask, enable_gqa=True))
            if flash and t % 128 == 0:  # FA4's own kernels with each row's two key intervals (swa_kernels/key_intervals.py)
                rows_iv = dflash_key_intervals(anchors, torch.tensor([t], device="cuda"), args.block, w, True, ctx_keys_for(t))
                plan = plan_key_intervals(rows_iv, hq // hkv, t + n * args.block)  # once per step, as the block masks are
                intervals = lambda q, k, v: key_interval_attention(*(x.transpose(1, 2) for x in (q, k, v)), plan).transpose(1, 2)  # noqa: E731
                run_case(f"fa4 key intervals dflash ({layout}) B={args.block} W={w}", qd, kd, vd, intervals, pairs, rows)
                check_same(f"T={t} dflash ({layout}): fa4 key intervals vs packed flex (FLASH)", qd, kd, vd, intervals,
                           lambda q, k, v: attention(q, k, v, packed, kernel_options=flash))
                # the same with q's heads in group-major order (g * Hkv + h): no regrouping copies in the backward
                gm = lambda q, k, v: key_interval_attention(*(x.transpose(1, 2) for x in (q, k, v)), plan, group_major=True).transpose(1, 2)  # noqa: E731
                run_case(f"fa4 key intervals dflash, group-major heads ({layout}) B={args.block} W={w}", qd, kd, vd, gm, pairs, rows)
                order = torch.arange(hq, device="cuda").view(hkv, hq // hkv).t().reshape(-1)  # group-major slot -> HF head
                check_same(f"T={t} dflash ({layout}): fa4 key intervals group-major vs HF head order", qd, kd, vd,
                           lambda q, k, v: gm(q[:, order].transpose(1, 2).contiguous().transpose(1, 2), k, v)[:, order.argsort()], intervals)
        del q, k, v, qd, kd, vd
        torch.cuda.empty_cache()

    print(f"{torch.cuda.get_device_name()}, bf16, Hq={hq} Hkv={hkv} D={d}, {args.layout.upper()}, forward + backward")
    print("ms: one call timed from a synchronised start (the host's launch time counts); queued: the same call queued")
    print("behind a busy GPU (the GPU's time alone, as in a training step whose host runs ahead)")
    print("| attention | queries | keys | visible pairs | ms | TFLOP/s (visible work) | ms queued | TFLOP/s queued |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, ql, kl, pairs, ms, tflops, gpu_ms, gpu_tflops in rows:
        shown = "OOM" if ms is None else ms if isinstance(ms, str) else f"{ms:.2f}"
        fmt = lambda x, f: "-" if x is None else f"{x:{f}}"  # noqa: E731
        print(f"| {name} | {ql} | {kl} | {pairs:,} | {shown} | {fmt(tflops, '.0f')} | {fmt(gpu_ms, '.2f')} | {fmt(gpu_tflops, '.0f')} |")
    steps = sorted(set(args.ttt_steps) | {0})
    print(f"\nEAGLE-3's whole training-time test: the attention of steps {steps[0]}..{steps[-1]} summed (step 0: the plain window)")
    print("| T | attention | ms (sum) | TFLOP/s (visible work) | ms queued (sum) | TFLOP/s queued |")
    print("|---:|---|---:|---:|---:|---:|")
    for (t, kind), by_step in ttt_ms.items():
        if sorted(by_step) != steps or any(not isinstance(ms, float) for ms, _, _ in by_step.values()):
            continue
        total_ms = sum(ms for ms, _, _ in by_step.values())
        total_gpu_ms = sum(gpu_ms for _, gpu_ms, _ in by_step.values())
        flops = 3.5 * 4 * d * sum(pairs for _, _, pairs in by_step.values()) * hq
        print(f"| {t} | {kind} | {total_ms:.2f} | {flops / total_ms / 1e9:.0f} | {total_gpu_ms:.2f} | {flops / total_gpu_ms / 1e9:.0f} |")


if __name__ == "__main__":
    main()
