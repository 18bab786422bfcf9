"""Split-KV decode attention (swa_kernels/decode_attention.py) alone at Qwen3-8B's heads (8 KV heads x 4, D 128): µs per call
(36 calls captured in one CUDA graph) for one token and a 16-token verify, at 1K / 8K / 32K, for each minimum of keys
per query row a split reads (KEYS_PER_ROW, capped where the programs would no longer fill the SMs once; 0 = splits by
capacity alone, the rule before it).

    python benchmarks/attention_splits.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.measure import captured_us, require_cuda  # noqa: E402
from swa_kernels import decode_attention  # noqa: E402
require_cuda(__doc__, __name__, flags=False)  # one line on a machine without a CUDA GPU

KV_HEADS, GROUP, HEAD_DIM, LAYERS = 8, 4, 128, 36


def main() -> None:
    print(f"# {torch.cuda.get_device_name()} | µs per call")
    default = decode_attention.KEYS_PER_ROW
    for capacity, pos in ((1296, 1024), (8464, 8192), (33040, 32768)):
        k = torch.randn(1, KV_HEADS, capacity, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        p = torch.tensor([pos], device="cuda")
        for n in (1, 16):
            q = torch.randn(1, KV_HEADS, GROUP * n, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
            row = []
            for keys_per_row in (0, 2, 4, 8, 16):
                decode_attention.KEYS_PER_ROW = keys_per_row  # read by split_size at each call
                us = captured_us(lambda: decode_attention.decode_attention(q, k, v, p, n, 0.088), LAYERS)
                row.append(f"kpr {keys_per_row}: {us:.1f}")
            print(f"context {pos} tokens {n}: " + " | ".join(row), flush=True)
    decode_attention.KEYS_PER_ROW = default


if __name__ == "__main__":
    main()
