"""DFlash training masks against a dense reference built element by element from the definition.

Reference rule (positions, not indices): query = block n, slot k at position p = a_n + k.
  context key j: visible iff j < a_n, j is a real token, and (full layer or j >= p - W + 1);
  block key (m, l) at position a_m + l: visible iff m == n and
      full layer: always;  sliding: (l <= k or non-causal) and a_m + l >= p - W + 1.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import BlockMask

from swa_kernels.attention import attention
from models.dflash import LayerMaskSpec, dense_mask, dflash_tile_structure, dflash_visible, flex_block_mask, flex_packed_block_mask


def reference_mask(anchors: list[int], valid: list[bool], block_size: int, spec: LayerMaskSpec) -> torch.Tensor:
    ctx_len = len(valid)
    q_len = len(anchors) * block_size
    mask = torch.zeros(q_len, ctx_len + q_len, dtype=torch.bool)
    for n, a_n in enumerate(anchors):
        for k in range(block_size):
            p = a_n + k
            q = n * block_size + k
            lowest = -10**9 if spec.window is None else p - spec.window + 1
            for j in range(ctx_len):
                mask[q, j] = j < a_n and valid[j] and j >= lowest
            for m, a_m in enumerate(anchors):
                for l in range(block_size):
                    key_pos = a_m + l
                    ok = m == n and key_pos >= lowest
                    if spec.block_causal:
                        ok = ok and l <= k
                    elif spec.window is not None:  # a non-causal window is symmetric: |key - query| < W
                        ok = ok and key_pos - p < spec.window
                    mask[q, ctx_len + m * block_size + l] = ok
    return mask


SPECS = {
    "full": LayerMaskSpec(window=None, block_causal=False),
    "sliding_causal_w5": LayerMaskSpec(window=5, block_causal=True),
    "sliding_noncausal_w5": LayerMaskSpec(window=5, block_causal=False),
    "sliding_w1": LayerMaskSpec(window=1, block_causal=True),
    "sliding_w_ge_len": LayerMaskSpec(window=64, block_causal=True),
    "sliding_w3_lt_block": LayerMaskSpec(window=3, block_causal=False),
}


@pytest.mark.parametrize("spec_name", list(SPECS))
@pytest.mark.parametrize("block_size", [4, 7])
def test_dense_mask_matches_reference(spec_name: str, block_size: int) -> None:
    spec = SPECS[spec_name]
    # Two sequences: several anchors (one near the start, adjacent ones), right padding in the second.
    anchors = torch.tensor([[1, 5, 6, 17], [3, 9, 0, 0]])
    valid_len = [23, 14]
    ctx_valid = torch.arange(23)[None, :] < torch.tensor(valid_len)[:, None]
    got = dense_mask(anchors, ctx_valid, block_size, spec)
    assert got.shape == (2, 1, 4 * block_size, 23 + 4 * block_size)
    for b in range(2):
        ref = reference_mask(anchors[b].tolist(), ctx_valid[b].tolist(), block_size, spec)
        assert torch.equal(got[b, 0], ref), (spec_name, b)
    # No empty rows: every query sees at least itself.
    assert got.any(-1).all()


def test_window_ge_length_equals_full_causal() -> None:
    anchors = torch.tensor([[2, 8, 11]])
    ctx_valid = torch.ones(1, 16, dtype=torch.bool)
    wide = dense_mask(anchors, ctx_valid, 4, LayerMaskSpec(window=10_000, block_causal=True))
    causal_no_window = dense_mask(anchors, ctx_valid, 4, LayerMaskSpec(window=None, block_causal=True))
    assert torch.equal(wide, causal_no_window)


def test_window_counts_the_query_itself() -> None:
    # W=3, anchor 10, slot 2 -> position 12 sees positions 10, 11, 12 only: no context at all.
    anchors = torch.tensor([[10]])
    ctx_valid = torch.ones(1, 20, dtype=torch.bool)
    m = dense_mask(anchors, ctx_valid, 4, LayerMaskSpec(window=3, block_causal=True))[0, 0]
    assert m[2, :20].sum() == 0 and m[2, 20:].tolist() == [True, True, True, False]
    # slot 0 (position 10) sees context 8, 9 and itself.
    assert m[0, :20].nonzero().flatten().tolist() == [8, 9] and m[0, 20:].tolist() == [True, False, False, False]


def test_flex_block_mask_matches_dense() -> None:
    """The flex BlockMask evaluates the same mask_mod; check its dense form (CPU)."""
    anchors = torch.tensor([[1, 40, 41, 90], [5, 70, 0, 0]])
    ctx_valid = torch.arange(100)[None, :] < torch.tensor([[100], [80]])
    spec = LayerMaskSpec(window=16, block_causal=True)
    block_mask = flex_block_mask(anchors, ctx_valid, 8, spec, tile=16)
    dense = dense_mask(anchors, ctx_valid, 8, spec)
    b = torch.arange(2)[:, None, None]
    q = torch.arange(32)[None, :, None]
    kv = torch.arange(132)[None, None, :]
    assert torch.equal(dflash_visible(b, q, kv, anchors, ctx_valid, 8, spec)[:, None], dense)
    # The block mask keeps exactly the tiles that hold a visible pair.
    as_dense = block_mask.to_dense()  # [B, 1, q_tiles, kv_tiles]
    kv_tiles = torch.nn.functional.pad(dense, (0, 144 - 132)).reshape(2, 1, 2, 16, 9, 16).any(-1).any(3)
    assert torch.equal(as_dense.bool(), kv_tiles)


@pytest.mark.parametrize("spec", [LayerMaskSpec(window=100, block_causal=True), LayerMaskSpec(window=3, block_causal=False),
                                  LayerMaskSpec(window=None, block_causal=False)])
@pytest.mark.parametrize("q_tile", [32, 16], ids=["two-blocks-per-tile", "one-block-per-tile"])
def test_packed_block_mask_matches_dense(spec: LayerMaskSpec, q_tile: int) -> None:
    """Queries packed by KV group (G=2 heads, blocks of 8: a 32-row query tile holds 2 blocks, a
    16-row one 1; key tiles of 32): the tiles kept, and those marked full, are exactly those of the
    dense mask with its rows packed the same way."""
    groups, block, tile = 2, 8, 32
    anchors = torch.tensor([[60, 100, 101, 110], [70, 150, 0, 0]])
    ctx_valid = torch.arange(200)[None, :] < torch.tensor([[200], [170]])
    packed = flex_packed_block_mask(anchors, ctx_valid, block, spec, groups, tile=tile, q_tile=q_tile)
    dense = dense_mask(anchors, ctx_valid, block, spec)[:, 0]  # [2, 32, 232]
    # pack the rows by hand: row (n, g, k) is query n * 8 + k for both heads g
    rows = torch.tensor([n * block + k for n in range(4) for g in range(groups) for k in range(block)])
    dense_packed = torch.nn.functional.pad(dense[:, rows], (0, 256 - 232)).reshape(2, 64 // q_tile, q_tile, 8, tile)
    kept = packed.block_mask.to_dense()[:, 0].bool()  # partial + full tiles
    full = BlockMask.from_kv_blocks(packed.block_mask.full_kv_num_blocks, packed.block_mask.full_kv_indices,
                                    BLOCK_SIZE=(q_tile, tile), seq_lengths=(64, 232)).to_dense()[:, 0].bool()
    assert torch.equal(kept, dense_packed.any(-1).any(2))
    assert torch.equal(full, dense_packed.all(-1).all(2))
    assert spec.window == 3 or full.any()  # the check of full tiles is not vacuous
    # and the packed attention (rows packed, run, unpacked) equals the dense mask's
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 32, 8), torch.randn(2, 2, 232, 8), torch.randn(2, 2, 232, 8)
    torch.testing.assert_close(attention(q, k, v, packed), attention(q, k, v, dense[:, None]), rtol=1e-5, atol=1e-5)


def test_packed_mask_with_gaps_in_the_context() -> None:
    """Padding inside the context (not only at its end): the packed mask still equals the dense one."""
    spec, groups, block = LayerMaskSpec(window=20, block_causal=True), 2, 8
    anchors = torch.tensor([[30, 45, 50, 60]])
    ctx_valid = torch.ones(1, 64, dtype=torch.bool)
    ctx_valid[0, 35:40] = False
    packed = flex_packed_block_mask(anchors, ctx_valid, block, spec, groups, tile=32)
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 4, 32, 8), torch.randn(1, 2, 96, 8), torch.randn(1, 2, 96, 8)
    dense = dense_mask(anchors, ctx_valid, block, spec)
    assert not torch.equal(dense, dense_mask(anchors, torch.ones_like(ctx_valid), block, spec))  # the gap matters
    torch.testing.assert_close(attention(q, k, v, packed), attention(q, k, v, dense), rtol=1e-5, atol=1e-5)


def test_packing_needs_whole_blocks_per_tile() -> None:
    anchors, ctx_valid = torch.tensor([[1, 40]]), torch.ones(1, 100, dtype=torch.bool)
    spec = LayerMaskSpec(window=16, block_causal=True)
    assert flex_packed_block_mask(anchors, ctx_valid, 16, spec, groups=3) is None  # 48 rows per block
    assert flex_packed_block_mask(anchors, ctx_valid, 16, spec, groups=1) is None  # nothing to pack


def test_sliding_tiles_do_not_grow_with_context() -> None:
    """Visited 128x128 tiles: constant in T for a sliding layer, growing for a full one."""
    def tiles(ctx_len: int, spec: LayerMaskSpec) -> int:
        anchors = torch.arange(ctx_len - 1024, ctx_len, 32)[None]  # 32 anchors in the last 1K tokens
        ctx_valid = torch.ones(1, ctx_len, dtype=torch.bool)
        return int(flex_block_mask(anchors, ctx_valid, 16, spec).to_dense().sum())

    sliding = LayerMaskSpec(window=256, block_causal=True)
    full = LayerMaskSpec(window=None, block_causal=False)
    assert tiles(2048, sliding) == tiles(8192, sliding)
    assert tiles(8192, full) > 3 * tiles(2048, sliding)


@pytest.mark.parametrize("spec_name", list(SPECS))
@pytest.mark.parametrize("q_rows,kv_tile", [(8, 8), (16, 32), (24, 16)])
def test_tile_structure_equals_the_dense_masks_tiles(spec_name: str, q_rows: int, kv_tile: int) -> None:
    """Random sorted anchors, right-padded rows and padded anchor slots: the kept and full tiles computed from the
    anchors are exactly those of the element-by-element mask (any / all visible pairs per tile)."""
    spec, block = SPECS[spec_name], 4
    generator = torch.Generator().manual_seed(7)
    for _ in range(5):
        lengths = torch.randint(10, 60, (3,), generator=generator)
        ctx_valid = torch.arange(60)[None, :] < lengths[:, None]
        anchors = torch.zeros(3, 9, dtype=torch.long)
        for row, length in enumerate(lengths.tolist()):
            count = int(torch.randint(1, 10, (), generator=generator))
            picked = torch.randperm(length - 1, generator=generator)[:count].sort().values
            anchors[row, :len(picked)] = picked
        kept, full = dflash_tile_structure(anchors, ctx_valid, block, spec, q_rows, kv_tile)
        dense = dense_mask(anchors, ctx_valid, block, spec)[:, 0]  # [3, 36, 96]
        q_tiles, kv_tiles = kept.shape[1:]
        tiles = torch.nn.functional.pad(dense.float(), (0, kv_tiles * kv_tile - 96, 0, q_tiles * q_rows - 36), value=-1)
        tiles = tiles.view(3, q_tiles, q_rows, kv_tiles, kv_tile).transpose(2, 3).flatten(3)  # -1: past the ends
        real = tiles >= 0
        assert torch.equal(kept, (tiles == 1).any(-1))
        assert torch.equal(full, ((tiles == 1) | ~real).all(-1) & (tiles == 1).any(-1))


def test_layer_masks_carry_the_flex_kernel_options() -> None:
    """The trainer's flex masks (built on the CPU; flex runs them on a GPU) carry triton_flex_options' forward and
    backward tiles at head_dim 64, trainer.flex_kernel_options over them, and flex-flash FlashAttention-4's kernels."""
    from swa_kernels.attention import FLASH_KERNELS, triton_flex_options
    from train.dflash import build_blocks, layer_masks

    block, n_anchors, length = 16, 8, 256
    input_ids = torch.randint(0, 100, (2, length))
    loss_mask = torch.ones(2, length, dtype=torch.bool)
    anchors = torch.stack([torch.randperm(length - block)[:n_anchors].sort().values for _ in range(2)])
    blocks = build_blocks(input_ids, loss_mask, anchors, torch.ones_like(anchors, dtype=torch.bool), block, 99)
    ctx_valid = torch.ones(2, length, dtype=torch.bool)
    types = ["sliding_attention", "full_attention"]

    def options(backend: str, overrides: dict | None = None, head_dim: int = 64) -> dict:
        masks = layer_masks(blocks, ctx_valid, block, types, 64, True, backend, query_groups=4, head_dim=head_dim, flex_options=overrides)
        assert masks.keys() == set(types)
        return {t: m.kernel_options for t, m in masks.items()}

    defaults = triton_flex_options(64, backward=True)
    assert defaults["BLOCK_M"] == 64 and defaults["BLOCK_M1"] == 64 and defaults["bwd_num_warps"] == 4
    assert options("flex") == {t: defaults for t in types}
    assert options("flex", {"BLOCK_N2": 32, "bwd_num_stages": 3}) == {t: {**defaults, "BLOCK_N2": 32, "bwd_num_stages": 3} for t in types}
    assert options("flex", head_dim=128) == {t: None for t in types}  # larger heads: flex's own defaults
    assert options("flex-flash") == {t: FLASH_KERNELS for t in types}


def test_host_copies_on_the_cpu_are_plain_copies() -> None:
    """common.transfer.to_device_async without a GPU: the tensor itself (no pinning, which needs one)."""
    from common.transfer import to_device_async

    t = torch.arange(6)
    assert to_device_async(t, "cpu") is t
