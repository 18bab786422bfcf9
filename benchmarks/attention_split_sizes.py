"""The target's split-KV attention (swa_kernels/decode_attention.py) at Qwen3-8B's heads (8 KV heads x 4, D 128) for each
split size (keys per pass-1 program) and pass-1 tiling: µs per call, 36 calls captured in one CUDA graph, **each call on
its own layer's cache** as in the loop (one cache reused by every call stays in L2 at 8K and flatters the time). One
token and a 16-token verify at 1K / 8K / 32K, the keys' read floor at the measured bandwidth beside, the current rule's
choice (``split_size``, ``tiling_for``) marked with ``*``.

Why split sizes: every split writes its query rows' fp32 partials (rows x D x 4 bytes) that the merge reads back; a
verify's 64 rows per KV head over 512-key splits move a quarter of the keys' bytes again, while longer splits leave
fewer programs to hide each one's latency.

Tilings are written ``keys per tile/warps/stages``. (Splitting a KV head's 64 verify rows over programs of 16 or 32
rows, each reading the same keys, was slower at every context and split size: BENCHMARKS.md, "A verify's query rows
in blocks".) The attention alone, back to back, is a guide: a split rule faster here ran the DFlash loop 1.1% slower
(BENCHMARKS.md, "The split rule between 1K and 32K"); ``decode_speed.py`` decides.

    python benchmarks/attention_split_sizes.py [--contexts 8192 32768] [--tokens 16] [--tilings 64/4/3 32/4/3] [--split-keys 256 512]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.decode_speed import measured_bandwidth  # noqa: E402
from benchmarks.measure import captured_us, require_cuda  # noqa: E402
from swa_kernels import decode_attention  # noqa: E402
from swa_kernels.decode_attention import Tiling  # noqa: E402
require_cuda(__doc__, __name__, flags=True)  # one line on a machine without a CUDA GPU

KV_HEADS, GROUP, HEAD_DIM, LAYERS = 8, 4, 128, 36
SPLIT_KEYS = (128, 256, 512, 768, 1024, 1536, 2048, 4096)
TILINGS = ("64/4/2", "64/4/3", "32/4/3")
# the capacities decode_speed.py allocates: context + 256 new + 16 verified tokens, which StaticTarget rounds up to 256s
CAPACITY = {c: 256 * -(-(c + 272) // 256) for c in (1024, 2048, 4096, 8192, 16384, 32768)}


def layer_caches(capacity: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One (keys, values) cache [1, Hkv, capacity, D] bf16 per layer: each call reads its own, as the loop's layers do."""
    return [(torch.randn(1, KV_HEADS, capacity, HEAD_DIM, device="cuda", dtype=torch.bfloat16),
             torch.randn(1, KV_HEADS, capacity, HEAD_DIM, device="cuda", dtype=torch.bfloat16)) for _ in range(LAYERS)]


def keys_floor_us(pos: int, read_tbps: float) -> float:
    """Microseconds to read ``pos`` positions' keys and values of every KV head at the measured bandwidth."""
    return 2 * KV_HEADS * pos * HEAD_DIM * 2 / read_tbps / 1e6


def us_over_layers(call) -> float:
    """µs per call of ``call(i)``, ``LAYERS`` calls on caches 0 .. LAYERS-1 captured in one graph (``captured_us``, which
    calls once more first, outside the graph: the layer index wraps)."""
    calls = itertools.count()
    return captured_us(lambda: call(next(calls) % LAYERS), LAYERS)


def parse_tiling(text: str) -> Tiling:
    """``keys per tile/warps/stages`` -> Tiling."""
    try:
        block_n, warps, stages = (int(p) for p in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--tilings {text!r}: expected keys per tile/warps/stages, e.g. 64/4/3") from None
    return Tiling(block_n, warps, stages)


def label(t: Tiling) -> str:
    return f"{t.block_n}/{t.num_warps}w/{t.num_stages}s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 8192, 32768], choices=sorted(CAPACITY))
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--tilings", type=parse_tiling, nargs="+", default=[parse_tiling(t) for t in TILINGS])
    parser.add_argument("--split-keys", type=int, nargs="+", default=list(SPLIT_KEYS), help="keys per split to sweep")
    args = parser.parse_args()
    bw = measured_bandwidth()["read_TBps"]
    print(f"# {torch.cuda.get_device_name()} | µs per call, 36 calls on 36 caches | read bandwidth {bw:.2f} TB/s")
    print("context | tokens | floor µs | split keys (programs, partial bytes / key bytes) | "
          + " | ".join(label(t) for t in args.tilings))
    rule_split, rule_tiling = decode_attention.split_size, decode_attention.TILING
    try:
        for pos in args.contexts:
            capacity = CAPACITY[pos]
            caches = layer_caches(capacity)
            p = torch.tensor([pos], device="cuda")
            floor = keys_floor_us(pos, bw)
            for n in args.tokens:
                rows = GROUP * n
                q = torch.randn(1, KV_HEADS, rows, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
                decode_attention.split_size, decode_attention.TILING = rule_split, rule_tiling  # the rule, for the reference
                ref = decode_attention.decode_attention(q, *caches[0], p, n, 0.088).float()
                chosen_tiling = decode_attention.tiling_for(rows, q.device)
                chosen = rule_split(capacity, KV_HEADS, q.device, rows, chosen_tiling.block_n)
                for keys in sorted(set(args.split_keys) | {chosen}):
                    if keys > 2 * pos:
                        continue
                    splits = -(-capacity // keys)
                    live = -(-pos // keys)  # splits holding keys the rows see
                    partial = live * rows * HEAD_DIM * 4 * 2 / (2 * pos * HEAD_DIM * 2)  # written + read back
                    row = []
                    for tiling in args.tilings:
                        if keys % tiling.block_n:  # a split is whole tiles
                            row.append("-")
                            continue
                        decode_attention.TILING = tiling
                        decode_attention.split_size = lambda *a, _k=keys, **kw: _k  # noqa: E731 (the swept size)
                        out = decode_attention.decode_attention(q, *caches[0], p, n, 0.088)
                        err = (out.float() - ref).abs().max().item()
                        us = us_over_layers(lambda i: decode_attention.decode_attention(q, *caches[i], p, n, 0.088))
                        mark = "*" if (keys == chosen and tiling == chosen_tiling) else ""
                        row.append(f"{us:.1f}{mark}" + ("" if err < 2e-2 else f" (diff {err:.1e})"))
                    print(f"{pos} | {n} | {floor:.1f} | {keys} ({splits * KV_HEADS}, {partial:.0%}) | " + " | ".join(row), flush=True)
            del caches
            torch.cuda.empty_cache()
    finally:
        decode_attention.split_size, decode_attention.TILING = rule_split, rule_tiling


if __name__ == "__main__":
    main()
