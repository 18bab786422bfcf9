"""Split-KV attention of a few new tokens per row over a static cache (flash-decoding), in Triton.

The decode step (1 token) and the verify step (k + 1 tokens) of ``models/static_target.py`` attend over a cache
``[B, Hkv, C, D]`` whose slot p holds position p. Two cuBLAS products and a softmax read the whole capacity C
and write fp32 scores between them; this reads each visible key once, in one pass:

    pass 1 (grid: B*Hkv x splits): each program takes one KV head's query rows (the G heads of its group x n tokens,
            ``[M = G*n, D]``), a split of the keys, and keeps an online softmax over the keys it sees: unnormalised
            output, running max and sum, in fp32. Programs launch split by split (``pass1_grid``).
    pass 2 (grid: B*Hkv x M):      merges the splits of each row.

Tiles past a row's newest position load nothing (masked loads issue no reads), so a step reads what the row's
length needs, not the capacity. The grid depends only on (B, Hkv, C): one CUDA graph per step shape keeps working as
lengths grow.

The new tokens' keys/values may come apart from the cache (``k_new``/``v_new``): the split holding the row's first
new position writes them into the cache and attends to them after its own tiles, no split reads those slots, so no
separate scatter kernel runs first. That split holds the fewest cached keys of the live ones (they end at the new
position) and, on a GPU, runs only its live tiles, so the extra work no longer lengthens the kernel as it did on split
0, a full one (H200, Qwen3-8B shape, with the output layout below: the DFlash loop +1.7-2.0% at 1K and 8K, the 16-token
forward at 32K 6.35-6.50 -> 6.28-6.41 ms; BENCHMARKS.md "A verify's attention: new keys in the lightest split"). With ``rope`` the
projections come raw, as the fused q/k/v matrix writes them: Qwen3's per-head RMSNorm (if any) and RoPE are applied
here, to q in every program and to the new keys in that split (two kernels per layer fewer), and the output comes in
q's layout, ``[B, n, Hq, D]``, the one o_proj reads (no transpose kernel after).

Visibility (the repo's one convention, ``swa_kernels.attention.aligned_visible``): row b's token t sits at position
``pos[b] + t`` and sees the keys at positions ``<=`` its own and, with a window W, ``> pos - W`` (W keys, itself
included: Hugging Face's ``sliding_window``). Query rows are ordered (head in group, token): row = g * n + t.

Triton is public API here (``triton.jit``, ``triton.language``); where it cannot be imported the caller falls back
to the two-product path and says so once (``available``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU wheels of torch come without Triton: the two-product path runs instead
    triton = tl = None


LOG2E = 1.4426950408889634
BLOCK_N = 64  # keys per tile


@dataclass(frozen=True)
class Tiling:
    """Pass 1's launch: keys per tile, warps, pipelined loads (``benchmarks/attention_tilings.py`` times the choices)."""

    block_n: int = BLOCK_N
    num_warps: int = 4
    num_stages: int = 2


# Pass 1's tiling by query rows per KV head (H200, 36 calls captured, µs per call at 1K / 8K / 32K;
# benchmarks/attention_tilings.py): a one-token step (4 rows at Qwen3-8B) 6.3 / 12.3 / 39.8 with two stages in flight,
# 6.1 / 12.1 / 42.6 with three; a 16-token verify (64 rows), whose tiles do 16x the arithmetic over the same keys,
# 9.0 / 21.7 / 55.7 with two, 9.0 / 21.0 / 52.1 with three (wider tiles and more warps were slower at both)
FEW_ROWS = Tiling(num_stages=2)
MANY_ROWS = Tiling(num_stages=3)
MANY_ROWS_FROM = 64  # query rows per KV head: the measured verify; fewer rows keep FEW_ROWS
TILING: Tiling | None = None  # a benchmark's override of the rule above (split sizes stay whole tiles of its block_n)
LIVE_TILES: bool | None = None  # a test's override of ``live_tiles`` (False: every split loops its fixed tile count)


@functools.cache
def _hopper(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] == 9


def tiling_for(rows: int, device: torch.device) -> Tiling:
    """Pass 1's tiling for ``rows`` query rows per KV head. Three stages only where they were measured, Hopper (228 KB of
    shared memory per SM; at head_dim 128 three stages of key and value tiles and the query rows take ~112 KB, more
    than the ~100 KB a block gets on consumer GPUs): elsewhere every step keeps the two-stage tiling."""
    if TILING is not None:
        return TILING
    many = rows >= MANY_ROWS_FROM and device.type == "cuda" and _hopper(device.index if device.index is not None else torch.cuda.current_device())
    return MANY_ROWS if many else FEW_ROWS


@dataclass(frozen=True)
class Rope:
    """What the kernel applies to raw q/k projections: RoPE tables cos/sin [C, D] (row = position, Hugging Face's
    rotate_half layout, in the model's dtype), Qwen3's per-head RMSNorm weights [D] (None: Llama, no norm) and its eps."""

    cos: torch.Tensor
    sin: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    eps: float


def available() -> bool:
    return triton is not None


def takes_head_dim(head_dim: int) -> bool:
    """The split-KV kernels (this one and ``block_attention``) take power-of-two head dims of at least 16: ``tl.arange``
    over it and ``tl.dot`` on a GPU."""
    return head_dim >= 16 and not head_dim & (head_dim - 1)


# Triton's interpreter loops to a runtime bound from 3.9 (3.6's calls ``int()`` on a numpy array in ``range()`` under
# numpy 2.4), so there the CPU tests run the GPU's loop
INTERPRETER_LIVE_TILES = triton is not None and tuple(int(p) for p in triton.__version__.split(".")[:2]) >= (3, 9)


def live_tiles(device: torch.device) -> bool:
    """Whether pass 1 loops only over a split's tiles that hold keys (a runtime bound) rather than a fixed count: on a GPU,
    and in an interpreter that can (``INTERPRETER_LIVE_TILES``)."""
    if LIVE_TILES is not None:
        return LIVE_TILES
    return device.type == "cuda" or INTERPRETER_LIVE_TILES


if triton is not None:

    @triton.jit
    def _norm_rope(x, partner, w, w_partner, cos, sin, sign, eps, D: tl.constexpr, HAS_NORM: tl.constexpr, DTYPE: tl.constexpr):
        """Rows x [R, D] (fp32) -> Qwen3's per-head RMSNorm (if any) then RoPE, as Hugging Face rounds them: the normed
        value and its product with the weight in the model's dtype, the rotation in fp32 rounded once. ``partner`` holds
        x[(d + D/2) % D] (rotate_half's other half), ``sign`` -1 for the first half, +1 for the second."""
        if HAS_NORM:
            r = tl.math.rsqrt(tl.sum(x * x, 1) / D + eps)[:, None]
            x = ((x * r).to(DTYPE).to(tl.float32) * w).to(DTYPE).to(tl.float32)
            partner = ((partner * r).to(DTYPE).to(tl.float32) * w_partner).to(DTYPE).to(tl.float32)
        return (x * cos + sign * partner * sin).to(DTYPE)

    @triton.jit
    def _new_keys(kn_row, vn_row, COS, SIN, KW, first_pos, offs_t, new, offs_d, half, sign, s_cos, eps, D: tl.constexpr,
                  ROTATE: tl.constexpr, HAS_NORM: tl.constexpr, DTYPE: tl.constexpr):
        """The new tokens' keys [T, D] (normed and rotated at ``first_pos + t`` with ROTATE; 0 past ``new``) and values,
        from their rows ``kn_row``/``vn_row`` [T, 1] pointers: the verify's (``_split_kernel``) and DFlash's block's."""
        kn = tl.load(kn_row + offs_d[None, :], mask=new[:, None], other=0.0)
        if ROTATE:
            kw = tl.load(KW + offs_d).to(tl.float32)[None, :] if HAS_NORM else 0.0
            kw_half = tl.load(KW + half).to(tl.float32)[None, :] if HAS_NORM else 0.0
            t_cos = tl.load(COS + (first_pos + offs_t)[:, None] * s_cos + offs_d[None, :], mask=new[:, None], other=0.0).to(tl.float32)
            t_sin = tl.load(SIN + (first_pos + offs_t)[:, None] * s_cos + offs_d[None, :], mask=new[:, None], other=0.0).to(tl.float32)
            kn_half = tl.load(kn_row + half[None, :], mask=new[:, None], other=0.0).to(tl.float32)
            kn = tl.where(new[:, None], _norm_rope(kn.to(tl.float32), kn_half, kw, kw_half, t_cos, t_sin, sign, eps, D,
                                                   HAS_NORM, DTYPE), 0.0).to(DTYPE)
        vn = tl.load(vn_row + offs_d[None, :], mask=new[:, None], other=0.0)
        return kn, vn

    @triton.jit
    def _attend(q, k, v, visible, m_i, l_i, acc, qk_scale, IEEE: tl.constexpr):
        """One tile of keys into the online softmax of the rows (scores in the log2 domain, fp32 statistics)."""
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(visible, s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet stays at zero
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        return m_new, l_i, acc

    @triton.jit
    def _split_kernel(Q, K, V, KN, VN, POS, OP, MP, LP, COS, SIN, QW, KW,
                      sq_b, sq_h, sq_g, sq_t, sk_b, sk_h, sk_c, sv_b, sv_h, sv_c, skn_b, skn_h, skn_t, svn_b, svn_h, svn_t,
                      so_b, so_h, so_s, so_m, sm_b, sm_h, sm_s, s_cos,
                      num_kv_heads, rows, n_tokens, capacity, window, qk_scale, split_size, eps,
                      D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TILES: tl.constexpr,
                      BLOCK_T: tl.constexpr, HAS_NEW: tl.constexpr, ROTATE: tl.constexpr, HAS_NORM: tl.constexpr,
                      HAS_WINDOW: tl.constexpr, IEEE: tl.constexpr, LIVE_TILES: tl.constexpr):
        bh = tl.program_id(0)  # the grid is (B*Hkv, splits): ``pass1_grid``
        split = tl.program_id(1)
        b = bh // num_kv_heads
        h = bh % num_kv_heads
        pos0 = tl.load(POS + b)
        offs_m = tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, D)
        half = (offs_d + D // 2) % D  # rotate_half's partner of each element
        sign = tl.where(offs_d < D // 2, -1.0, 1.0)[None, :]
        DTYPE = Q.dtype.element_ty
        q_t = offs_m % n_tokens  # row m = (head in group g, token t)
        q_pos = pos0 + q_t  # [M] each row's own position
        start = split * split_size
        # the keys this split reads from the cache: with the new keys passed apart, those before pos0 (the split holding
        # pos0 takes the new ones below); else every key up to the newest row's position
        end = tl.minimum(start + split_size, capacity)
        end = tl.minimum(end, pos0) if HAS_NEW else tl.minimum(end, pos0 + n_tokens)
        live = offs_m[:, None] < rows
        q_row = Q + b * sq_b + h * sq_h + (offs_m // n_tokens)[:, None] * sq_g + q_t[:, None] * sq_t
        q = tl.load(q_row + offs_d[None, :], mask=live, other=0.0)
        if ROTATE:  # raw projections in: the norm and RoPE here (no kernel of their own before this one)
            q_cos = tl.load(COS + q_pos[:, None] * s_cos + offs_d[None, :], mask=live, other=0.0).to(tl.float32)
            q_sin = tl.load(SIN + q_pos[:, None] * s_cos + offs_d[None, :], mask=live, other=0.0).to(tl.float32)
            q_half = tl.load(q_row + half[None, :], mask=live, other=0.0).to(tl.float32)
            qw = tl.load(QW + offs_d).to(tl.float32)[None, :] if HAS_NORM else 0.0
            qw_half = tl.load(QW + half).to(tl.float32)[None, :] if HAS_NORM else 0.0
            q = _norm_rope(q.to(tl.float32), q_half, qw, qw_half, q_cos, q_sin, sign, eps, D, HAS_NORM, DTYPE)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        # LIVE_TILES (``live_tiles``): only the tiles that hold keys before ``end``, so the split holding the newest key,
        # which takes the new keys too, runs fewer tiles than a full one and splits past it none; masked tiles load
        # nothing but still cost their products and softmax, as much as a live one at a verify's 64 rows. Else (an older
        # Triton's interpreter) a fixed count per split; either way tiles before a row's window load nothing
        if LIVE_TILES:
            tiles = tl.cdiv(tl.maximum(end - start, 0), BLOCK_N)
        else:
            tiles = TILES
        for i in range(tiles):
            offs_n = start + i * BLOCK_N + tl.arange(0, BLOCK_N)
            in_range = offs_n < end
            if HAS_WINDOW:
                in_range = in_range & (offs_n > pos0 - window)
            k = tl.load(K + b * sk_b + h * sk_h + offs_n[:, None] * sk_c + offs_d[None, :], mask=in_range[:, None], other=0.0)
            v = tl.load(V + b * sv_b + h * sv_h + offs_n[:, None] * sv_c + offs_d[None, :], mask=in_range[:, None], other=0.0)
            visible = in_range[None, :] & (offs_n[None, :] <= q_pos[:, None])
            if HAS_WINDOW:
                visible = visible & (offs_n[None, :] > q_pos[:, None] - window)
            m_i, l_i, acc = _attend(q, k, v, visible, m_i, l_i, acc, qk_scale, IEEE)
        if HAS_NEW:  # the new tokens' keys/values come as KN/VN: the split holding pos0 (normed and rotated with ROTATE)
            # writes them into the cache and attends to them; no split reads those cache slots, so no kernel of its own
            # writes them first. That split's cached keys end at pos0: the lightest live split takes the extra work
            if split == pos0 // split_size:
                offs_t = tl.arange(0, BLOCK_T)
                new = offs_t < n_tokens
                kn, vn = _new_keys(KN + b * skn_b + h * skn_h + offs_t[:, None] * skn_t,
                                   VN + b * svn_b + h * svn_h + offs_t[:, None] * svn_t, COS, SIN, KW, pos0, offs_t, new,
                                   offs_d, half, sign, s_cos, eps, D, ROTATE, HAS_NORM, DTYPE)
                tl.store(K + b * sk_b + h * sk_h + (pos0 + offs_t)[:, None] * sk_c + offs_d[None, :], kn, mask=new[:, None])
                tl.store(V + b * sv_b + h * sv_h + (pos0 + offs_t)[:, None] * sv_c + offs_d[None, :], vn, mask=new[:, None])
                visible = new[None, :] & (offs_t[None, :] <= q_t[:, None])  # causal among the new tokens
                if HAS_WINDOW:
                    visible = visible & (offs_t[None, :] > q_t[:, None] - window)
                m_i, l_i, acc = _attend(q, kn, vn, visible, m_i, l_i, acc, qk_scale, IEEE)
        base = b * so_b + h * so_h + split * so_s
        seen = m_i > float("-inf")  # a row that saw no key here writes no partial (the merge weighs it 0 and reads none)
        tl.store(OP + base + offs_m[:, None] * so_m + offs_d[None, :], acc, mask=live & seen[:, None])
        stat = b * sm_b + h * sm_h + split * sm_s + offs_m
        tl.store(MP + stat, m_i, mask=offs_m < rows)
        tl.store(LP + stat, l_i, mask=offs_m < rows)

    @triton.jit
    def _merge_kernel(OP, MP, LP, OUT, num_kv_heads, splits, n_tokens,
                      so_b, so_h, so_s, so_m, sm_b, sm_h, sm_s, sout_b, sout_h, sout_g, sout_t,
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
        seen = used & (m > float("-inf"))  # splits past the row's position wrote nothing: read nothing
        o = tl.load(OP + b * so_b + h * so_h + offs_s[:, None] * so_s + row * so_m + offs_d[None, :], mask=seen[:, None], other=0.0)
        out = tl.sum(o * w[:, None], 0) / tl.sum(l * w, 0)
        # row = (head in group g, token t), written where the caller's layout keeps it
        dst = OUT + b * sout_b + h * sout_h + (row // n_tokens) * sout_g + (row % n_tokens) * sout_t
        tl.store(dst + offs_d, out.to(OUT.dtype.element_ty))


def merge_splits(o_part: torch.Tensor, m_part: torch.Tensor, l_part: torch.Tensor, out: torch.Tensor, n_tokens: int,
                 out_strides: tuple[int, int, int, int]) -> None:
    """Pass 2: every row's splits (partials ``o_part`` [B, Hkv, S, M, D], statistics ``m_part``/``l_part`` [B, Hkv, S, M],
    rows M = (g, t) over ``n_tokens`` tokens) merged into ``out``, row (b, h, g, t) at ``b*s_b + h*s_h + g*s_g + t*s_t``
    (``out_strides`` = (s_b, s_h, s_g, s_t), in elements)."""
    b, hkv, splits, rows, d = o_part.shape
    _merge_kernel[(b * hkv, rows)](
        o_part, m_part, l_part, out, hkv, splits, n_tokens,
        o_part.stride(0), o_part.stride(1), o_part.stride(2), o_part.stride(3), m_part.stride(0), m_part.stride(1), m_part.stride(2),
        *out_strides, D=d, SPLITS=triton.next_power_of_2(splits), num_warps=4)


def pass1_grid(batch_heads: int, splits: int) -> tuple[int, int]:
    """Pass 1's grid, (B*Hkv, splits), not (splits, B*Hkv): blocks launch in linear order, x fastest, so programs go out
    split by split and the last ones launched, which share a multiprocessor once every SM holds one, are the last splits:
    the one holding the newest key (its cached keys end there, the lightest live split) and those past it (empty). Split
    by head, they were the last KV head's last full splits, and two full programs on one SM set the kernel's length: a
    16-token verify at 8K runs 17 splits x 8 heads = 136 programs of 64 rows (one a multiprocessor by its registers and
    shared memory; 132 SMs). H200, 36 calls captured (``benchmarks/verify_attention_variants.py``, ``splits_last``): the
    verify at 8K 23.1 -> 19.8 µs a call, at 1K and 32K unchanged (12.2, 47.7); one token 15.9 at 8K (unchanged), 8.4 ->
    8.1 at 1K. The kernels read (bh, split) from program ids (0, 1). ``swa_kernels/block_attention.py`` launches the same way."""
    return batch_heads, splits




@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count if torch.cuda.is_available() else 16


# a split reads up to this many keys per query row it writes partials for. H200, a 16-token verify (64 rows) at 32K, 36
# calls on 36 caches (benchmarks/attention_split_sizes.py): 51.7 µs a call with 512-key splits (8 keys a row, the rule
# before), 44.4-44.9 with 1024 (16 a row), 54.6 with 768, 48.9 with 1536 (the keys' read floor 31.9); the DFlash loop at
# 32K 0.78 -> 0.82 of τ. At 8K and 1K the one-wave cap of split_size binds first (the same splits as before)
KEYS_PER_ROW = 16


def split_size(capacity: int, programs_per_split: int, device: torch.device, rows: int = 1, block_n: int = BLOCK_N,
               equal_splits: bool = False, reserved: int = 0) -> int:
    """Keys per split: enough splits for about four programs per SM (at most 128 splits), whole tiles; and, for many
    query rows, up to ``KEYS_PER_ROW * rows`` keys as long as the programs still fill the SMs once. Every split writes
    ``rows x D`` fp32 partials that the merge reads back: a 16-token verify has 64 query rows per KV head (Qwen3-8B),
    whose partials over 64-key splits moved twice the bytes of the keys. H100, one call at 1K / 8K / 32K: 9.7 / 27.0 /
    66.6 µs with the splits by capacity alone, 9.1 / 22.9 / 66.4 with 8 keys a row; 16 a row since (``KEYS_PER_ROW``).
    A one-token step (4 rows) keeps its splits.

    ``equal_splits``: for a kernel whose splits all loop the same tile count (``swa_kernels/block_attention.py``), the one
    wave is at most one program an SM (``sms // programs_per_split`` splits a KV head), not one split more: with 132 SMs
    and 8 KV heads ``ceil`` gave 17 splits, 136 programs, and the 4 programs that found every SM taken ran after a full
    one on theirs. This file's kernel keeps ``ceil``: its last live split, holding the newest keys, is the lightest, and
    ``pass1_grid`` launches it last. ``reserved``: with ``equal_splits``, that many programs a KV head's share of the wave
    kept for others (``swa_kernels/block_attention.py``'s split of the block's own keys)."""
    sms = _num_sms(device.index or 0) if device.type == "cuda" else 16
    splits = max(1, min(128, math.ceil(4 * sms / programs_per_split)))
    per_head = max(1, sms // programs_per_split - reserved) if equal_splits else math.ceil(sms / programs_per_split)
    one_wave = capacity / max(1, per_head)  # keys per split when the programs fill the SMs once
    keys = max(math.ceil(capacity / splits), min(KEYS_PER_ROW * rows, one_wave))
    return block_n * max(1, math.ceil(keys / block_n))


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor, n_tokens: int,
                     scale: float, window: int | None = None, k_new: torch.Tensor | None = None,
                     v_new: torch.Tensor | None = None, rope: Rope | None = None) -> torch.Tensor:
    """Attention of ``n_tokens`` new tokens per row over the cache, split over the keys.

    k/v caches [B, Hkv, C, D] (slot = position), pos [B] int64 on the device; token t of row b sits at ``pos[b] + t``.
    Without ``rope``: q [B, Hkv, G*n, D] (rows (g, t)), normed and rotated; the new tokens' keys/values either already in
    the cache or given as ``k_new`` / ``v_new`` [B, Hkv, n, D], which the kernel writes into the cache itself (two
    launches per layer fewer than separate scatters).
    With ``rope``: the projections as they come out of the fused q/k/v matrix, q [B, n, Hq, D] and ``k_new`` / ``v_new``
    [B, n, Hkv, D] (views are fine); the kernel applies the per-head norm and RoPE (``Rope``) to q and the new keys,
    and writes the keys rotated.
    Returns the output in q's layout and dtype: [B, Hkv, G*n, D] (rows (g, t)) without ``rope``, [B, n, Hq, D] with it
    (o_proj's input as a view: a verify's 16 tokens need no transpose kernel after, ~1.6 µs a layer on an H200).
    """
    capacity = k_cache.shape[2]
    b, hkv, d = k_cache.shape[0], k_cache.shape[1], k_cache.shape[3]
    has_new = k_new is not None
    if rope is not None:
        if not has_new or v_new is None:
            raise ValueError("decode_attention: rope needs the new keys and values (k_new, v_new)")
        groups = q.shape[2] // hkv
        # q [B, n, Hq, D]: head h * G + g; k_new/v_new [B, n, Hkv, D] -> strides as [B, Hkv, n, D]
        q_strides = (q.stride(0), groups * q.stride(2), q.stride(2), q.stride(1))
        k_new, v_new = k_new.transpose(1, 2), v_new.transpose(1, 2)
    else:
        groups = q.shape[2] // n_tokens
        q_strides = (q.stride(0), q.stride(1), n_tokens * q.stride(2), q.stride(2))
    rows = groups * n_tokens
    k_new = k_cache if k_new is None else k_new  # unused when not has_new (any tensor with strides)
    v_new = v_cache if v_new is None else v_new
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1 or q.stride(-1) != 1 or k_new.stride(-1) != 1 or v_new.stride(-1) != 1:
        raise ValueError("decode_attention: the head dimension must be contiguous in q and the caches")
    if d & (d - 1):
        raise ValueError(f"decode_attention: head_dim {d}; a power of two expected")
    tiling = tiling_for(rows, q.device)
    size = split_size(capacity, b * hkv, q.device, rows, tiling.block_n)
    splits = math.ceil(capacity / size)
    o_part = torch.empty(b, hkv, splits, rows, d, dtype=torch.float32, device=q.device)
    m_part = torch.empty(b, hkv, splits, rows, dtype=torch.float32, device=q.device)
    l_part = torch.empty_like(m_part)
    if rope is not None:  # [B, n, Hq, D], head h * G + g: row (b, h, g, t) at b*s0 + (h*G + g)*s2 + t*s1
        out = torch.empty(b, n_tokens, hkv * groups, d, dtype=q.dtype, device=q.device)
        out_strides = (out.stride(0), groups * out.stride(2), out.stride(2), out.stride(1))
    else:  # [B, Hkv, G*n, D]: row (g, t) at g * n + t
        out = torch.empty(b, hkv, rows, d, dtype=q.dtype, device=q.device)
        out_strides = (out.stride(0), out.stride(1), n_tokens * out.stride(2), out.stride(2))
    block_m = max(16, triton.next_power_of_2(rows))
    cos, sin = (rope.cos, rope.sin) if rope is not None else (q, q)  # unused without rope
    has_norm = rope is not None and rope.q_norm is not None
    q_w, k_w = (rope.q_norm, rope.k_norm) if has_norm else (q, q)
    _split_kernel[pass1_grid(b * hkv, splits)](
        q, k_cache, v_cache, k_new, v_new, pos, o_part, m_part, l_part, cos, sin, q_w, k_w,
        *q_strides, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), k_new.stride(0), k_new.stride(1), k_new.stride(2),
        v_new.stride(0), v_new.stride(1), v_new.stride(2),
        o_part.stride(0), o_part.stride(1), o_part.stride(2), o_part.stride(3), m_part.stride(0), m_part.stride(1), m_part.stride(2),
        cos.stride(0), hkv, rows, n_tokens, capacity, window or 0, scale * LOG2E, size, rope.eps if rope is not None else 0.0,
        D=d, BLOCK_M=block_m, BLOCK_N=tiling.block_n, TILES=size // tiling.block_n, BLOCK_T=max(16, triton.next_power_of_2(n_tokens)),
        HAS_NEW=has_new, ROTATE=rope is not None, HAS_NORM=has_norm, HAS_WINDOW=window is not None,
        IEEE=q.dtype == torch.float32, LIVE_TILES=live_tiles(q.device), num_warps=tiling.num_warps, num_stages=tiling.num_stages)
    merge_splits(o_part, m_part, l_part, out, n_tokens, out_strides)
    return out
