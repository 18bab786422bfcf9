"""DFlash's mask as per-row key intervals (``swa_kernels.key_intervals``), on CPU: the intervals equal
``models.dflash.dense_mask`` element by element, the kernels' tile tables visit every visible pair and
leave unmasked only tiles that every row sees whole, and the trainer's ``key_interval_mask`` path
through ``swa_kernels.attention.attention`` equals dense SDPA (the FA4 kernels themselves:
tests/test_key_intervals_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from swa_kernels.attention import attention
from swa_kernels.key_intervals import (FWD_TILE_M, TILE_N, backward_tables, ctx_keys_for, dense_mask_from_intervals,
                                   dflash_key_intervals, forward_tables)
from models.dflash import LayerMaskSpec, dense_mask, key_interval_mask

SPECS = [LayerMaskSpec(2048, True), LayerMaskSpec(100, False), LayerMaskSpec(20, False), LayerMaskSpec(5, True),
         LayerMaskSpec(1, True), LayerMaskSpec(None, False), LayerMaskSpec(None, True)]


def case(ctx_len: int = 300, n: int = 12, block: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    anchors = torch.sort(torch.randint(1, ctx_len, (2, n), generator=g)).values
    anchors[1, -2:] = 0  # padded anchor slots
    lengths = torch.tensor([ctx_len, ctx_len // 2])  # anchors past the second row's context too
    ctx_valid = torch.arange(ctx_len)[None] < lengths[:, None]
    return anchors, lengths, ctx_valid


def in_caller_layout(mask: torch.Tensor, ctx_len: int, ctx_keys: int) -> torch.Tensor:
    """Columns of the kernels' key layout [context padded to ctx_keys ; blocks] -> [context ; blocks]."""
    keep = torch.cat([torch.arange(ctx_len), torch.arange(ctx_keys, mask.shape[-1])])
    return mask[..., keep]


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_intervals_equal_dflash_dense_mask(spec: LayerMaskSpec) -> None:
    block, ctx_len = 16, 300
    anchors, lengths, ctx_valid = case(ctx_len, block=block)
    ctx_keys = ctx_keys_for(ctx_len)
    assert ctx_keys == 384
    rows = dflash_key_intervals(anchors, lengths, block, spec.window, spec.block_causal, ctx_keys)
    got = in_caller_layout(dense_mask_from_intervals(rows, ctx_keys + anchors.shape[1] * block), ctx_len, ctx_keys)
    assert torch.equal(got, dense_mask(anchors, ctx_valid, block, spec))


@pytest.mark.parametrize("spec", [LayerMaskSpec(512, True), LayerMaskSpec(64, False), LayerMaskSpec(None, False)], ids=str)
@pytest.mark.parametrize("bwd_tile", [64, 128])
def test_tile_tables_visit_every_visible_pair(spec: LayerMaskSpec, bwd_tile: int) -> None:
    """Forward: a query tile's visible key tiles lie in its interval-1 or interval-2 range, the two
    ranges are disjoint and in that order (the kernel runs interval 2 as tiles after interval 1), and
    the tiles it leaves unmasked are wholly visible to every row. Backward: a key tile's visible
    query tiles lie in its range, and a tile it leaves unmasked is wholly visible."""
    block, groups, ctx_len, n = 16, 4, 1000, 40
    anchors, lengths, _ = case(ctx_len, n=n, block=block, seed=1)
    ctx_keys = ctx_keys_for(ctx_len)
    num_keys = ctx_keys + n * block
    rows = dflash_key_intervals(anchors, lengths, block, spec.window, spec.block_causal, ctx_keys).repeat_interleave(groups, 1)
    dense = dense_mask_from_intervals(rows, num_keys)[:, 0]  # [B, R, K]
    r, k = dense.shape[1:]
    _, tiles = forward_tables(rows)
    for b in range(2):
        for m in range(-(-r // FWD_TILE_M)):
            n_min, n_end, n2_min, n2_end, right, left = tiles[b, m].tolist()
            sub = dense[b, m * FWD_TILE_M:(m + 1) * FWD_TILE_M]
            seen = {j // TILE_N for j in sub.any(0).nonzero().flatten().tolist()}
            assert seen <= set(range(n_min, n_end)) | set(range(n2_min, n2_end)), (b, m)
            assert n2_min >= n_end
            # the mask compares a row with one interval per tile: interval 1 in [n_min, n_end), 2 past it
            rows_m = rows[b, m * FWD_TILE_M:(m + 1) * FWD_TILE_M]
            for lo, hi, first, end in ((rows_m[:, 0], rows_m[:, 1], n_min, n_end), (rows_m[:, 2], rows_m[:, 3], n2_min, n2_end)):
                live = hi > lo
                assert (lo[live] >= first * TILE_N).all() and (hi[live] <= end * TILE_N).all(), (b, m)
            for t in range(left, right):  # unmasked tiles
                assert sub[:, t * TILE_N:(t + 1) * TILE_N].all(), (b, m, t)
    _, key_tiles, query_tiles = backward_tables(rows, num_keys, bwd_tile)
    for b in range(2):
        for t in range(-(-k // TILE_N)):
            m_min, m_end = key_tiles[b, t].tolist()
            col = dense[b, :, t * TILE_N:(t + 1) * TILE_N]
            seen = {i // bwd_tile for i in col.any(1).nonzero().flatten().tolist()}
            assert seen <= set(range(m_min, m_end)), (b, t)
            for m in range(m_min, m_end):
                max_lo1, min_hi1, first2 = query_tiles[b, m].tolist()
                rows_m = rows[b, m * bwd_tile:(m + 1) * bwd_tile]
                live1, live2 = rows_m[:, 1] > rows_m[:, 0], rows_m[:, 3] > rows_m[:, 2]
                # a key tile is all interval 1 (before first2) or all interval 2 for these rows
                assert (rows_m[live1, 1] <= first2).all() and (rows_m[live2, 2] >= first2).all(), (b, m)
                assert first2 % TILE_N == 0 or first2 == torch.iinfo(torch.int32).max
                if max_lo1 <= t * TILE_N and min_hi1 >= (t + 1) * TILE_N:
                    assert col[m * bwd_tile:(m + 1) * bwd_tile].all(), (b, t, m)


@pytest.mark.parametrize("ctx_len", [300, 384])  # padded to a key tile, and already whole tiles
def test_key_interval_mask_through_attention_equals_dense_sdpa(ctx_len: int) -> None:
    """The trainer's path: [B, H, T, D] views, keys [context ; blocks] as the model lays them out."""
    block, n, hq, hkv, d = 16, 10, 8, 2, 32
    spec = LayerMaskSpec(64, True)
    anchors, _, ctx_valid = case(ctx_len, n=n, block=block, seed=2)
    torch.manual_seed(0)
    q = torch.randn(2, n * block, hq, d).transpose(1, 2)
    k = torch.randn(2, ctx_len + n * block, hkv, d).transpose(1, 2)
    v = torch.randn_like(k)
    got = attention(q, k, v, key_interval_mask(anchors, ctx_valid, block, spec, hq // hkv, head_dim=d))
    want = attention(q, k, v, dense_mask(anchors, ctx_valid, block, spec))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_left_padded_context_is_refused() -> None:
    anchors, _, ctx_valid = case()
    with pytest.raises(RuntimeError, match="not a prefix"):
        key_interval_mask(anchors, ctx_valid.flip(1), 16, LayerMaskSpec(64, True), 4)


def test_tables_pad_the_rows_to_whole_query_tiles() -> None:
    """The kernels read every row of a query tile: an odd block count (64 packed rows past the last
    whole 128-row tile) gets empty rows, not reads past the table."""
    anchors, lengths, _ = case(300, n=3)
    rows = dflash_key_intervals(anchors, lengths, 16, 64, True, ctx_keys_for(300)).repeat_interleave(4, 1)  # 192 rows
    for table in (forward_tables(rows)[0], backward_tables(rows, 384 + 48, 64)[0]):
        assert table.shape == (2, 256, 4)
        assert torch.equal(table[:, :192], rows) and not table[:, 192:].any()


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))])
def test_compiled_plan_tensors_equal_eager(device: str) -> None:
    """On a GPU ``key_interval_mask`` builds its intervals and tables through ``torch.compile`` (a few fused kernels for
    the host to queue instead of ~90 ops); compiled (Inductor's CPU code here, Triton on a GPU), every table equals the
    eager one element by element, for both layer types of the old recipe and a draft of padded anchors."""
    from models.dflash import interval_plan_tensors

    compiled = torch.compile(interval_plan_tensors, dynamic=False)
    for ctx_len, spec in ((300, LayerMaskSpec(2048, True)), (384, LayerMaskSpec(None, False)), (300, LayerMaskSpec(20, False))):
        anchors, lengths, _ = (t.to(device) for t in case(ctx_len, n=12))
        ctx_keys = ctx_keys_for(ctx_len)
        args = (anchors, lengths, 16, spec.window, spec.block_causal, ctx_keys, 4, ctx_keys + 12 * 16, 64)
        (rows_e, tables_e), (rows_c, tables_c) = interval_plan_tensors(*args), compiled(*args)
        assert torch.equal(rows_e, rows_c)
        for e, c in zip(tables_e, tables_c, strict=True):
            assert e.dtype == c.dtype and torch.equal(e, c)
