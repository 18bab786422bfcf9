"""DFlash's block attention over the static drafter's cache, split over the keys, in Triton (flash-decoding).

A DFlash block pass (``models.dflash.StaticDFlashDrafter``) attends, in every layer, from the block's n query slots to
the layer's cache ``[B, Hkv, S + block, D]``: S context slots, each holding the position ``slot_pos[b, j]`` (-1: empty;
a sliding layer's ring holds position p in slot p mod S), then the block's own keys in the scratch slots S .. S+n-1
(slot S + j: position ``anchor + j``). The two-product path (``swa_kernels.attention.grouped_attention`` over a mask built
from the slot positions) runs four kernels a layer and writes fp32 scores between them; at the Qwen3-8B shape with 16
slots that was ~16 µs of a layer's ~200 (H200 profile, BENCHMARKS.md "DFlash's whole block with the 152K head"). This
reads each visible key once:

    pass 1 (grid: B*Hkv x splits, ``decode_attention.pass1_grid``): one KV head's query rows (the G heads of its group x
            n slots, ``[M = G*n, D]``) over a split of the S + n slots, an online softmax in fp32
            (``decode_attention._attend``); which keys a row sees comes from the slot positions, computed in the kernel
            (no mask tensor);
    pass 2 (grid: B*Hkv x M): ``decode_attention.merge_splits`` merges the splits of each row and writes it as
            ``[B, n, Hq, D]``, the layout the output projection reads (no transpose copy after it).

Visibility, the repo's one rule (``swa_kernels.attention.aligned_visible``, the window counting the query itself: W keys):
query slot t sits at ``anchor + t``; a context slot is a key if it holds a position in ``[0, anchor)`` (later ones are
rejected drafts not yet written over), then ``aligned_visible(anchor + t, position, causal, window)`` decides, as
``models.dflash.block_visible`` does for the mask of the two-product path. Every slot up to the block's last is read
(the caches hold finite values: zeros, or positions written earlier) and what no row sees is masked in the scores:
masking the loads by the slot positions made each tile's key and value loads wait on its slot-position load (H200, one
layer at 8K: 13.9 -> 12.3 µs a sliding layer, 24.4 -> 21.7 a full one; ``benchmarks/block_attention.py``,
``slot_loads``). Query rows are ordered (head in group, slot): row = g * n + t, head h * G + g.

The drafter hands the block's projections over raw (``k_new``, ``v_new``, ``rope``), as the target's verify does
(``decode_attention``): each program norms and rotates its query rows, and the split holding the first scratch slot
(the last live one) norms and rotates the block's own keys and attends to them; the scratch slots are then neither
written nor read, and the three kernels a layer that did this before the attention are gone.

Triton is public API here (``triton.jit``, ``triton.language``); without it (CPU torch wheels) the drafter keeps the
two-product path (``available``).
"""

from __future__ import annotations

import math

import torch

from swa_kernels.decode_attention import BLOCK_N, LOG2E, Rope, available, merge_splits, pass1_grid, split_size
from swa_kernels.decode_attention import triton, tl

if triton is not None:
    from swa_kernels.decode_attention import _attend, _new_keys, _norm_rope

    @triton.jit
    def _block_split_kernel(Q, K, V, KN, VN, SLOT_POS, ANCHOR, OP, MP, LP, COS, SIN, QW, KW,
                            sq_b, sq_t, sq_h, sk_b, sk_h, sk_c, sv_b, sv_h, sv_c, skn_b, skn_t, skn_h, svn_b, svn_t, svn_h,
                            sp_b, so_b, so_h, so_s, so_m, sm_b, sm_h, sm_s, s_cos,
                            num_kv_heads, groups, rows, n_slots, context_slots, window, qk_scale, split_size, eps,
                            tile_splits, new_split,
                            D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TILES: tl.constexpr,
                            BLOCK_T: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, IEEE: tl.constexpr,
                            LOADS_BY_SLOTS: tl.constexpr, HAS_NEW: tl.constexpr, ROTATE: tl.constexpr,
                            HAS_NORM: tl.constexpr):
        bh = tl.program_id(0)  # the grid is (B*Hkv, splits): decode_attention.pass1_grid says why
        split = tl.program_id(1)
        b = bh // num_kv_heads
        h = bh % num_kv_heads
        # fp32 whatever the launcher typed it as (under torch.compile a Python float argument arrived as fp64, which
        # turned the online softmax's statistics fp64)
        qk_scale = tl.cast(qk_scale, tl.float32)
        anchor = tl.load(ANCHOR + b)
        offs_m = tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, D)
        half = (offs_d + D // 2) % D  # rotate_half's partner of each element
        sign = tl.where(offs_d < D // 2, -1.0, 1.0)[None, :]
        DTYPE = Q.dtype.element_ty
        q_t = offs_m % n_slots  # row m = (head in group g, slot t)
        q_pos = anchor + q_t
        live = offs_m < rows
        q_row = Q + b * sq_b + q_t[:, None] * sq_t + (h * groups + offs_m // n_slots)[:, None] * sq_h
        q = tl.load(q_row + offs_d[None, :], mask=live[:, None], other=0.0)
        if ROTATE:  # raw projections in: the per-head norm and RoPE here (``decode_attention``'s, no kernels before this)
            q_cos = tl.load(COS + q_pos[:, None] * s_cos + offs_d[None, :], mask=live[:, None], other=0.0).to(tl.float32)
            q_sin = tl.load(SIN + q_pos[:, None] * s_cos + offs_d[None, :], mask=live[:, None], other=0.0).to(tl.float32)
            q_half = tl.load(q_row + half[None, :], mask=live[:, None], other=0.0).to(tl.float32)
            qw = tl.load(QW + offs_d).to(tl.float32)[None, :] if HAS_NORM else 0.0
            qw_half = tl.load(QW + half).to(tl.float32)[None, :] if HAS_NORM else 0.0
            q = _norm_rope(q.to(tl.float32), q_half, qw, qw_half, q_cos, q_sin, sign, eps, D, HAS_NORM, DTYPE)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        # HAS_NEW: the block's keys come apart (KN/VN), the cache's scratch slots are not read (nor written)
        keys = context_slots if HAS_NEW else context_slots + n_slots
        # a fixed tile count per split (compiled once per cache shape; Triton's interpreter, which the CPU tests run,
        # cannot loop to a runtime bound under numpy 2.4); the block's own split (``new_split`` past the context's
        # splits, the launcher's ``new_keys_apart``) reads no context tile
        if split < tile_splits:
            for i in range(TILES):
                offs_n = split * split_size + i * BLOCK_N + tl.arange(0, BLOCK_N)
                in_context = offs_n < context_slots
                held = tl.load(SLOT_POS + b * sp_b + offs_n, mask=in_context, other=-1)
                k_pos = tl.where(in_context, held, anchor + offs_n - context_slots)  # scratch slot S + j: position anchor + j
                is_key = tl.where(in_context, (held >= 0) & (held < anchor), offs_n < keys)
                if HAS_WINDOW:  # seen by no row: at or before anchor - W, outside the first row's window (the widest back)
                    is_key = is_key & (k_pos > anchor - window)
                # every slot up to the block's last (the module docstring); LOADS_BY_SLOTS (a benchmark's comparison): only the
                # slots holding keys, the loads waiting on the slot positions
                load = is_key if LOADS_BY_SLOTS else offs_n < keys
                k = tl.load(K + b * sk_b + h * sk_h + offs_n[:, None] * sk_c + offs_d[None, :], mask=load[:, None], other=0.0)
                v = tl.load(V + b * sv_b + h * sv_h + offs_n[:, None] * sv_c + offs_d[None, :], mask=load[:, None], other=0.0)
                visible = is_key[None, :] & (q_pos[:, None] >= 0)  # [M, N]
                if CAUSAL:
                    visible = visible & (k_pos[None, :] <= q_pos[:, None])
                if HAS_WINDOW:
                    visible = visible & (k_pos[None, :] > q_pos[:, None] - window)
                    if not CAUSAL:  # z-lab's symmetric band inside the block
                        visible = visible & (k_pos[None, :] < q_pos[:, None] + window)
                m_i, l_i, acc = _attend(q, k, v, visible, m_i, l_i, acc, qk_scale, IEEE)
        if HAS_NEW:  # the block's own keys: in a split of their own past the context's, or the one holding slot S
            if split == new_split:
                offs_t = tl.arange(0, BLOCK_T)
                new = offs_t < n_slots
                kn, vn = _new_keys(KN + b * skn_b + h * skn_h + offs_t[:, None] * skn_t,
                                   VN + b * svn_b + h * svn_h + offs_t[:, None] * svn_t, COS, SIN, KW, anchor, offs_t, new,
                                   offs_d, half, sign, s_cos, eps, D, ROTATE, HAS_NORM, DTYPE)
                # key slot j at anchor + j, query slot t at anchor + t: the rule on the slot offsets
                visible = new[None, :] & (q_pos[:, None] >= 0)
                if CAUSAL:
                    visible = visible & (offs_t[None, :] <= q_t[:, None])
                if HAS_WINDOW:
                    visible = visible & (offs_t[None, :] > q_t[:, None] - window)
                    if not CAUSAL:
                        visible = visible & (offs_t[None, :] < q_t[:, None] + window)
                m_i, l_i, acc = _attend(q, kn, vn, visible, m_i, l_i, acc, qk_scale, IEEE)
        base = b * so_b + h * so_h + split * so_s
        seen = m_i > float("-inf")  # a row that saw no key here writes no partial (the merge weighs it 0 and reads none)
        tl.store(OP + base + offs_m[:, None] * so_m + offs_d[None, :], acc, mask=live[:, None] & seen[:, None])
        stat = b * sm_b + h * sm_h + split * sm_s + offs_m
        tl.store(MP + stat, m_i, mask=live)
        tl.store(LP + stat, l_i, mask=live)


if triton is not None:

    # An opaque op to torch.compile (as swa_kernels/skinny_gemm.py's): its graph calls it and CUDA graphs capture the launches.
    # Traced as a user-defined Triton kernel instead, inductor's scheduler failed on drafters whose layers attend right
    # after writing their block's keys into the caches (KeyError in compute_ancestors, torch 2.11, H200: the tiny
    # two-layer drafters of tests/test_static_drafters.py; the 8B-shape drafter compiled)
    @torch.library.custom_op("swa_drafters::dflash_block_attention", mutates_args=())
    def _block_attention_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_pos: torch.Tensor,
                            anchor: torch.Tensor, scale: float, causal: bool, window: int | None,
                            keys_per_split: int | None, k_new: torch.Tensor | None, v_new: torch.Tensor | None,
                            cos: torch.Tensor | None, sin: torch.Tensor | None, q_norm: torch.Tensor | None,
                            k_norm: torch.Tensor | None, eps: float) -> torch.Tensor:
        rope = None if cos is None else Rope(cos, sin, q_norm, k_norm, eps)
        return _launch(q, k_cache, v_cache, slot_pos, anchor, scale, causal, window, keys_per_split, k_new=k_new, v_new=v_new,
                       rope=rope)

    @_block_attention_op.register_fake
    def _(q, k_cache, v_cache, slot_pos, anchor, scale, causal, window, keys_per_split, k_new, v_new, cos, sin, q_norm,
          k_norm, eps):
        return q.new_empty(q.shape)


def block_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_pos: torch.Tensor,
                    anchor: torch.Tensor, scale: float, causal: bool, window: int | None,
                    keys_per_split: int | None = None, k_new: torch.Tensor | None = None, v_new: torch.Tensor | None = None,
                    rope: Rope | None = None) -> torch.Tensor:
    """Attention of a DFlash block's n query slots over a static drafter cache, split over the keys.

    Args:
        q: [B, n, Hq, D] the block's queries (normed and rotated, or raw with ``rope``; the head dimension contiguous,
            views are fine).
        k_cache, v_cache: [B, Hkv, S + b, D] (b >= n): S context slots, then the block's keys in slots S .. S+n-1
            (without ``k_new``).
        slot_pos: [B, S] int64, the position each context slot holds (-1: empty).
        anchor: [B] int64, the block's anchor; query and block key t sit at ``anchor + t``.
        scale: the softmax scale (``head_dim ** -0.5``).
        causal, window: the layer's rule (``models.dflash.LayerAttention``): in-block causality; W keys visible
            including the query (None: all).
        keys_per_split: slots per program of pass 1 (rounded up to whole tiles); default ``decode_attention.split_size``'s
            rule (``benchmarks/block_attention.py`` times others).
        k_new, v_new: [B, n, Hkv, D] the block's own keys and values apart (views of the fused projection are fine): the
            cache's scratch slots are then neither read nor written (the split holding slot S attends to them).
        rope: ``decode_attention.Rope``: q and k_new come raw and get the per-head norm and RoPE here (at
            ``anchor + t``), as ``decode_attention`` does for the target; needs k_new.

    Returns:
        [B, n, Hq, D] in q's dtype, the layout ``o_proj`` reads.
    """
    if not available():
        raise ValueError("block_attention needs Triton (pip install triton); the drafter's 'products' path runs without it")
    if (k_new is None) != (v_new is None) or (rope is not None and k_new is None):
        raise ValueError("block_attention: k_new and v_new come together, and rope needs them")
    return torch.ops.swa_drafters.dflash_block_attention(
        q, k_cache, v_cache, slot_pos, anchor, scale, causal, window, keys_per_split, k_new, v_new,
        *((rope.cos, rope.sin, rope.q_norm, rope.k_norm, rope.eps) if rope is not None else (None, None, None, None, 0.0)))


def _launch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_pos: torch.Tensor, anchor: torch.Tensor,
            scale: float, causal: bool, window: int | None, keys_per_split: int | None, num_warps: int = 4,
            num_stages: int = 2, loads_by_slots: bool = False, equal_splits: bool = True, k_new: torch.Tensor | None = None,
            v_new: torch.Tensor | None = None, rope: Rope | None = None, new_keys_apart: bool = True) -> torch.Tensor:
    # new_keys_apart (with k_new): the block's own keys in a split of their own after the context's splits, not in the
    # split holding the last context slots: that split, which also norms, rotates and attends to them, was the slowest
    # program (H200, one layer at 8K, ``benchmarks/block_attention.py --raw``, ``new_keys_in_last_split`` times it)
    # num_warps / num_stages: pass 1's launch (``benchmarks/block_attention.py --warps --stages`` times others);
    # loads_by_slots: see the kernel. equal_splits: the split rule's one wave at one program an SM
    # (``decode_attention.split_size``): every split of this kernel loops the same tile count, so none is light enough to
    # share an SM behind a full one (H200, one layer at 8K: 14.2 -> 13.9 µs a sliding layer, 25.2 -> 24.4 a full one;
    # ``benchmarks/block_attention.py``, ``ceil_wave``, times the rule before)
    bsz, n, hq, d = q.shape
    hkv, slots_total = k_cache.shape[1], k_cache.shape[2]
    context_slots = slot_pos.shape[1]
    if k_cache.shape[0] != bsz or slot_pos.shape[0] != bsz or anchor.shape != (bsz,):
        raise ValueError(f"block_attention: {bsz} query rows against caches of {k_cache.shape[0]}, slot positions of "
                         f"{slot_pos.shape[0]} and anchors {tuple(anchor.shape)}")
    if not context_slots + n <= slots_total:
        raise ValueError(f"block_attention: {context_slots} context slots + {n} block slots exceed the cache's {slots_total}")
    if hq % hkv:
        raise ValueError(f"block_attention: {hq} query heads are not a multiple of {hkv} KV heads")
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1 or slot_pos.stride(-1) != 1:
        raise ValueError("block_attention: the head dimension (and the slot positions) must be contiguous")
    has_new = k_new is not None
    if has_new and (k_new.shape != (bsz, n, hkv, d) or v_new.shape != (bsz, n, hkv, d) or k_new.stride(-1) != 1
                    or v_new.stride(-1) != 1):
        raise ValueError(f"block_attention: k_new {tuple(k_new.shape)}, v_new {tuple(v_new.shape)}; expected "
                         f"[{bsz}, {n}, {hkv}, {d}] with the head dimension contiguous")
    if d & (d - 1):
        raise ValueError(f"block_attention: head_dim {d}; a power of two expected")
    groups = hq // hkv
    rows = groups * n
    keys = context_slots + n
    apart = has_new and new_keys_apart
    split_keys = context_slots if apart else keys  # the keys the equal splits share
    if keys_per_split is None:
        size = split_size(split_keys, bsz * hkv, q.device, rows, equal_splits=equal_splits, reserved=int(apart))
    else:
        size = BLOCK_N * max(1, math.ceil(keys_per_split / BLOCK_N))
    tile_splits = math.ceil(split_keys / size)
    splits, new_split = (tile_splits + 1, tile_splits) if apart else (tile_splits, context_slots // size)
    o_part = torch.empty(bsz, hkv, splits, rows, d, dtype=torch.float32, device=q.device)
    m_part = torch.empty(bsz, hkv, splits, rows, dtype=torch.float32, device=q.device)
    l_part = torch.empty_like(m_part)
    out = torch.empty(bsz, n, hq, d, dtype=q.dtype, device=q.device)
    kn, vn = (k_new, v_new) if has_new else (k_cache, v_cache)  # unused without the new keys apart
    cos, sin = (rope.cos, rope.sin) if rope is not None else (q, q)
    has_norm = rope is not None and rope.q_norm is not None
    q_w, k_w = (rope.q_norm, rope.k_norm) if has_norm else (q, q)
    kn_strides = (kn.stride(0), kn.stride(1), kn.stride(2)) if has_new else (0, 0, 0)
    vn_strides = (vn.stride(0), vn.stride(1), vn.stride(2)) if has_new else (0, 0, 0)
    _block_split_kernel[pass1_grid(bsz * hkv, splits)](
        q, k_cache, v_cache, kn, vn, slot_pos, anchor, o_part, m_part, l_part, cos, sin, q_w, k_w,
        q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), *kn_strides, *vn_strides, slot_pos.stride(0),
        o_part.stride(0), o_part.stride(1), o_part.stride(2), o_part.stride(3), m_part.stride(0), m_part.stride(1), m_part.stride(2),
        cos.stride(0), hkv, groups, rows, n, context_slots, window or 0, scale * LOG2E, size,
        rope.eps if rope is not None else 0.0, tile_splits, new_split,
        D=d, BLOCK_M=max(16, triton.next_power_of_2(rows)), BLOCK_N=BLOCK_N, TILES=size // BLOCK_N,
        BLOCK_T=max(16, triton.next_power_of_2(n)), CAUSAL=causal, HAS_WINDOW=window is not None,
        IEEE=q.dtype == torch.float32, LOADS_BY_SLOTS=loads_by_slots, HAS_NEW=has_new, ROTATE=rope is not None,
        HAS_NORM=has_norm, num_warps=num_warps, num_stages=num_stages)
    # out [B, n, Hq, D]: row (g, t) of KV head h is head h * G + g, token t
    merge_splits(o_part, m_part, l_part, out, n, (out.stride(0), groups * out.stride(2), out.stride(2), out.stride(1)))
    return out
