"""Compile FlashInfer's JIT kernels for the head dims and window settings the loop uses (first use
of each variant takes ~90 s on a 16-core host; later calls read the cache)."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from swa_kernels.attention import cached_attention  # noqa: E402
from benchmarks.measure import require_cuda  # noqa: E402
require_cuda(__doc__, __name__, flags=False)  # one line on a machine without a CUDA GPU

for head_dim in [int(a) for a in sys.argv[1:]] or [64, 128]:
    for window in (None, 2048):
        q = torch.randn(16, 8, head_dim, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(3000, 2, head_dim, device="cuda", dtype=torch.bfloat16)
        cached_attention(q, k, k, causal=True, window=window, scale=head_dim ** -0.5, backend="flashinfer")
        print("compiled", head_dim, window, flush=True)
