"""EAGLE-3 training-time-test masks against a dense reference built element by element.

Reference rule, in positions: the drafter's index u at step s sits at position u + 1 + s. A query
(index t, step j, position p = t + 1 + j) sees
    step-0 key u:  u <= t and (u is a real token or u == t)  (the context the drafter has cached)
    step-s key u:  1 <= s <= j and u == t                   (its own chain's earlier drafts)
and, in a sliding layer, only keys at positions >= p - W + 1 (W keys counting the query itself).
"""

from __future__ import annotations

import pytest
import torch

from train.eagle3 import tile_structure_fn, ttt_dense_mask, ttt_flex_block_mask, ttt_tile_structure, ttt_visible


def reference_mask(valid: list[bool], step: int, window: int | None) -> torch.Tensor:
    seq_len = len(valid)
    mask = torch.zeros(seq_len, (step + 1) * seq_len, dtype=torch.bool)
    for t in range(seq_len):
        p = t + 1 + step
        for s in range(step + 1):
            for u in range(seq_len):
                key_pos = u + 1 + s
                if s == 0:
                    ok = u <= t and (valid[u] or u == t)
                else:
                    ok = u == t
                if window is not None and key_pos < p - window + 1:
                    ok = False
                mask[t, s * seq_len + u] = ok
    return mask


VALID = [[True] * 11, [True] * 8 + [False] * 3]


@pytest.mark.parametrize("window", [None, 1, 2, 3, 5, 64])
@pytest.mark.parametrize("step", [0, 1, 2, 4])
def test_dense_mask_matches_the_reference(window: int | None, step: int) -> None:
    ctx_valid = torch.tensor(VALID)
    dense = ttt_dense_mask(ctx_valid, step, window)
    assert dense.shape == (2, 1, 11, (step + 1) * 11)
    for b, valid in enumerate(VALID):
        assert torch.equal(dense[b, 0], reference_mask(valid, step, window)), (b, step, window)


def test_every_query_sees_itself_and_the_window_drops_old_drafts() -> None:
    ctx_valid = torch.tensor(VALID)
    for step in range(5):
        for window in (None, 1, 3):
            dense = ttt_dense_mask(ctx_valid, step, window)[:, 0]
            own = torch.arange(11) + step * 11
            assert dense[:, torch.arange(11), own].all()  # no empty softmax row, padding rows included
    # W=3 at step 4: the query (position t+5) sees its drafts of steps 2, 3, 4 and no context key
    row = ttt_dense_mask(ctx_valid, 4, 3)[0, 0, 6]
    assert row.nonzero().flatten().tolist() == [2 * 11 + 6, 3 * 11 + 6, 4 * 11 + 6]


@pytest.mark.parametrize("window", [None, 3])
def test_flex_block_mask_keeps_exactly_the_visible_tiles(window: int | None) -> None:
    """The BlockMask, expanded at tile 4, equals the dense mask (the same mask_mod, tile pruning included)."""
    ctx_valid = torch.tensor([[True] * 16, [True] * 10 + [False] * 6])
    for step in (0, 2):
        block_mask = ttt_flex_block_mask(ctx_valid, step, window, tile=4)
        dense = ttt_dense_mask(ctx_valid, step, window)
        expanded = block_mask.to_dense()  # [B, 1, Q/tile, K/tile] tile occupancy
        tiles = dense[:, :, :, :].reshape(2, 1, 4, 4, step + 1, 4, 4).any(3).any(-1).reshape(2, 1, 4, (step + 1) * 4)
        assert torch.equal(expanded.bool(), tiles)


def test_visible_broadcasts_like_a_mask_mod() -> None:
    ctx_valid = torch.ones(1, 6, dtype=torch.bool)
    b = torch.zeros((), dtype=torch.long)
    assert bool(ttt_visible(b, torch.tensor(3), torch.tensor(2), 0, ctx_valid, None))
    assert not bool(ttt_visible(b, torch.tensor(3), torch.tensor(4), 0, ctx_valid, None))
    assert bool(ttt_visible(b, torch.tensor(3), torch.tensor(6 + 3), 1, ctx_valid, None))
    assert not bool(ttt_visible(b, torch.tensor(3), torch.tensor(6 + 2), 1, ctx_valid, None))


@pytest.mark.parametrize("window", [None, 1, 3, 5, 40])
@pytest.mark.parametrize("tile", [1, 3, 4, 8])
@pytest.mark.parametrize("seq_len", [12, 13])
def test_tile_structure_equals_the_dense_masks_tiles(window: int | None, tile: int, seq_len: int) -> None:
    """Right-padded rows of several lengths, T a multiple of the tile or not (key tiles straddle TTT steps), windows
    shorter than the step: the kept and full tiles from ``ttt_tile_structure`` are exactly those of the
    element-by-element mask (any / all visible pairs per tile)."""
    ctx_valid = torch.arange(seq_len)[None, :] < torch.tensor([[seq_len], [9], [1]])
    for step in range(4):
        kept, full = ttt_tile_structure(ctx_valid, step, window, tile)
        dense = ttt_dense_mask(ctx_valid, step, window)[:, 0].float()  # [3, T, (step + 1) T]
        q_tiles, kv_tiles = kept.shape[1:]
        padded = torch.nn.functional.pad(dense, (0, kv_tiles * tile - dense.shape[2], 0, q_tiles * tile - seq_len), value=-1)
        tiles = padded.view(3, q_tiles, tile, kv_tiles, tile).transpose(2, 3).flatten(3)  # -1: past the ends
        assert torch.equal(kept, (tiles == 1).any(-1)), (step, window, tile)
        assert torch.equal(full, ((tiles == 1) | (tiles < 0)).all(-1) & (tiles == 1).any(-1)), (step, window, tile)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_compiled_tile_structure_on_cuda_equals_the_eager_one() -> None:
    """The flex masks' tiles on a GPU come from ``ttt_tile_structure`` compiled with dynamic shapes: the same kept and
    full tiles for right-padded rows of lengths that are not multiples of the tile, and one graph serves them all."""
    compiled = tile_structure_fn("cuda")
    for seq_len in (13, 300, 517):
        ctx_valid = torch.arange(seq_len)[None, :] < torch.tensor([[seq_len], [seq_len // 2], [1]])
        for step in range(3):
            for window in (None, 3, 64):
                want = ttt_tile_structure(ctx_valid, step, window, 4)
                got = compiled(ctx_valid.cuda(), step, window, 4)
                assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1]), (seq_len, step, window)


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("tile", [4, 3])
def test_uniform_length_masks_are_the_step_masks_with_invisible_later_keys(window: int | None, tile: int) -> None:
    """``step_masks(uniform_keys=True)``: every step's mask spans the last step's keys. The dense mask is the step's own
    with all-False columns after it; the flex BlockMask's tiles (T = 16 a multiple of tile 4, or not: tile 3 straddles a
    step's end) are the step's own kept tiles, no later tile kept, a straddling tile partial, and its ``mask_mod`` with
    the step as a tensor gives the dense mask element by element."""
    ctx_valid = torch.tensor([[True] * 16, [True] * 10 + [False] * 6])
    steps, seq_len = 4, 16
    for step in range(steps):
        dense = ttt_dense_mask(ctx_valid, step, window)
        uniform = ttt_dense_mask(ctx_valid, step, window, kv_steps=steps)
        assert uniform.shape[-1] == steps * seq_len
        assert torch.equal(uniform[..., : (step + 1) * seq_len], dense) and not uniform[..., (step + 1) * seq_len:].any()

        block_mask = ttt_flex_block_mask(ctx_valid, step, window, tile=tile, kv_steps=steps)
        assert block_mask.seq_lengths == (seq_len, steps * seq_len)
        b, q, kv = torch.arange(2)[:, None, None], torch.arange(seq_len)[None, :, None], torch.arange(steps * seq_len)[None, None, :]
        assert torch.equal(block_mask.mask_mod(b, 0, q, kv), uniform[:, 0])
        occupancy = block_mask.to_dense().bool()[:, 0]  # [B, Qt, Kt]: kept tiles, partial or full
        q_tiles, kv_tiles = occupancy.shape[1:]
        padded = torch.nn.functional.pad(uniform[:, 0].float(), (0, kv_tiles * tile - steps * seq_len, 0, q_tiles * tile - seq_len), value=-1)
        tiles = padded.view(2, q_tiles, tile, kv_tiles, tile).transpose(2, 3).flatten(3)
        assert torch.equal(occupancy, (tiles == 1).any(-1)), (step, window, tile)
        full = torch.zeros_like(occupancy)
        counts, order = block_mask.full_kv_num_blocks[:, 0], block_mask.full_kv_indices[:, 0]
        for row in range(2):
            for qt in range(q_tiles):
                full[row, qt, order[row, qt, : counts[row, qt]].long()] = True
        assert torch.equal(full, ((tiles == 1) | (tiles < 0)).all(-1) & (tiles == 1).any(-1)), (step, window, tile)
