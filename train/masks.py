"""Attention masks for DFlash block-diffusion training, as pure functions.

Layout of one training sequence (T context positions, N anchors, block size B):

    queries  q = n * B + k          block n, slot k, position anchors[n] + k       (Q = N * B)
    keys     kv < T                  context position kv (projected target features)
             kv = T + m * B + l      block m, slot l, position anchors[m] + l       (K = T + Q)

A query at position p = a_n + k sees
    context keys   j < a_n (strictly before its anchor), j a real (non-padding) token, and in a
                   sliding layer only j >= p - W + 1 (the W-key window counts the query itself);
    block keys     its own block only (blocks never see each other); causal (l <= k) in sliding
                   layers unless ``block_causal=False``, bidirectional in full layers; in a sliding
                   layer also a_n + l >= p - W + 1 (and, non-causal, a_n + l <= p + W - 1).
Every query sees at least itself, so no softmax row is empty (padded anchor slots included).

``dflash_visible`` is written with tensor ops only, so the same function fills a dense boolean
mask for SDPA (CPU) and serves as a flex_attention ``mask_mod`` (GPU), whose block mask then skips
every 128 x 128 tile the window rules out: sliding-layer cost grows with W, not with T.

Grouped-query packing (``flex_packed_block_mask``): a block's B queries under the G query heads of
one KV head all see nearly the same keys (one anchor), so flex runs with the rows packed as
(block, head of the group, slot): a 128-row tile then holds 128 / (G B) whole blocks and one key
range, not 128 / B blocks spread over 128 / B different anchors (fewer partially masked tiles).
``kernels.attention.attention`` packs and unpacks around the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.attention import PackedQueryMask
from kernels.key_intervals import KeyIntervalMask, ctx_keys_for, dflash_key_intervals, plan_key_intervals

# Legend: Bsz batch, N anchors per sequence, B block size, T context length, Q = N*B queries, K = T+Q keys.


@dataclass(frozen=True)
class LayerMaskSpec:
    window: int | None  # keys visible counting the query itself; None = no window (full layer)
    block_causal: bool  # causal inside the block

    @staticmethod
    def for_layer(layer_type: str, sliding_window: int | None, sliding_block_causal: bool = True) -> "LayerMaskSpec":
        if layer_type == "sliding_attention":
            return LayerMaskSpec(window=sliding_window, block_causal=sliding_block_causal)
        if layer_type == "full_attention":
            return LayerMaskSpec(window=None, block_causal=False)
        raise ValueError(f"layer type {layer_type!r}; expected sliding_attention or full_attention")


def dflash_visible(
    b: torch.Tensor,
    q_idx: torch.Tensor,
    kv_idx: torch.Tensor,
    anchors: torch.Tensor,
    ctx_valid: torch.Tensor,
    block_size: int,
    spec: LayerMaskSpec,
) -> torch.Tensor:
    """True where query ``q_idx`` may attend to key ``kv_idx`` in sequence ``b`` (broadcasting).

    Args:
        b, q_idx, kv_idx: integer tensors, broadcastable to each other.
        anchors: [Bsz, N] anchor positions (padded slots: 0).
        ctx_valid: [Bsz, T] bool, True on real tokens.
        block_size: B.
        spec: the layer's window and in-block causality.
    """
    ctx_len = ctx_valid.shape[1]
    n = q_idx // block_size
    k = q_idx % block_size
    anchor = anchors[b, n]
    pos = anchor + k
    is_ctx = kv_idx < ctx_len
    # torch.where, not clamp: FlashAttention-4's flex lowering has no minimum/maximum
    ctx_ok = (kv_idx < anchor) & ctx_valid[b, torch.where(is_ctx, kv_idx, ctx_len - 1)]
    blk = torch.where(is_ctx, 0, kv_idx - ctx_len)
    m = blk // block_size
    l = blk % block_size
    blk_ok = m == n
    if spec.block_causal:
        blk_ok = blk_ok & (l <= k)
    if spec.window is not None:
        ctx_ok = ctx_ok & (kv_idx > pos - spec.window)
        blk_ok = blk_ok & (l > k - spec.window)
        if not spec.block_causal:  # a non-causal window reaches W - 1 slots ahead too (z-lab's rule)
            blk_ok = blk_ok & (l < k + spec.window)
    return torch.where(is_ctx, ctx_ok, blk_ok)


def dense_mask(anchors: torch.Tensor, ctx_valid: torch.Tensor, block_size: int, spec: LayerMaskSpec) -> torch.Tensor:
    """Boolean SDPA mask [Bsz, 1, Q, K] (True = attend) from ``dflash_visible``."""
    bsz, num_anchors = anchors.shape
    q_len = num_anchors * block_size
    kv_len = ctx_valid.shape[1] + q_len
    device = anchors.device
    b = torch.arange(bsz, device=device)[:, None, None]
    q = torch.arange(q_len, device=device)[None, :, None]
    kv = torch.arange(kv_len, device=device)[None, None, :]
    return dflash_visible(b, q, kv, anchors, ctx_valid, block_size, spec)[:, None]


def flex_block_mask(anchors: torch.Tensor, ctx_valid: torch.Tensor, block_size: int, spec: LayerMaskSpec, tile: int = 128):
    """flex_attention ``BlockMask`` for the same rule (GPU); tiles with no visible pair are skipped."""
    from torch.nn.attention.flex_attention import create_block_mask

    bsz, num_anchors = anchors.shape
    q_len = num_anchors * block_size

    def mask_mod(b, h, q_idx, kv_idx):
        return dflash_visible(b, q_idx, kv_idx, anchors, ctx_valid, block_size, spec)

    return create_block_mask(
        mask_mod, B=bsz, H=None, Q_LEN=q_len, KV_LEN=ctx_valid.shape[1] + q_len, device=anchors.device, BLOCK_SIZE=tile
    )  # eager: new anchors every step; compiled building (as the TTT masks do) ran minutes per step on the H100


def flex_packed_block_mask(anchors: torch.Tensor, ctx_valid: torch.Tensor, block_size: int, spec: LayerMaskSpec, groups: int,
                           tile: int = 128, q_tile: int | None = None, kernel_options: dict | None = None):
    """``flex_block_mask`` for queries packed by KV group (module docstring), or None when a tile
    cannot hold whole blocks (``q_tile``, default ``tile``, not a multiple of ``groups * block_size``).
    ``kernel_options`` travel with the mask to flex_attention (e.g. FlashAttention-4's kernels)."""
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask

    rows_per_block = groups * block_size
    q_tile = q_tile or tile
    if groups < 2 or q_tile % rows_per_block:
        return None
    bsz, num_anchors = anchors.shape
    q_len, kv_len = num_anchors * block_size, ctx_valid.shape[1] + num_anchors * block_size

    def mask_mod(b, h, q_idx, kv_idx):
        return dflash_visible(b, q_idx, kv_idx, anchors, ctx_valid, block_size, spec)

    def packed_mask_mod(b, h, row, kv_idx):  # row = (block n, head g, slot k) -> query n * B + k
        return mask_mod(b, h, row // rows_per_block * block_size + row % block_size, kv_idx)

    # A packed tile holds the same blocks as an unpacked tile of tile / G rows: the tile structure
    # (skipped / partial / full) is the unpacked one at that height, built over Q rows, not G * Q.
    unpacked = create_block_mask(mask_mod, B=bsz, H=None, Q_LEN=q_len, KV_LEN=kv_len, device=anchors.device,
                                 BLOCK_SIZE=(q_tile // groups, tile))
    block_mask = BlockMask.from_kv_blocks(unpacked.kv_num_blocks, unpacked.kv_indices, unpacked.full_kv_num_blocks,
                                          unpacked.full_kv_indices, BLOCK_SIZE=(q_tile, tile), mask_mod=packed_mask_mod,
                                          seq_lengths=(groups * q_len, kv_len))
    return PackedQueryMask(block_mask, groups, block_size, kernel_options)


def key_interval_mask(anchors: torch.Tensor, ctx_valid: torch.Tensor, block_size: int, spec: LayerMaskSpec, groups: int,
                      head_dim: int = 128, group_major: bool = False) -> KeyIntervalMask:
    """The same rule as per-row key intervals for FlashAttention-4's kernels (``kernels.key_intervals``):
    query n * B + k sees the context [max(0, p - W + 1), a_n) and its own block's slots. The context must
    be right-padded (``ctx_valid`` a prefix of each row), as the trainer's batches are; a device-side
    assert checks it without a host sync. ``group_major``: the mask asks for q's heads in the order
    g * Hkv + h (the DFlash drafter then permutes its q_proj rows and o_proj columns in the forward),
    which spares the backward four regrouping copies of q, out, dout and dq."""
    bsz, ctx_len = ctx_valid.shape
    lengths = ctx_valid.sum(1)
    torch._assert_async((ctx_valid == (torch.arange(ctx_len, device=ctx_valid.device) < lengths[:, None])).all(),
                        "key_interval_mask: ctx_valid is not a prefix of each row (left padding or gaps)")
    ctx_keys = ctx_keys_for(ctx_len)
    rows = dflash_key_intervals(anchors, lengths, block_size, spec.window, spec.block_causal, ctx_keys)
    return KeyIntervalMask(plan_key_intervals(rows, groups, ctx_keys + anchors.shape[1] * block_size, head_dim), ctx_len, ctx_keys,
                           group_major)
