"""DFlash's context attention as FlashAttention-4 varlen calls, forward only: what a kernel could reach.

    python benchmarks/dflash_fa4_varlen_forward.py --seq 32768 --window 2048 --anchors 512

Feasibility measurement for the DFlash training mask (models/dflash.py), not a trainer path. Query
slot i of a block anchored at a sees the context keys [a + i - W + 1, a - 1] (and its own block's
keys, left out here). One varlen sequence per block: its 16 queries, and the context keys from
max(0, a - W + 1) to a - 1 given as an offset into the shared key tensor (``cu_seqlens_k`` = start,
``seqused_k`` = length: the sequences' key ranges overlap). With the queries aligned to the end of
their keys (FlashAttention's bottom-right rule), slot i sits at L - 16 + i and a left window of
W - 17 gives it exactly its keys; ``pack_gqa`` puts the 4 query heads of a KV head in one tile
(64 rows of one key range). The backward has no such path in FA4 (no ``pack_gqa``, and dK / dV are
written per sequence, so overlapping ranges would overwrite each other): this measures the forward.

Rows (bf16, forward only, TFLOP/s = 4 * D * Hq * visible context pairs / time):
  fa4 window              FA4's sliding window over all T positions (the rate to compare with)
  flex (FLASH) dflash     the trainer's packed block mask, context and block keys, forward only
  fa4 varlen dflash ctx   the construction above (context keys only), checked against a dense
                          per-block reference on a sample of blocks; also with 64-row tiles
                          (FA4's ``tile_mn``): a block packs 64 query rows
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.measure import median_ms  # noqa: E402
from swa_kernels.attention import FLASH_KERNELS, attention  # noqa: E402
from swa_kernels.window_attention import fa4_available  # noqa: E402
from models.dflash import LayerMaskSpec, flex_packed_block_mask  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq", type=int, default=32768)
    parser.add_argument("--window", type=int, default=2048)
    parser.add_argument("--anchors", type=int, default=512)
    parser.add_argument("--block", type=int, default=16)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args()
    if not fa4_available():
        sys.exit("dflash_fa4_varlen_forward.py: needs flash-attn-4 (pip install -e '.[fa4]') and a Hopper or newer GPU")
    from flash_attn.cute.interface import _flash_attn_fwd

    t, w, n, bs, hq, hkv, d = args.seq, args.window, args.anchors, args.block, args.heads, args.kv_heads, args.head_dim
    dev, dt = "cuda", torch.bfloat16
    torch.manual_seed(0)
    anchors = torch.randperm(t - bs, device=dev)[:n].sort().values.clamp(min=1)  # anchor 0 has no context keys
    k, v = (torch.randn(t, hkv, d, device=dev, dtype=dt) for _ in range(2))
    q = torch.randn(n * bs, hq, d, device=dev, dtype=dt)
    scale = d ** -0.5
    start = (anchors - w + 1).clamp(min=0)
    length = anchors - start
    cu_q = torch.arange(n + 1, device=dev, dtype=torch.int32) * bs
    cu_k = torch.cat([start, anchors[-1:]]).to(torch.int32)  # only the starts are read (lengths: seqused_k)
    used_k = length.to(torch.int32)
    slot = torch.arange(bs, device=dev)
    pairs = int((anchors[:, None] - (anchors[:, None] + slot - w + 1).clamp(min=0)).clamp(min=0).sum())

    def varlen_ctx(tile_mn=None):
        return _flash_attn_fwd(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, seqused_k=used_k, max_seqlen_q=bs,
                               max_seqlen_k=w - 1, softmax_scale=scale, window_size_left=w - bs - 1,
                               window_size_right=bs - 1, pack_gqa=True, return_lse=True, tile_mn=tile_mn)[:2]

    out, lse = varlen_ctx()
    # dense reference on a sample of blocks: each block's keys gathered, its per-slot mask built pair by pair
    worst = 0.0
    for b in torch.linspace(0, n - 1, 16).long().tolist():
        a, s0 = int(anchors[b]), int(start[b])
        keys, vals = k[s0:a].float(), v[s0:a].float()
        pos = torch.arange(s0, a, device=dev)
        mask = pos[None, :] >= (a + slot[:, None] - w + 1)  # [slot, key]
        qb = q[b * bs:(b + 1) * bs].float()  # [slot, Hq, D]
        scores = torch.einsum("shd,khd->hsk", qb, keys.repeat_interleave(hq // hkv, 1)) * scale
        ref = torch.einsum("hsk,khd->shd", scores.masked_fill(~mask, float("-inf")).softmax(-1),
                           vals.repeat_interleave(hq // hkv, 1))
        worst = max(worst, float((out[b * bs:(b + 1) * bs].float() - ref).abs().max() / ref.abs().max()))
    print(f"fa4 varlen dflash ctx vs dense per-block reference (16 blocks): max relative difference {worst:.1e}")

    rows = []
    flops_ctx = 4 * d * hq * pairs
    ms = median_ms(varlen_ctx)
    rows.append(("fa4 varlen dflash ctx (pack_gqa, overlapping key ranges)", pairs, ms, flops_ctx / ms / 1e9))
    # FA4's SM90 forward tile is 128 query rows; a block packs 4 heads x 16 slots = 64: half a tile
    for tile_mn in ((64, 128), (64, 176)):
        try:
            got = varlen_ctx(tile_mn)[0]
            ms = median_ms(lambda: varlen_ctx(tile_mn))
            diff = float((got.float() - out.float()).abs().max() / out.float().abs().max())
            rows.append((f"fa4 varlen dflash ctx, {tile_mn[0]} x {tile_mn[1]} tiles (vs 128-row: {diff:.1e})", pairs, ms,
                         flops_ctx / ms / 1e9))
        except Exception as e:  # a tile FA4 cannot build on this GPU
            print(f"tile {tile_mn}: {type(e).__name__}: {str(e)[:160]}")
    # the plain window over T positions, same kernels
    qw = torch.randn(1, t, hq, d, device=dev, dtype=dt)
    win_pairs = sum(min(w, i + 1) for i in range(t))
    ms = median_ms(lambda: _flash_attn_fwd(qw, k[None], v[None], softmax_scale=scale, causal=True, window_size_left=w - 1,
                                           return_lse=True))
    rows.append(("fa4 window", win_pairs, ms, 4 * d * hq * win_pairs / ms / 1e9))
    # the trainer's DFlash attention on FA4's block-sparse path (context + block keys), forward only
    spec = LayerMaskSpec(window=w, block_causal=True)
    valid = torch.ones(1, t, dtype=torch.bool, device=dev)
    packed = flex_packed_block_mask(anchors[None], valid, bs, spec, hq // hkv, kernel_options=FLASH_KERNELS)
    qd = q.view(1, n * bs, hq, d).transpose(1, 2)
    kd, vd = (torch.cat([x, torch.randn(n * bs, hkv, d, device=dev, dtype=dt)])[None].transpose(1, 2) for x in (k, v))
    block_pairs = n * bs * (bs + 1) // 2
    with torch.no_grad():
        ms = median_ms(lambda: attention(qd, kd, vd, packed))
    rows.append(("flex (FLASH) dflash packed (context + block keys)", pairs + block_pairs, ms,
                 4 * d * hq * (pairs + block_pairs) / ms / 1e9))

    print(f"{torch.cuda.get_device_name()}, bf16, T={t} W={w} {n} blocks of {bs}, Hq={hq} Hkv={hkv} D={d}, forward only")
    print("| attention | visible pairs | ms | TFLOP/s |")
    print("|---|---:|---:|---:|")
    for name, p, ms, tf in rows:
        print(f"| {name} | {p:,} | {ms:.3f} | {tf:.0f} |")


if __name__ == "__main__":
    main()
