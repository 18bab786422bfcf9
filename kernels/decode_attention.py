"""Split-KV attention of a few new tokens per row over a static cache (flash-decoding), in Triton.

The decode step (1 token) and the verify step (k + 1 tokens) of ``models/static_target.py`` attend over a cache
``[B, Hkv, C, D]`` whose slot p holds position p. Two cuBLAS products and a softmax read the whole capacity C
and write fp32 scores between them; this reads each visible key once, in one pass:

    pass 1 (grid: splits x B*Hkv): each program takes one KV head's query rows (the G heads of its group x n tokens,
            ``[M = G*n, D]``), a split of the keys, and keeps an online softmax over the keys it sees: unnormalised
            output, running max and sum, in fp32.
    pass 2 (grid: B*Hkv x M):      merges the splits of each row.

Splits past a row's newest position exit at once, so a step costs what the row's length needs, not the capacity.
The grid depends only on (B, Hkv, C): one CUDA graph per step shape keeps working as lengths grow.

Visibility (the repo's one convention, ``kernels.attention.aligned_visible``): row b's token t sits at position
``pos[b] + t`` and sees the keys at positions ``<=`` its own and, with a window W, ``> pos - W`` (W keys, itself
included: Hugging Face's ``sliding_window``). Query rows are ordered (head in group, token): row = g * n + t.

Triton is public API here (``triton.jit``, ``triton.language``); where it cannot be imported the caller falls back
to the two-product path and says so once (``available``).
"""

from __future__ import annotations

import functools
import math

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU wheels of torch come without Triton: the two-product path runs instead
    triton = tl = None


LOG2E = 1.4426950408889634
BLOCK_N = 64  # keys per tile


def available() -> bool:
    return triton is not None


if triton is not None:

    @triton.jit
    def _split_kernel(Q, K, V, KN, VN, POS, OP, MP, LP,
                      sq_b, sq_h, sq_m, sk_b, sk_h, sk_c, sv_b, sv_h, sv_c, skn_b, skn_h, skn_t, svn_b, svn_h, svn_t,
                      so_b, so_h, so_s, so_m, sm_b, sm_h, sm_s,
                      num_kv_heads, rows, n_tokens, capacity, window, qk_scale, split_size,
                      D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TILES: tl.constexpr,
                      BLOCK_T: tl.constexpr, HAS_NEW: tl.constexpr, HAS_WINDOW: tl.constexpr, IEEE: tl.constexpr):
        split = tl.program_id(0)
        bh = tl.program_id(1)
        b = bh // num_kv_heads
        h = bh % num_kv_heads
        pos0 = tl.load(POS + b)
        offs_m = tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, D)
        q_pos = pos0 + offs_m % n_tokens  # [M] each row's own position
        last = pos0 + n_tokens - 1  # the newest key any row sees
        start = split * split_size
        end = tl.minimum(tl.minimum(start + split_size, last + 1), capacity)
        q = tl.load(Q + b * sq_b + h * sq_h + offs_m[:, None] * sq_m + offs_d[None, :], mask=offs_m[:, None] < rows, other=0.0)
        if HAS_NEW:  # the new tokens' keys/values come as KN/VN: split 0 writes them into the cache, every split reads them
            # from KN/VN (never from the cache slots being written), so no kernel of its own writes the cache first
            if split == 0:
                offs_t = tl.arange(0, BLOCK_T)
                new = offs_t[:, None] < n_tokens
                kn = tl.load(KN + b * skn_b + h * skn_h + offs_t[:, None] * skn_t + offs_d[None, :], mask=new, other=0.0)
                vn = tl.load(VN + b * svn_b + h * svn_h + offs_t[:, None] * svn_t + offs_d[None, :], mask=new, other=0.0)
                tl.store(K + b * sk_b + h * sk_h + (pos0 + offs_t)[:, None] * sk_c + offs_d[None, :], kn, mask=new)
                tl.store(V + b * sv_b + h * sv_h + (pos0 + offs_t)[:, None] * sv_c + offs_d[None, :], vn, mask=new)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        # a fixed tile count per split (compiled once per capacity; Triton 3.6's interpreter, which the CPU tests run,
        # cannot loop to a runtime bound under numpy 2.4); tiles past the row's newest key or before its window load
        # nothing (masked loads issue no reads)
        for i in range(TILES):
            offs_n = start + i * BLOCK_N + tl.arange(0, BLOCK_N)
            in_range = offs_n < end
            if HAS_WINDOW:
                in_range = in_range & (offs_n > pos0 - window)
            if HAS_NEW:
                cached = (in_range & (offs_n < pos0))[:, None]
                fresh = (in_range & (offs_n >= pos0))[:, None]
                t = (offs_n - pos0)[:, None]
                k = tl.load(K + b * sk_b + h * sk_h + offs_n[:, None] * sk_c + offs_d[None, :], mask=cached, other=0.0) + \
                    tl.load(KN + b * skn_b + h * skn_h + t * skn_t + offs_d[None, :], mask=fresh, other=0.0)
                v = tl.load(V + b * sv_b + h * sv_h + offs_n[:, None] * sv_c + offs_d[None, :], mask=cached, other=0.0) + \
                    tl.load(VN + b * svn_b + h * svn_h + t * svn_t + offs_d[None, :], mask=fresh, other=0.0)
            else:
                k = tl.load(K + b * sk_b + h * sk_h + offs_n[:, None] * sk_c + offs_d[None, :], mask=in_range[:, None], other=0.0)
                v = tl.load(V + b * sv_b + h * sv_h + offs_n[:, None] * sv_c + offs_d[None, :], mask=in_range[:, None], other=0.0)
            if IEEE:
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = s * qk_scale  # log2 domain: softmax via exp2
            visible = in_range[None, :] & (offs_n[None, :] <= q_pos[:, None])
            if HAS_WINDOW:
                visible = visible & (offs_n[None, :] > q_pos[:, None] - window)
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet stays at zero
            p = tl.math.exp2(s - m_safe[:, None])
            alpha = tl.math.exp2(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            if IEEE:
                acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        base = b * so_b + h * so_h + split * so_s
        tl.store(OP + base + offs_m[:, None] * so_m + offs_d[None, :], acc, mask=offs_m[:, None] < rows)
        stat = b * sm_b + h * sm_h + split * sm_s + offs_m
        tl.store(MP + stat, m_i, mask=offs_m < rows)
        tl.store(LP + stat, l_i, mask=offs_m < rows)

    @triton.jit
    def _merge_kernel(OP, MP, LP, OUT, num_kv_heads, splits,
                      so_b, so_h, so_s, so_m, sm_b, sm_h, sm_s, sout_b, sout_h, sout_m,
                      D: tl.constexpr, SPLITS: tl.constexpr):
        bh = tl.program_id(0)
        row = tl.program_id(1)
        b = bh // num_kv_heads
        h = bh % num_kv_heads
        offs_s = tl.arange(0, SPLITS)
        offs_d = tl.arange(0, D)
        used = offs_s < splits
        stat = b * sm_b + h * sm_h + offs_s * sm_s + row
        m = tl.load(MP + stat, mask=used, other=float("-inf"))
        l = tl.load(LP + stat, mask=used, other=0.0)
        m_max = tl.max(m, 0)  # finite: every row sees at least its own key
        w = tl.math.exp2(m - m_max)  # 0 for splits the row saw nothing of
        o = tl.load(OP + b * so_b + h * so_h + offs_s[:, None] * so_s + row * so_m + offs_d[None, :], mask=used[:, None], other=0.0)
        out = tl.sum(o * w[:, None], 0) / tl.sum(l * w, 0)
        tl.store(OUT + b * sout_b + h * sout_h + row * sout_m + offs_d, out.to(OUT.dtype.element_ty))


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count if torch.cuda.is_available() else 16


def split_size(capacity: int, programs_per_split: int, device: torch.device) -> int:
    """Keys per split: enough splits for about four programs per SM (at most 128 splits), whole tiles."""
    sms = _num_sms(device.index or 0) if device.type == "cuda" else 16
    splits = max(1, min(128, math.ceil(4 * sms / programs_per_split)))
    return BLOCK_N * max(1, math.ceil(capacity / splits / BLOCK_N))


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor, n_tokens: int,
                     scale: float, window: int | None = None, k_new: torch.Tensor | None = None,
                     v_new: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of ``n_tokens`` new tokens per row over the cache, split over the keys.

    q [B, Hkv, G*n, D] (rows (g, t), token t at position ``pos[b] + t``), k/v caches [B, Hkv, C, D] (slot = position),
    pos [B] int64 on the device. The new tokens' keys/values are either already in the cache or given as ``k_new`` /
    ``v_new`` [B, Hkv, n, D]: then the kernel writes them into the cache itself (two launches per layer fewer than
    separate scatters). Returns [B, Hkv, G*n, D] in q's dtype.
    """
    b, hkv, rows, d = q.shape
    capacity = k_cache.shape[2]
    has_new = k_new is not None
    k_new = k_cache if k_new is None else k_new  # unused when not has_new (any tensor with strides)
    v_new = v_cache if v_new is None else v_new
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1 or q.stride(-1) != 1 or k_new.stride(-1) != 1 or v_new.stride(-1) != 1:
        raise ValueError("decode_attention: the head dimension must be contiguous in q and the caches")
    if d & (d - 1) or rows % n_tokens:
        raise ValueError(f"decode_attention: head_dim {d} (a power of two expected), {rows} query rows for {n_tokens} tokens")
    size = split_size(capacity, b * hkv, q.device)
    splits = math.ceil(capacity / size)
    o_part = torch.empty(b, hkv, splits, rows, d, dtype=torch.float32, device=q.device)
    m_part = torch.empty(b, hkv, splits, rows, dtype=torch.float32, device=q.device)
    l_part = torch.empty_like(m_part)
    out = torch.empty_like(q)
    block_m = max(16, triton.next_power_of_2(rows))
    _split_kernel[(splits, b * hkv)](
        q, k_cache, v_cache, k_new, v_new, pos, o_part, m_part, l_part,
        q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), k_new.stride(0), k_new.stride(1), k_new.stride(2),
        v_new.stride(0), v_new.stride(1), v_new.stride(2),
        o_part.stride(0), o_part.stride(1), o_part.stride(2), o_part.stride(3), m_part.stride(0), m_part.stride(1), m_part.stride(2),
        hkv, rows, n_tokens, capacity, window or 0, scale * LOG2E, size,
        D=d, BLOCK_M=block_m, BLOCK_N=BLOCK_N, TILES=size // BLOCK_N,
        BLOCK_T=max(16, triton.next_power_of_2(n_tokens)), HAS_NEW=has_new, HAS_WINDOW=window is not None, IEEE=q.dtype == torch.float32,
        num_warps=4, num_stages=2)
    _merge_kernel[(b * hkv, rows)](
        o_part, m_part, l_part, out, hkv, splits,
        o_part.stride(0), o_part.stride(1), o_part.stride(2), o_part.stride(3), m_part.stride(0), m_part.stride(1), m_part.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        D=d, SPLITS=triton.next_power_of_2(splits), num_warps=4)
    return out
