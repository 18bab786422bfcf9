"""FlashAttention-4's forward (GQA packed, split over the keys where the GPU allows it) against the target's split-KV kernel
(``swa_kernels/decode_attention.py``) for a one-token step and a 16-token verify at Qwen3-8B's heads (8 KV heads x 4,
D 128, bf16): µs per call, 36 calls on 36 caches captured in one CUDA graph, as ``attention_split_sizes.py`` times.

Why: what keeps DFlash's whole block at the line at 8K is the verify's attention over the one-token step's
(BENCHMARKS.md, "A verify's query rows in blocks"); only time the verify saves over the one-token step raises the
speedup per τ. This asks whether FA4's kernel pays less for 64 query rows a KV head than ours does. Both read the same
cache ([B, Hkv, C, D], FA4 through a [B, C, Hkv, D] view); FA4 sees ``seqused_k`` = the context + the new tokens, its
causal mask aligned bottom-right (token t sees keys up to pos + t, as ours). The new tokens' keys are in the cache
already for both (the loop's kernel also writes them and applies RoPE; not timed here).

Found on an H200 with flash-attn-4 4.0.0b36 (BENCHMARKS.md, "FlashAttention-4 as the verify's attention"): its Hopper
forward refuses split-KV ("SplitKV not supported on SM 9.0", ``num_splits`` 0 or > 1), and with one split (one program
a KV head) it takes 91 µs at 8K against our 21 µs. ``--splits 0 8 16 32`` are for Blackwell, where FA4 splits.

FA4's entry point with ``seqused_k`` is ``flash_attn.cute.interface._flash_attn_fwd`` (private): reached through
``swa_kernels/fa4_adapter.py``, which checks the installed version and the recorded signature first; the script stops with
its one line if they differ.

    python benchmarks/fa4_decode_attention.py [--contexts 1024 8192 32768] [--tokens 1 16] [--splits 1 0 8 16 32]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.attention_split_sizes import (CAPACITY, GROUP, HEAD_DIM, KV_HEADS, LAYERS, keys_floor_us,  # noqa: E402
                                               layer_caches, us_over_layers)
from benchmarks.decode_speed import measured_bandwidth  # noqa: E402
from swa_kernels import decode_attention, fa4_adapter  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 8192, 32768], choices=sorted(CAPACITY))
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--splits", type=int, nargs="+", default=[1, 0],
                        help="FA4's num_splits to try (0: its own heuristic; Hopper takes 1 only)")
    args = parser.parse_args()
    try:
        fwd = fa4_adapter.interface("benchmarks/fa4_decode_attention.py")._flash_attn_fwd
    except ValueError as e:
        sys.exit(str(e))
    bw = measured_bandwidth()["read_TBps"]
    scale = HEAD_DIM ** -0.5
    print(f"# {torch.cuda.get_device_name()} | µs per call, {LAYERS} calls on {LAYERS} caches | read bandwidth {bw:.2f} TB/s")
    print("context | tokens | keys' floor µs | ours (the rule's splits) | " + " | ".join(f"FA4 splits={s or 'auto'}" for s in args.splits)
          + " | FA4 max |diff| vs ours")
    for pos in args.contexts:
        capacity = CAPACITY[pos]
        caches = layer_caches(capacity)
        p = torch.tensor([pos], device="cuda")
        floor = keys_floor_us(pos, bw)
        for n in args.tokens:
            # ours: q [B, Hkv, G*n, D], rows (g, t); FA4: q [B, n, Hq, D], head h * G + g (the same heads)
            q_fa = torch.randn(1, n, KV_HEADS * GROUP, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
            q_ours = q_fa.view(1, n, KV_HEADS, GROUP, HEAD_DIM).permute(0, 2, 3, 1, 4).reshape(1, KV_HEADS, GROUP * n, HEAD_DIM)
            used = torch.tensor([pos + n], device="cuda", dtype=torch.int32)

            def ours(i: int):
                return decode_attention.decode_attention(q_ours, *caches[i], p, n, scale)

            def fa4(i: int, splits: int):
                k, v = caches[i]
                return fwd(q_fa, k.transpose(1, 2), v.transpose(1, 2), seqused_k=used, softmax_scale=scale, causal=True,
                           num_splits=splits, pack_gqa=True)[0]

            ref = ours(0).view(1, KV_HEADS, GROUP, n, HEAD_DIM).permute(0, 3, 1, 2, 4).reshape(1, n, KV_HEADS * GROUP, HEAD_DIM).float()
            row = [f"{us_over_layers(ours):.1f}"]
            diffs = []
            for s in args.splits:
                try:
                    diffs.append((fa4(0, s).float() - ref).abs().max().item())
                    row.append(f"{us_over_layers(lambda i: fa4(i, s)):.1f}")
                except Exception as e:  # a setting FA4 refuses or a graph it cannot be captured in: say which, go on
                    row.append(f"failed: {type(e).__name__}: {str(e).splitlines()[0][:80]}")
            print(f"{pos} | {n} | {floor:.1f} | " + " | ".join(row) + f" | {max(diffs, default=float('nan')):.1e}", flush=True)
        del caches
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
