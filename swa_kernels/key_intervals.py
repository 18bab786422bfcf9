"""Attention in which every query row sees at most two key intervals, [lo1, hi1) and [lo2, hi2).

DFlash's training mask is of this form once the keys are laid out as [context ; the blocks' own
keys]: a block's query at position p = a + k (anchor a, slot k) sees the context keys
[max(0, p - W + 1), a) and, among the block keys, its own block's slots up to itself. Given per-row
intervals, FlashAttention-4's forward and backward (``swa_kernels.fa4_key_intervals``) visit only the
key tiles the intervals touch and mask only the tiles they cut, the way they run a sliding window.

This module is plain PyTorch: the DFlash intervals (``dflash_key_intervals``), the tile tables the
kernels read (``forward_tables``, ``backward_tables``), a dense boolean mask built from intervals
element by element (the reference), and ``key_interval_attention``, the autograd entry point.
An empty interval is written (0, 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TILE_N = 128  # key tile, forward (asked of FA4 with tile_mn) and backward (FA4's SM90 choice for head_dim <= 128)
FWD_TILE_M = 128  # forward query tile (rows packed by KV group; asked with tile_mn)


def bwd_tile_m(head_dim: int) -> int:
    """The backward's query tile: FA4's SM90 local-attention configuration (interface._tile_size_bwd_sm90)."""
    if head_dim > 128:
        raise ValueError(f"key-interval attention supports head_dim <= 128 (FA4's 128-key tiles); got {head_dim}")
    return 128 if head_dim <= 64 else 64


def ctx_keys_for(ctx_len: int) -> int:
    """Where the block keys start: the context rounded up to whole key tiles, so that no key tile
    holds both context and block keys (the forward visits the two intervals' tiles separately)."""
    return -(-ctx_len // TILE_N) * TILE_N


def dflash_key_intervals(anchors: torch.Tensor, ctx_len: torch.Tensor, block_size: int, window: int | None,
                         block_causal: bool, ctx_keys: int, ctx_lo: torch.Tensor | None = None) -> torch.Tensor:
    """[Bsz, N * B, 4] int32 intervals of DFlash's rule (``models.dflash.dflash_visible``) over keys laid
    out as [context, padded to ``ctx_keys`` ; block n's B keys at ctx_keys + n * B].

    Args:
        anchors: [Bsz, N] anchor positions (padded slots: 0).
        ctx_len: [Bsz] real context tokens, which must be a prefix of the context (right padding).
        window: W keys counting the query itself; None = no window.
        ctx_lo: [Bsz, N] the first context key each block may see (packed documents: its document's start); None: 0.
    """
    bsz, n = anchors.shape
    k = torch.arange(block_size, device=anchors.device)
    a = anchors.long()[:, :, None]  # [Bsz, N, 1]
    pos = a + k
    hi1 = torch.minimum(a, ctx_len.long()[:, None, None]).expand_as(pos)
    lo1 = (pos - window + 1).clamp(min=0) if window is not None else torch.zeros_like(pos)
    if ctx_lo is not None:
        lo1 = torch.maximum(lo1, ctx_lo.long()[:, :, None])
    block0 = ctx_keys + torch.arange(n, device=anchors.device)[None, :, None] * block_size
    slot_lo = (k - window + 1).clamp(min=0) if window is not None else torch.zeros_like(k)
    if block_causal:
        slot_hi = k + 1
    else:
        slot_hi = (k + window).clamp(max=block_size) if window is not None else torch.full_like(k, block_size)
    lo2, hi2 = (block0 + slot_lo).expand_as(pos), (block0 + slot_hi).expand_as(pos)
    empty1 = lo1 >= hi1
    lo1, hi1 = lo1.masked_fill(empty1, 0), hi1.masked_fill(empty1, 0)
    return torch.stack([lo1, hi1, lo2, hi2], -1).reshape(bsz, n * block_size, 4).int()


def dense_mask_from_intervals(rows: torch.Tensor, num_keys: int) -> torch.Tensor:
    """[Bsz, 1, R, num_keys] bool, element by element: key j visible to row r iff j is in one of r's intervals."""
    j = torch.arange(num_keys, device=rows.device)
    lo1, hi1, lo2, hi2 = (rows[..., i, None].long() for i in range(4))
    return (((j >= lo1) & (j < hi1)) | ((j >= lo2) & (j < hi2)))[:, None]


def _padded_rows(rows: torch.Tensor) -> torch.Tensor:
    """The kernels read the rows of whole query tiles: pad to a multiple of the largest tile with
    empty rows (0, 0, 0, 0). Rows already padded come back as they are (the plan shares one table)."""
    if rows.shape[1] % 128 == 0 and rows.dtype == torch.int32 and rows.is_contiguous():
        return rows
    return torch.nn.functional.pad(rows, (0, 0, 0, -rows.shape[1] % 128)).int().contiguous()


def _tile_ranges(rows: torch.Tensor, tile_m: int):
    """Per query tile: the key tiles each interval touches, and the tile-wide interval-1 bounds
    (max lo1, min hi1) inside which no row needs a mask."""
    bsz, r, _ = rows.shape
    pad = -r % tile_m
    rows = torch.nn.functional.pad(rows.long(), (0, 0, 0, pad)).view(bsz, (r + pad) // tile_m, tile_m, 4)
    big = torch.iinfo(torch.int32).max

    def touched(lo, hi):
        live = hi > lo
        n_min = torch.where(live, lo, big).amin(-1) // TILE_N
        n_end = -(-torch.where(live, hi, 0).amax(-1) // TILE_N)
        none = ~live.any(-1)
        return n_min.masked_fill(none, 0), n_end.masked_fill(none, 0)

    n_min, n_end = touched(rows[..., 0], rows[..., 1])
    n2_min, n2_end = touched(rows[..., 2], rows[..., 3])
    return n_min, n_end, n2_min, n2_end, rows[..., 0].amax(-1), rows[..., 1].amin(-1)


def forward_tables(rows_packed: torch.Tensor) -> list[torch.Tensor]:
    """The forward's aux tensors (see ``swa_kernels.fa4_key_intervals``) for rows packed by KV group."""
    n_min, n_end, n2_min, n2_end, max_lo1, min_hi1 = _tile_ranges(rows_packed, FWD_TILE_M)
    nothing = (n_end == n_min) & (n2_end == n2_min)  # one fully masked tile keeps FA4's loop non-empty
    n2_end = torch.where(nothing, n2_min + 1, n2_end)
    right = torch.minimum(torch.maximum(min_hi1 // TILE_N, n_min), n_end)
    left = torch.minimum(torch.maximum(-(-max_lo1 // TILE_N), n_min), n_end)
    tiles = torch.stack([n_min, n_end, n2_min, n2_end, right, left], -1)
    return [_padded_rows(rows_packed), tiles.int().contiguous()]


def backward_tables(rows: torch.Tensor, num_keys: int, tile_m: int) -> list[torch.Tensor]:
    """The backward's aux tensors: per key tile the query tiles whose rows touch it, per query tile
    the interval-1 bounds shared by all its rows."""
    n_min, n_end, n2_min, n2_end, max_lo1, min_hi1 = _tile_ranges(rows, tile_m)
    # where the tile's interval-2 keys start: a key tile holds one interval's keys (the mask compares one)
    first2 = torch.where(n2_end > n2_min, n2_min * TILE_N, torch.iinfo(torch.int32).max)
    n = torch.arange(-(-num_keys // TILE_N), device=rows.device)[None, None, :]
    touch = ((n >= n_min[..., None]) & (n < n_end[..., None])) | ((n >= n2_min[..., None]) & (n < n2_end[..., None]))
    m = torch.arange(touch.shape[1], device=rows.device)[None, :, None]
    m_min = torch.where(touch, m, touch.shape[1]).amin(1)
    m_end = torch.where(touch, m + 1, 0).amax(1)
    m_min = torch.where(m_end > 0, m_min, 0)
    return [_padded_rows(rows), torch.stack([m_min, m_end], -1).int().contiguous(),
            torch.stack([max_lo1, min_hi1, first2], -1).int().contiguous()]


@dataclass(frozen=True)
class KeyIntervalPlan:
    """The kernels' tables for one set of intervals: build once per step, use in every layer."""

    rows: torch.Tensor  # [B, Tq, 4] the intervals (the reference path reads them)
    groups: int  # query heads per KV head
    head_dim: int  # the backward's tiles depend on it
    forward: list  # aux tensors of the forward (rows packed by KV group, 128-row tiles)
    backward: list  # aux tensors of the backward (the same row table, FA4's tiles for head_dim)


def interval_tables(rows: torch.Tensor, groups: int, num_keys: int, head_dim: int = 128) -> tuple[torch.Tensor, ...]:
    """``plan_key_intervals``' tensors alone (the packed rows, the forward's tiles, the backward's two tables): a pure
    function of ``rows``, which the trainer compiles into a few kernels on a GPU (eager, ~45 small ops a plan)."""
    packed = _padded_rows(rows.repeat_interleave(groups, dim=1))  # one row table for both directions
    _, tiles = forward_tables(packed)
    _, bwd_m, bwd_bounds = backward_tables(packed, num_keys, bwd_tile_m(head_dim))
    return packed, tiles, bwd_m, bwd_bounds


def plan_from_tables(rows: torch.Tensor, groups: int, head_dim: int, tables: tuple[torch.Tensor, ...]) -> KeyIntervalPlan:
    packed, tiles, bwd_m, bwd_bounds = tables
    return KeyIntervalPlan(rows, groups, head_dim, [packed, tiles], [packed, bwd_m, bwd_bounds])


def plan_key_intervals(rows: torch.Tensor, groups: int, num_keys: int, head_dim: int = 128) -> KeyIntervalPlan:
    """Tables for queries whose G = ``groups`` heads per KV head share each row's intervals.

    Both directions run the rows packed by KV group (row t * G + g is query t under head g of its
    group): the forward through FA4's own GQA packing, the backward as multi-head attention over the
    KV heads, so that a key tile's dK / dV gather all G heads' rows in one pass rather than G passes
    added up in fp32."""
    return plan_from_tables(rows, groups, head_dim, interval_tables(rows, groups, num_keys, head_dim))


@dataclass(frozen=True)
class KeyIntervalMask:
    """What ``swa_kernels.attention.attention`` takes for a layer trained with these kernels: the plan,
    and where the caller's keys [context (ctx_len) ; blocks] put their block keys."""

    plan: KeyIntervalPlan
    ctx_len: int  # context keys in the caller's K and V
    ctx_keys: int  # where the kernels read the block keys (ctx_len rounded up to a key tile)
    group_major: bool = False  # q's heads come ordered g * Hkv + h (the model obliges: models/dflash.py)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> torch.Tensor:
        """q [B, Hq, Q, D], k/v [B, Hkv, ctx_len + Q, D] (the models' [B, T, H, D] seen as [B, H, T, D])."""
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
        if self.ctx_keys != self.ctx_len:  # unseen zero keys between context and blocks (one copy of K and V)
            k, v = (torch.cat([x[:, :self.ctx_len], x.new_zeros(x.shape[0], self.ctx_keys - self.ctx_len, *x.shape[2:]),
                               x[:, self.ctx_len:]], 1) for x in (k, v))
        return key_interval_attention(q, k, v, self.plan, scale, self.group_major).transpose(1, 2)


def _pack(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[B, T, Hkv * G, D] -> [B, T * G, Hkv, D], row t * G + g (query head h * G + g); GPU (the backward)."""
    from swa_kernels.fa4_key_intervals import swap_heads

    b, t, h, d = x.shape
    return swap_heads(x, h // groups, groups).view(b, t * groups, h // groups, d)


def _unpack(x: torch.Tensor, groups: int) -> torch.Tensor:
    from swa_kernels.fa4_key_intervals import swap_heads

    b, r, hkv, d = x.shape
    return swap_heads(x.view(b, r // groups, groups * hkv, d), groups, hkv)


class KeyIntervalAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, plan, scale, group_major):
        from swa_kernels import fa4_key_intervals as fa4

        b, t, hq, d = q.shape
        # k and v arrive as [B, S, Hkv, D] views of the models' [B, Hkv, S, D] keys; FA4's backward wants them
        # contiguous (fa4_key_intervals.backward copies them, two strided copies a layer). Made contiguous here, in
        # a compiled step the copy fuses into the kernel that writes the keys (rotary and the context/block concat)
        k, v = k.contiguous(), v.contiguous()
        if group_major:  # heads g * Hkv + h: q is already the packed rows, no copies either way
            out, lse = fa4.forward(q.view(b, t * plan.groups, hq // plan.groups, d), k, v, plan.forward, scale)
            out = out.view(b, t, hq, d)
        else:
            out, lse = fa4.forward(q, k, v, plan.forward, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.plan, ctx.scale, ctx.group_major = plan, scale, group_major
        return out

    @staticmethod
    def backward(ctx, dout):
        from swa_kernels import fa4_key_intervals as fa4

        q, k, v, out, lse = ctx.saved_tensors
        g, (b, t, hq, d) = ctx.plan.groups, q.shape
        if ctx.group_major:
            rows = lambda x: x.contiguous().view(b, t * g, hq // g, d)  # noqa: E731
            dq, dk, dv = fa4.backward(rows(q), k, v, rows(out), rows(dout), lse, ctx.plan.backward, ctx.scale)
            return dq.view(b, t, hq, d), dk, dv, None, None, None
        lse_packed = lse.view(b, hq // g, g, t).transpose(2, 3).reshape(b, hq // g, t * g).contiguous()
        dq, dk, dv = fa4.backward(_pack(q, g), k, v, _pack(out, g), _pack(dout, g), lse_packed, ctx.plan.backward, ctx.scale)
        return _unpack(dq, g), dk, dv, None, None, None


def key_interval_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: KeyIntervalPlan,
                           scale: float | None = None, group_major: bool = False) -> torch.Tensor:
    """Attention over FA4's kernels, q [B, Tq, Hq, D], k/v [B, S, Hkv, D] (Hq = G * Hkv), with the
    tables of ``plan_key_intervals(rows, G, S)`` for rows [B, Tq, 4] (query t sees keys [lo1, hi1)
    and [lo2, hi2)). Every interval-2 key tile must lie past the query tile's interval-1 tiles
    (DFlash: ``ctx_keys_for``). ``group_major``: q's heads are ordered g * Hkv + h (a model whose
    q_proj rows are laid out that way), not Hugging Face's h * G + g; the backward then needs no
    regrouping copies of q, out, dout and dq."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if q.shape[-1] != plan.head_dim:
        raise ValueError(f"a key-interval plan for head_dim {plan.head_dim} got q with head_dim {q.shape[-1]}")
    if not q.is_cuda:  # the PyTorch reference (CPU tests of the layouts around the kernels)
        if group_major:  # back to Hugging Face's order h * G + g for the reference, and out again
            hf_head = torch.arange(q.shape[2]).view(k.shape[2], plan.groups).t().reshape(-1)  # group-major slot -> HF head
            return reference_attention(q[:, :, hf_head.argsort()], k, v, plan.rows, scale)[:, :, hf_head]
        return reference_attention(q, k, v, plan.rows, scale)
    half = [x.dtype for x in (q, k, v) if x.dtype in (torch.bfloat16, torch.float16)]
    if not half:
        raise ValueError(f"key-interval attention runs in bf16 or fp16; got {q.dtype}")
    q, k, v = (x.to(half[0]) for x in (q, k, v))  # under autocast the projections may differ (FA4 wants one dtype)
    return KeyIntervalAttention.apply(q, k, v, plan, scale, group_major)


def reference_attention(q, k, v, rows, scale=None):
    """The same attention in PyTorch from the dense mask (the oracle for tests and benchmarks)."""
    from swa_kernels.attention import attention  # (it imports this module)

    mask = dense_mask_from_intervals(rows, k.shape[1])
    return attention(*(x.transpose(1, 2) for x in (q, k, v)), mask, scale=scale).transpose(1, 2)
