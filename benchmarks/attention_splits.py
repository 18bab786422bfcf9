"""Split-KV decode attention (kernels/decode_attention.py) alone at Qwen3-8B's heads (8 KV heads x 4, D 128): µs per call
(36 calls captured in one CUDA graph) for one token and a 16-token verify, at 1K / 8K / 32K, for each minimum of keys
per query row a split reads (KEYS_PER_ROW, capped where the programs would no longer fill the SMs once; 0 = splits by
capacity alone, the rule before it).

    python benchmarks/attention_splits.py
"""
import sys, torch
sys.path.insert(0, ".")
from kernels import decode_attention as da
from benchmarks.decode_speed import cuda_ms
print(f"# {torch.cuda.get_device_name()} | µs per call")
hkv, g, d = 8, 4, 128
for cap, pos in ((1296, 1024), (8464, 8192), (33040, 32768)):
    k = torch.randn(1, hkv, cap, d, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
    p = torch.tensor([pos], device="cuda")
    for n in (1, 16):
        q = torch.randn(1, hkv, g * n, d, device="cuda", dtype=torch.bfloat16)
        row = []
        for kpr in (0, 2, 4, 8, 16):
            da.KEYS_PER_ROW = kpr
            fn = lambda: da.decode_attention(q, k, v, p, n, 0.088)
            fn(); torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(36):
                    fn()
            us = 1e3 * cuda_ms(graph.replay, repeats=10) / 36
            row.append(f"kpr {kpr}: {us:.1f}")
        print(f"context {pos} tokens {n}: " + " | ".join(row), flush=True)
