"""Where a 16-token verify's split-KV attention spends its extra time over a one-token step, by variants of
``swa_kernels/decode_attention.py`` timed side by side, as the loop calls it (raw q/k/v views of the fused projection, the
per-head norm and RoPE in the kernel, the new keys written by the kernel), 36 calls on 36 layer caches in one CUDA
graph (``attention_split_sizes.us_over_layers``), at Qwen3-8B's heads (8 KV heads x 4, D 128), bf16.

Variants of pass 1 (``_split_kernel``), each with the production merge unless named:

    production   swa_kernels/decode_attention.decode_attention as shipped (the reference of every max |diff|); since this
                 script's findings it launches split by split, as ``splits_last`` below
    copy         this file's copy of pass 1 with every option off: the grid before, (splits, B*Hkv) (the first calls
                 checked that it timed as the kernel it copied)
    splits_last  the grid (B*Hkv, splits): programs launch split by split, so the ones that share a multiprocessor once
                 the SMs are full are the last splits (the one holding the newest key, the lightest, and those past it,
                 empty), not the last KV head's full ones
    tma, tma_2d  keys and values read through host-side tensor descriptors (Hopper's bulk tensor copies, pipelined on
                 mbarriers), 4-D over [B, Hkv, C, D] or 2-D over its rows, instead of masked pointer loads; rows outside
                 the split's keys come in and are masked in the scores (finite cache values; past the capacity the
                 descriptor pads zeros)
    bf16_part    the unnormalised partial outputs stored in bf16 (half the merge's bytes; a speed probe only: the
                 production merge reads fp32, so a cast runs between)
    no_store     pass 1 without its partial stores: the compiler then drops its loop as dead code, so this times the
                 launches, the new keys' writes and the merge (wrong output)
    merge_rowsR  the merge with R query rows a program (fewer, larger programs)
    tilingT, keysK, splits_last_keysK, tma_2d_keysK   the copy (or that option) at another pass-1 tiling or split size
                 (``--tilings``, ``--split-keys``)

    python benchmarks/verify_attention_variants.py [--contexts 8192 32768] [--tokens 1 16]

Differences between variants are the point; the loop (``decode_speed.py``) judges any change.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.attention_split_sizes import (CAPACITY, HEAD_DIM, KV_HEADS, LAYERS, keys_floor_us, parse_tiling,  # noqa: E402
                                              us_over_layers)
from benchmarks.decode_speed import measured_bandwidth  # noqa: E402
from swa_kernels import decode_attention as da  # noqa: E402
from swa_kernels.decode_attention import LOG2E, Rope, _attend, _norm_rope, tl, triton  # noqa: E402
from benchmarks.measure import require_cuda  # noqa: E402
require_cuda(__doc__, __name__, flags=True)  # one line on a machine without a CUDA GPU

GROUP = 4


@triton.jit
def _split_variant(Q, K, V, KD, VD, KN, VN, POS, OP, MP, LP, COS, SIN, QW, KW,
                   sq_b, sq_h, sq_g, sq_t, sk_b, sk_h, sk_c, sv_b, sv_h, sv_c, skn_b, skn_h, skn_t, svn_b, svn_h, svn_t,
                   so_b, so_h, so_s, so_m, sm_b, sm_h, sm_s, s_cos,
                   num_kv_heads, rows, n_tokens, capacity, qk_scale, split_size, eps,
                   D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
                   TMA: tl.constexpr, TMA_2D: tl.constexpr, PART_BF16: tl.constexpr, STORE: tl.constexpr,
                   SPLITS_LAST: tl.constexpr):
    # swa_kernels/decode_attention._split_kernel with HAS_NEW, ROTATE, HAS_NORM, LIVE_TILES on and no window (the loop's
    # Qwen3-8B call), plus the options of the module docstring
    if SPLITS_LAST:  # grid (B*Hkv, splits): the last programs launched are the last splits, the lightest
        bh = tl.program_id(0)
        split = tl.program_id(1)
    else:
        split = tl.program_id(0)
        bh = tl.program_id(1)
    b = bh // num_kv_heads
    h = bh % num_kv_heads
    pos0 = tl.load(POS + b)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    half = (offs_d + D // 2) % D
    sign = tl.where(offs_d < D // 2, -1.0, 1.0)[None, :]
    DTYPE = Q.dtype.element_ty
    q_t = offs_m % n_tokens
    q_pos = pos0 + q_t
    start = split * split_size
    end = tl.minimum(tl.minimum(start + split_size, capacity), pos0)
    live = offs_m[:, None] < rows
    q_row = Q + b * sq_b + h * sq_h + (offs_m // n_tokens)[:, None] * sq_g + q_t[:, None] * sq_t
    q = tl.load(q_row + offs_d[None, :], mask=live, other=0.0)
    q_cos = tl.load(COS + q_pos[:, None] * s_cos + offs_d[None, :], mask=live, other=0.0).to(tl.float32)
    q_sin = tl.load(SIN + q_pos[:, None] * s_cos + offs_d[None, :], mask=live, other=0.0).to(tl.float32)
    q_half = tl.load(q_row + half[None, :], mask=live, other=0.0).to(tl.float32)
    qw = tl.load(QW + offs_d).to(tl.float32)[None, :]
    qw_half = tl.load(QW + half).to(tl.float32)[None, :]
    q = _norm_rope(q.to(tl.float32), q_half, qw, qw_half, q_cos, q_sin, sign, eps, D, True, DTYPE)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    tiles = tl.cdiv(tl.maximum(end - start, 0), BLOCK_N)
    for i in range(tiles):
        offs_n = start + i * BLOCK_N + tl.arange(0, BLOCK_N)
        in_range = offs_n < end
        if TMA_2D:  # the cache as rows [B*Hkv*C, D]: a tile past this head's capacity reads the next head's (masked)
            row = (bh * capacity + start + i * BLOCK_N).to(tl.int32)  # pos0 is int64: descriptors take int32 offsets
            k = KD.load([row, 0])
            v = VD.load([row, 0])
        elif TMA:
            key0 = (start + i * BLOCK_N).to(tl.int32)
            k = KD.load([b, h, key0, 0]).reshape(BLOCK_N, D)
            v = VD.load([b, h, key0, 0]).reshape(BLOCK_N, D)
        else:
            k = tl.load(K + b * sk_b + h * sk_h + offs_n[:, None] * sk_c + offs_d[None, :], mask=in_range[:, None], other=0.0)
            v = tl.load(V + b * sv_b + h * sv_h + offs_n[:, None] * sv_c + offs_d[None, :], mask=in_range[:, None], other=0.0)
        visible = in_range[None, :] & (offs_n[None, :] <= q_pos[:, None])
        m_i, l_i, acc = _attend(q, k, v, visible, m_i, l_i, acc, qk_scale, False)
    if split == pos0 // split_size:
        offs_t = tl.arange(0, BLOCK_T)
        new = offs_t < n_tokens
        kn_row = KN + b * skn_b + h * skn_h + offs_t[:, None] * skn_t
        kn = tl.load(kn_row + offs_d[None, :], mask=new[:, None], other=0.0)
        kw = tl.load(KW + offs_d).to(tl.float32)[None, :]
        kw_half = tl.load(KW + half).to(tl.float32)[None, :]
        t_cos = tl.load(COS + (pos0 + offs_t)[:, None] * s_cos + offs_d[None, :], mask=new[:, None], other=0.0).to(tl.float32)
        t_sin = tl.load(SIN + (pos0 + offs_t)[:, None] * s_cos + offs_d[None, :], mask=new[:, None], other=0.0).to(tl.float32)
        kn_half = tl.load(kn_row + half[None, :], mask=new[:, None], other=0.0).to(tl.float32)
        kn = tl.where(new[:, None], _norm_rope(kn.to(tl.float32), kn_half, kw, kw_half, t_cos, t_sin, sign, eps, D, True, DTYPE),
                      0.0).to(DTYPE)
        vn = tl.load(VN + b * svn_b + h * svn_h + offs_t[:, None] * svn_t + offs_d[None, :], mask=new[:, None], other=0.0)
        tl.store(K + b * sk_b + h * sk_h + (pos0 + offs_t)[:, None] * sk_c + offs_d[None, :], kn, mask=new[:, None])
        tl.store(V + b * sv_b + h * sv_h + (pos0 + offs_t)[:, None] * sv_c + offs_d[None, :], vn, mask=new[:, None])
        visible = new[None, :] & (offs_t[None, :] <= q_t[:, None])
        m_i, l_i, acc = _attend(q, kn, vn, visible, m_i, l_i, acc, qk_scale, False)
    if STORE:
        base = b * so_b + h * so_h + split * so_s
        seen = m_i > float("-inf")
        if PART_BF16:
            tl.store(OP + base + offs_m[:, None] * so_m + offs_d[None, :], acc.to(tl.bfloat16), mask=live & seen[:, None])
        else:
            tl.store(OP + base + offs_m[:, None] * so_m + offs_d[None, :], acc, mask=live & seen[:, None])
        stat = b * sm_b + h * sm_h + split * sm_s + offs_m
        tl.store(MP + stat, m_i, mask=offs_m < rows)
        tl.store(LP + stat, l_i, mask=offs_m < rows)


@triton.jit
def _merge_rows(OP, MP, LP, OUT, num_kv_heads, splits, n_tokens, rows,
                so_b, so_h, so_s, so_m, sm_b, sm_h, sm_s, sout_b, sout_h, sout_g, sout_t,
                D: tl.constexpr, SPLITS: tl.constexpr, R: tl.constexpr):
    # decode_attention._merge_kernel over R rows a program, their loads unrolled (issued together)
    bh = tl.program_id(0)
    block = tl.program_id(1)
    b = bh // num_kv_heads
    h = bh % num_kv_heads
    offs_s = tl.arange(0, SPLITS)
    offs_d = tl.arange(0, D)
    used = offs_s < splits
    for j in tl.static_range(R):
        row = block * R + j
        stat = b * sm_b + h * sm_h + offs_s * sm_s + row
        m = tl.load(MP + stat, mask=used, other=float("-inf"))
        l = tl.load(LP + stat, mask=used, other=0.0)
        m_max = tl.max(m, 0)
        w = tl.math.exp2(m - m_max)
        seen = used & (m > float("-inf"))
        o = tl.load(OP + b * so_b + h * so_h + offs_s[:, None] * so_s + row * so_m + offs_d[None, :], mask=seen[:, None],
                    other=0.0).to(tl.float32)
        out = tl.sum(o * w[:, None], 0) / tl.sum(l * w, 0)
        dst = OUT + b * sout_b + h * sout_h + (row // n_tokens) * sout_g + (row % n_tokens) * sout_t
        tl.store(dst + offs_d, out.to(OUT.dtype.element_ty))


def variant_attention(q, k_cache, v_cache, k_new, v_new, pos, n, scale, rope: Rope, tma=False, tma_2d=False, part_bf16=False, store=True,
                      merge_rows=0, tiling=None, keys=None, splits_last=False):
    """decode_attention(q, ..., k_new=, v_new=, rope=) through this file's pass 1 and merge (the options above)."""
    b, hkv, capacity, d = k_cache.shape
    groups = q.shape[2] // hkv
    q_strides = (q.stride(0), groups * q.stride(2), q.stride(2), q.stride(1))
    k_new, v_new = k_new.transpose(1, 2), v_new.transpose(1, 2)
    rows = groups * n
    tiling = tiling or da.tiling_for(rows, q.device)
    size = keys or da.split_size(capacity, b * hkv, q.device, rows, tiling.block_n)
    splits = math.ceil(capacity / size)
    o_part = torch.empty(b, hkv, splits, rows, d, dtype=torch.bfloat16 if part_bf16 else torch.float32, device=q.device)
    m_part = torch.empty(b, hkv, splits, rows, dtype=torch.float32, device=q.device)
    l_part = torch.empty_like(m_part)
    out = torch.empty(b, n, hkv * groups, d, dtype=q.dtype, device=q.device)
    out_strides = (out.stride(0), groups * out.stride(2), out.stride(2), out.stride(1))
    if tma_2d:
        from triton.tools.tensor_descriptor import TensorDescriptor
        kd = TensorDescriptor.from_tensor(k_cache.view(-1, d), [tiling.block_n, d])
        vd = TensorDescriptor.from_tensor(v_cache.view(-1, d), [tiling.block_n, d])
    elif tma:
        from triton.tools.tensor_descriptor import TensorDescriptor
        kd = TensorDescriptor(k_cache, list(k_cache.shape), list(k_cache.stride()), [1, 1, tiling.block_n, d])
        vd = TensorDescriptor(v_cache, list(v_cache.shape), list(v_cache.stride()), [1, 1, tiling.block_n, d])
    else:
        kd, vd = k_cache, v_cache
    _split_variant[(b * hkv, splits) if splits_last else (splits, b * hkv)](
        q, k_cache, v_cache, kd, vd, k_new, v_new, pos, o_part, m_part, l_part, rope.cos, rope.sin, rope.q_norm, rope.k_norm,
        *q_strides, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        k_new.stride(0), k_new.stride(1), k_new.stride(2), v_new.stride(0), v_new.stride(1), v_new.stride(2),
        o_part.stride(0), o_part.stride(1), o_part.stride(2), o_part.stride(3), m_part.stride(0), m_part.stride(1), m_part.stride(2),
        rope.cos.stride(0), hkv, rows, n, capacity, scale * LOG2E, size, rope.eps,
        D=d, BLOCK_M=max(16, triton.next_power_of_2(rows)), BLOCK_N=tiling.block_n, BLOCK_T=max(16, triton.next_power_of_2(n)),
        TMA=tma, TMA_2D=tma_2d, PART_BF16=part_bf16, STORE=store, SPLITS_LAST=splits_last, num_warps=tiling.num_warps, num_stages=tiling.num_stages)
    if merge_rows:
        _merge_rows[(b * hkv, rows // merge_rows)](
            o_part, m_part, l_part, out, hkv, splits, n, rows,
            o_part.stride(0), o_part.stride(1), o_part.stride(2), o_part.stride(3), m_part.stride(0), m_part.stride(1),
            m_part.stride(2), *out_strides, D=d, SPLITS=triton.next_power_of_2(splits), R=merge_rows, num_warps=4)
    else:
        if part_bf16:
            o_part = o_part.float()  # the production merge reads fp32 (a speed probe: this cast is timed too)
        da.merge_splits(o_part, m_part, l_part, out, n, out_strides)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 8192, 32768], choices=sorted(CAPACITY))
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--merge-rows", type=int, nargs="*", default=[4, 16])
    parser.add_argument("--variants", nargs="+", help="only these variants (names above)")
    parser.add_argument("--tilings", nargs="*", default=[], help="also the copy at these pass-1 tilings (keys/warps/stages), e.g. 64/8/3")
    parser.add_argument("--split-keys", type=int, nargs="*", default=[], help="also the copy (and tma_2d) at these keys per split")
    parser.add_argument("--uncaptured", type=int, default=0, metavar="N",
                        help="call each variant N times uncaptured and time nothing (for a profiler such as ncu to read)")
    args = parser.parse_args()
    torch.manual_seed(0)
    bw = measured_bandwidth()["read_TBps"]
    print(f"# {torch.cuda.get_device_name()} | triton {triton.__version__} | µs per call, 36 calls on 36 caches | read {bw:.2f} TB/s")
    print("context | tokens | floor µs | variant | µs | max |diff| against production")
    for pos in args.contexts:
        capacity = CAPACITY[pos]
        caches = [(torch.randn(1, KV_HEADS, capacity, HEAD_DIM, device="cuda", dtype=torch.bfloat16),
                   torch.randn(1, KV_HEADS, capacity, HEAD_DIM, device="cuda", dtype=torch.bfloat16)) for _ in range(LAYERS)]
        cos = torch.randn(capacity, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        sin = torch.randn(capacity, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        rope = Rope(cos, sin, torch.rand(HEAD_DIM, device="cuda", dtype=torch.bfloat16) + 0.5,
                    torch.rand(HEAD_DIM, device="cuda", dtype=torch.bfloat16) + 0.5, 1e-6)
        p = torch.tensor([pos], device="cuda")
        for n in args.tokens:
            qkv = torch.randn(1, n, KV_HEADS * (GROUP + 2), HEAD_DIM, device="cuda", dtype=torch.bfloat16)
            q, k, v = qkv.split([KV_HEADS * GROUP, KV_HEADS, KV_HEADS], dim=2)
            scale = HEAD_DIM ** -0.5
            ref = da.decode_attention(q, *caches[0], p, n, scale, k_new=k, v_new=v, rope=rope).float()
            runs = {"production": lambda i: da.decode_attention(q, *caches[i], p, n, scale, k_new=k, v_new=v, rope=rope),
                    "copy": lambda i: variant_attention(q, *caches[i], k, v, p, n, scale, rope),
                    "tma": lambda i: variant_attention(q, *caches[i], k, v, p, n, scale, rope, tma=True),
                    "tma_2d": lambda i: variant_attention(q, *caches[i], k, v, p, n, scale, rope, tma_2d=True),
                    "splits_last": lambda i: variant_attention(q, *caches[i], k, v, p, n, scale, rope, splits_last=True),
                    "tma_splits_last": lambda i: variant_attention(q, *caches[i], k, v, p, n, scale, rope, tma=True, splits_last=True),
                    "tma_2d_splits_last": lambda i: variant_attention(q, *caches[i], k, v, p, n, scale, rope, tma_2d=True, splits_last=True),
                    "bf16_part": lambda i: variant_attention(q, *caches[i], k, v, p, n, scale, rope, part_bf16=True),
                    "no_store": lambda i: variant_attention(q, *caches[i], k, v, p, n, scale, rope, store=False)}
            for t in args.tilings:
                runs[f"tiling{t}"] = lambda i, _t=t: variant_attention(q, *caches[i], k, v, p, n, scale, rope, tiling=parse_tiling(_t))
            for kk in args.split_keys:
                runs[f"keys{kk}"] = lambda i, _k=kk: variant_attention(q, *caches[i], k, v, p, n, scale, rope, keys=_k)
                runs[f"splits_last_keys{kk}"] = lambda i, _k=kk: variant_attention(q, *caches[i], k, v, p, n, scale, rope, keys=_k,
                                                                                     splits_last=True)
                runs[f"tma_2d_keys{kk}"] = lambda i, _k=kk: variant_attention(q, *caches[i], k, v, p, n, scale, rope, tma_2d=True, keys=_k)
            for r in args.merge_rows:
                if (GROUP * n) % r == 0:
                    runs[f"merge_rows{r}"] = lambda i, _r=r: variant_attention(q, *caches[i], k, v, p, n, scale, rope, merge_rows=_r)
            for name, call in runs.items():
                if args.variants and name not in args.variants:
                    continue
                try:
                    err = (call(0).float() - ref).abs().max().item()
                    if args.uncaptured:
                        for i in range(args.uncaptured):
                            call(i % LAYERS)
                        torch.cuda.synchronize()
                        print(f"{pos} | {n} | | {name} | {args.uncaptured} uncaptured calls | {err:.1e}", flush=True)
                        continue
                    us = us_over_layers(call)
                    print(f"{pos} | {n} | {keys_floor_us(pos, bw):.1f} | {name} | {us:.1f} | {err:.1e}", flush=True)
                except Exception as e:  # a variant this Triton cannot build is reported, the rest still run
                    print(f"{pos} | {n} | | {name} | failed: {type(e).__name__}: {' / '.join(str(e).splitlines()[-8:])[:900]}", flush=True)
        del caches
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
