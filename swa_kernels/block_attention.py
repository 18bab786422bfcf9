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

Triton is public API here (``triton.jit``, ``triton.language``); without it (CPU torch wheels) the drafter keeps the
two-product path (``available``).
"""

from __future__ import annotations

import math

import torch

from swa_kernels.decode_attention import BLOCK_N, LOG2E, available, merge_splits, pass1_grid, split_size
from swa_kernels.decode_attention import triton, tl

if triton is not None:
    from swa_kernels.decode_attention import _attend

    @triton.jit
    def _block_split_kernel(Q, K, V, SLOT_POS, ANCHOR, OP, MP, LP,
                            sq_b, sq_t, sq_h, sk_b, sk_h, sk_c, sv_b, sv_h, sv_c, sp_b,
                            so_b, so_h, so_s, so_m, sm_b, sm_h, sm_s,
                            num_kv_heads, groups, rows, n_slots, context_slots, window, qk_scale, split_size,
                            D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TILES: tl.constexpr,
                            CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, IEEE: tl.constexpr,
                            LOADS_BY_SLOTS: tl.constexpr):
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
        q_t = offs_m % n_slots  # row m = (head in group g, slot t)
        q_pos = anchor + q_t
        live = offs_m < rows
        q = tl.load(Q + b * sq_b + q_t[:, None] * sq_t + (h * groups + offs_m // n_slots)[:, None] * sq_h + offs_d[None, :],
                    mask=live[:, None], other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        keys = context_slots + n_slots
        # a fixed tile count per split (compiled once per cache shape; Triton's interpreter, which the CPU tests run,
        # cannot loop to a runtime bound under numpy 2.4)
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
                            keys_per_split: int | None) -> torch.Tensor:
        return _launch(q, k_cache, v_cache, slot_pos, anchor, scale, causal, window, keys_per_split)

    @_block_attention_op.register_fake
    def _(q, k_cache, v_cache, slot_pos, anchor, scale, causal, window, keys_per_split):
        return q.new_empty(q.shape)


def block_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_pos: torch.Tensor,
                    anchor: torch.Tensor, scale: float, causal: bool, window: int | None,
                    keys_per_split: int | None = None) -> torch.Tensor:
    """Attention of a DFlash block's n query slots over a static drafter cache, split over the keys.

    Args:
        q: [B, n, Hq, D] the block's queries (normed and rotated; the head dimension contiguous, views are fine).
        k_cache, v_cache: [B, Hkv, S + b, D] (b >= n): S context slots, then the block's keys in slots S .. S+n-1.
        slot_pos: [B, S] int64, the position each context slot holds (-1: empty).
        anchor: [B] int64, the block's anchor; query and block key t sit at ``anchor + t``.
        scale: the softmax scale (``head_dim ** -0.5``).
        causal, window: the layer's rule (``models.dflash.LayerAttention``): in-block causality; W keys visible
            including the query (None: all).
        keys_per_split: slots per program of pass 1 (rounded up to whole tiles); default ``decode_attention.split_size``'s
            rule (``benchmarks/block_attention.py`` times others).

    Returns:
        [B, n, Hq, D] in q's dtype, the layout ``o_proj`` reads.
    """
    if not available():
        raise ValueError("block_attention needs Triton (pip install triton); the drafter's 'products' path runs without it")
    return torch.ops.swa_drafters.dflash_block_attention(q, k_cache, v_cache, slot_pos, anchor, scale, causal, window,
                                                         keys_per_split)


def _launch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_pos: torch.Tensor, anchor: torch.Tensor,
            scale: float, causal: bool, window: int | None, keys_per_split: int | None, num_warps: int = 4,
            num_stages: int = 2, loads_by_slots: bool = False, equal_splits: bool = True) -> torch.Tensor:
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
    if d & (d - 1):
        raise ValueError(f"block_attention: head_dim {d}; a power of two expected")
    groups = hq // hkv
    rows = groups * n
    keys = context_slots + n
    if keys_per_split is None:
        size = split_size(keys, bsz * hkv, q.device, rows, equal_splits=equal_splits)
    else:
        size = BLOCK_N * max(1, math.ceil(keys_per_split / BLOCK_N))
    splits = math.ceil(keys / size)
    o_part = torch.empty(bsz, hkv, splits, rows, d, dtype=torch.float32, device=q.device)
    m_part = torch.empty(bsz, hkv, splits, rows, dtype=torch.float32, device=q.device)
    l_part = torch.empty_like(m_part)
    out = torch.empty(bsz, n, hq, d, dtype=q.dtype, device=q.device)
    _block_split_kernel[pass1_grid(bsz * hkv, splits)](
        q, k_cache, v_cache, slot_pos, anchor, o_part, m_part, l_part,
        q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), slot_pos.stride(0),
        o_part.stride(0), o_part.stride(1), o_part.stride(2), o_part.stride(3), m_part.stride(0), m_part.stride(1), m_part.stride(2),
        hkv, groups, rows, n, context_slots, window or 0, scale * LOG2E, size,
        D=d, BLOCK_M=max(16, triton.next_power_of_2(rows)), BLOCK_N=BLOCK_N, TILES=size // BLOCK_N,
        CAUSAL=causal, HAS_WINDOW=window is not None, IEEE=q.dtype == torch.float32, LOADS_BY_SLOTS=loads_by_slots,
        num_warps=num_warps, num_stages=num_stages)
    # out [B, n, Hq, D]: row (g, t) of KV head h is head h * G + g, token t
    merge_splits(o_part, m_part, l_part, out, n, (out.stride(0), groups * out.stride(2), out.stride(2), out.stride(1)))
    return out
