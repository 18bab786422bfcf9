"""The target's split-KV attention (swa_kernels/decode_attention.py) alone at Qwen3-8B's heads (8 KV heads x 4, D 128), for
each pass-1 tiling (keys per tile, warps, pipelined loads): µs per call (36 calls captured in one CUDA graph), one token
and a 16-token verify at 1K / 8K / 32K, with the keys' read floor at the measured bandwidth beside them. A 16-token
verify has 64 query rows per KV head: its tiles do 16x a one-token step's arithmetic over the same bytes.

    python benchmarks/attention_tilings.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.measure import captured_us, require_cuda  # noqa: E402
from swa_kernels import decode_attention  # noqa: E402
from benchmarks.decode_speed import measured_bandwidth  # noqa: E402
from swa_kernels.decode_attention import Tiling  # noqa: E402
require_cuda(__doc__, __name__, flags=False)  # one line on a machine without a CUDA GPU

KV_HEADS, GROUP, HEAD_DIM, LAYERS = 8, 4, 128, 36
TILINGS = [Tiling(64, 4, 2), Tiling(64, 4, 3), Tiling(64, 4, 4), Tiling(128, 4, 2), Tiling(128, 4, 3), Tiling(128, 8, 2),
           Tiling(128, 8, 3), Tiling(32, 4, 3), Tiling(64, 8, 3)]


def main() -> None:
    bw = measured_bandwidth()["read_TBps"]
    print(f"# {torch.cuda.get_device_name()} | µs per call | read bandwidth {bw:.2f} TB/s")
    print("context | tokens | floor µs | " + " | ".join(f"{t.block_n}/{t.num_warps}w/{t.num_stages}s" for t in TILINGS))
    default = decode_attention.TILING
    for capacity, pos in ((1296, 1024), (8464, 8192), (33040, 32768)):
        k = torch.randn(1, KV_HEADS, capacity, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        p = torch.tensor([pos], device="cuda")
        floor = 2 * KV_HEADS * pos * HEAD_DIM * 2 / bw / 1e6
        for n in (1, 16):
            q = torch.randn(1, KV_HEADS, GROUP * n, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
            ref = None
            row = []
            for tiling in TILINGS:
                decode_attention.TILING = tiling
                try:
                    out = decode_attention.decode_attention(q, k, v, p, n, 0.088)
                    ref = out if ref is None else ref
                    err = (out.float() - ref.float()).abs().max().item()
                    us = captured_us(lambda: decode_attention.decode_attention(q, k, v, p, n, 0.088), LAYERS)
                    row.append(f"{us:.1f}" + ("" if err < 2e-2 else f" (diff {err:.1e})"))
                except Exception as e:  # a tiling Triton cannot compile here (shared memory): said, not fatal
                    row.append(f"failed: {type(e).__name__}")
            print(f"{pos} | {n} | {floor:.1f} | " + " | ".join(row), flush=True)
    decode_attention.TILING = default


if __name__ == "__main__":
    main()
