"""Probe: FlashAttention-4 (CuTe DSL, ``flash-attn-4``) on the training masks, forward + backward.

    python benchmarks/probe_fa4.py [--seq 2048 32768] [--window 2048]

Rows: FA4's own sliding window (``window_size=(W - 1, 0)``: W keys, the query included), and
flex_attention with ``kernel_options={"BACKEND": "FLASH"}`` (flex's block masks run by FA4's
kernels) beside the default Triton flex, on the plain window, the EAGLE-3 TTT mask and the packed
DFlash mask. At the smallest T every FA4 row is checked against the Triton flex row of the same
mask (output and the three gradients).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.measure import count_pairs, median_ms  # noqa: E402
from kernels.attention import _pack_queries, _unpack_queries, compiled_flex_attention  # noqa: E402
from train.eagle3_masks import ttt_flex_block_mask, ttt_visible  # noqa: E402
from train.masks import LayerMaskSpec, dflash_visible, flex_packed_block_mask  # noqa: E402

FLASH = {"BACKEND": "FLASH"}


def timed(name, q, k, v, fn, pairs, rows):
    def step():
        for t in (q, k, v):
            t.grad = None
        fn(q, k, v).backward(gradient=torch.ones_like(q))

    try:
        ms = median_ms(step, warmup=2, repeats=5)
    except Exception as error:  # a probe: report the failure and go on
        print(f"{name}: FAILED {type(error).__name__}: {str(error).splitlines()[0][:300]}", flush=True)
        traceback.print_exc(limit=3)
        rows.append((name, None, None))
        return
    hq, d = q.shape[1], q.shape[-1]
    rows.append((name, ms, 3.5 * 4 * d * pairs * hq / ms / 1e9))


def compare(label, q, k, v, fn, reference):
    results = []
    try:
        for f in (fn, reference):
            for x in (q, k, v):
                x.grad = None
            out = f(q, k, v)
            out.float().square().sum().backward()
            results.append([out.detach().float(), q.grad.float(), k.grad.float(), v.grad.float()])
    except Exception as error:
        print(f"{label}: FAILED {type(error).__name__}: {str(error).splitlines()[0][:300]}", flush=True)
        return
    diffs = [float((a - b).norm() / b.norm()) for a, b in zip(*results)]
    print(f"{label}: relative difference out/dq/dk/dv " + " ".join(f"{x:.1e}" for x in diffs), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq", type=int, nargs="+", default=[2048, 32768])
    parser.add_argument("--window", type=int, default=2048)
    parser.add_argument("--ttt-step", type=int, default=6)
    parser.add_argument("--anchors", type=int, default=512)
    parser.add_argument("--block", type=int, default=16)
    args = parser.parse_args()
    from flash_attn.cute.interface import flash_attn_func

    flex = compiled_flex_attention()
    hq, hkv, d, w = 32, 8, 128, args.window
    g = hq // hkv

    def make(n, h):
        return torch.randn(1, h, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def fa4_window(q, k, v):
        out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True, window_size=(w - 1, 0))
        out = out[0] if isinstance(out, tuple) else out
        return out.transpose(1, 2)

    rows = []
    for t in args.seq:
        small = t == min(args.seq)
        valid = torch.ones(1, t, dtype=torch.bool, device="cuda")
        q, k, v = make(t, hq), make(t, hkv), make(t, hkv)
        pairs = sum(min(i + 1, w) for i in range(t))
        window_mask = ttt_flex_block_mask(valid, 0, w)
        flex_window = lambda q, k, v: flex(q, k, v, block_mask=window_mask, enable_gqa=True)  # noqa: E731
        flash_window = lambda q, k, v: flex(q, k, v, block_mask=window_mask, enable_gqa=True, kernel_options=FLASH)  # noqa: E731
        timed(f"T={t} flex (triton) window", q, k, v, flex_window, pairs, rows)
        timed(f"T={t} fa4 window_size=(W-1,0)", q, k, v, fa4_window, pairs, rows)
        timed(f"T={t} flex (FLASH) window", q, k, v, flash_window, pairs, rows)
        if small:
            compare(f"T={t} fa4 window vs flex", q, k, v, fa4_window, flex_window)
            compare(f"T={t} flex FLASH window vs flex", q, k, v, flash_window, flex_window)
        del q, k, v

        j = args.ttt_step
        q, k, v = make(t, hq), make((j + 1) * t, hkv), make((j + 1) * t, hkv)
        ttt_mask = ttt_flex_block_mask(valid, j, w)
        pairs = count_pairs(lambda b, qi, ki: ttt_visible(b, qi, ki, j, valid, w), t, (j + 1) * t)
        flex_ttt = lambda q, k, v: flex(q, k, v, block_mask=ttt_mask, enable_gqa=True)  # noqa: E731
        flash_ttt = lambda q, k, v: flex(q, k, v, block_mask=ttt_mask, enable_gqa=True, kernel_options=FLASH)  # noqa: E731
        timed(f"T={t} flex (triton) ttt step {j}", q, k, v, flex_ttt, pairs, rows)
        timed(f"T={t} flex (FLASH) ttt step {j}", q, k, v, flash_ttt, pairs, rows)
        if small:
            compare(f"T={t} flex FLASH ttt vs flex", q, k, v, flash_ttt, flex_ttt)
        del q, k, v

        n = min(args.anchors, t // args.block)
        spec = LayerMaskSpec(window=w, block_causal=True)
        generator = torch.Generator(device="cuda").manual_seed(t)
        anchors = torch.randperm(t - args.block, device="cuda", generator=generator)[:n].sort().values[None]
        packed = flex_packed_block_mask(anchors, valid, args.block, spec, g)
        pairs = count_pairs(lambda b, qi, ki: dflash_visible(b, qi, ki, anchors, valid, args.block, spec), n * args.block,
                            t + n * args.block)
        q, k, v = make(n * args.block, hq), make(t + n * args.block, hkv), make(t + n * args.block, hkv)

        def packed_with(options):
            def run(q, k, v):
                out = flex(_pack_queries(q, g, args.block), k, v, block_mask=packed.block_mask, kernel_options=options)
                return _unpack_queries(out, g, args.block)
            return run

        timed(f"T={t} flex (triton) dflash packed (random)", q, k, v, packed_with(None), pairs, rows)
        timed(f"T={t} flex (FLASH) dflash packed (random)", q, k, v, packed_with(FLASH), pairs, rows)
        if small:
            compare(f"T={t} flex FLASH dflash vs flex", q, k, v, packed_with(FLASH), packed_with(None))
        del q, k, v
        torch.cuda.empty_cache()

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, bf16, Hq={hq} Hkv={hkv} D={d}, W={w}, forward + backward")
    print("| attention | ms | TFLOP/s (visible work) |")
    print("|---|---:|---:|")
    for name, ms, tflops in rows:
        print(f"| {name} | {'failed' if ms is None else f'{ms:.2f}'} | {'-' if tflops is None else f'{tflops:.0f}'} |")


if __name__ == "__main__":
    main()
