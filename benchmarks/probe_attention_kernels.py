"""Probe: which attention kernels could serve windowed training attention on this GPU, and how fast
(SDPA's causal backends, flex window BlockMasks under several kernel options, batched causal chunks).
    python benchmarks/probe_attention_kernels.py
Findings on the H100 are in BENCHMARKS.md (issue 8)."""
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.measure import median_ms, require_cuda  # noqa: E402
require_cuda(__doc__, __name__, flags=False)  # one line on a machine without a CUDA GPU

print(torch.__version__, torch.cuda.get_device_name())
W, HQ, HKV, D = 2048, 32, 8, 128
flex = torch.compile(flex_attention, dynamic=False)


rows = []


def case(name, fn, pairs, batch_heads=HQ):
    try:
        ms = median_ms(fn)
        rows.append((name, ms, 3.5 * 4 * D * pairs * batch_heads / ms / 1e9))
    except Exception as ex:  # noqa: BLE001
        rows.append((name, None, f"{type(ex).__name__}: {str(ex)[:150]}"))
    print(rows[-1], flush=True)


for T in (8192, 32768):
    mk = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16, requires_grad=True)  # noqa: E731
    q, k, v = mk(1, HQ, T, D), mk(1, HKV, T, D), mk(1, HKV, T, D)
    kx, vx = [t.detach().repeat_interleave(HQ // HKV, 1).requires_grad_() for t in (k, v)]
    causal = T * (T + 1) // 2
    win = sum(min(i + 1, W) for i in range(T))

    def run_sdpa(q=q, k=k, v=v, gqa=True):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        o.backward(torch.ones_like(o))
    case(f"T={T} sdpa causal default", run_sdpa, causal)
    for be in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        def run_be(be=be):
            with sdpa_kernel([be]):
                run_sdpa()
        case(f"T={T} sdpa causal {be.name} gqa", run_be, causal)

        def run_bex(be=be):
            with sdpa_kernel([be]):
                run_sdpa(q, kx, vx, False)
        case(f"T={T} sdpa causal {be.name} expanded kv", run_bex, causal)

    pos = torch.arange(T, device="cuda")
    bm = create_block_mask(lambda b, h, qi, ki: (ki <= qi) & (qi - ki < W), 1, None, T, T, device="cuda")

    def run_flex(opts=None):
        o = flex(q, k, v, block_mask=bm, enable_gqa=True, kernel_options=opts)
        o.backward(torch.ones_like(o))
    case(f"T={T} flex window default", run_flex, win)
    for opts in ({"USE_TMA": True}, {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2},
                 {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3, "USE_TMA": True},
                 {"BLOCK_M1": 64, "BLOCK_N1": 128, "BLOCK_M2": 128, "BLOCK_N2": 64, "num_warps": 8, "num_stages": 2}):
        case(f"T={T} flex window {opts}", lambda opts=opts: run_flex(opts), win)

    # the chunked decomposition's kernel cost: T/W chunks x causal W x W, twice (cudnn/flash, batched)
    C = W
    qc, kc, vc = mk(T // C, HQ, C, D), mk(T // C, HKV, C, D), mk(T // C, HKV, C, D)
    kcx, vcx = [t.detach().repeat_interleave(HQ // HKV, 1).requires_grad_() for t in (kc, vc)]
    for be in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        def run_chunks(be=be):
            with sdpa_kernel([be]):
                for _ in range(2):
                    o = F.scaled_dot_product_attention(qc, kcx, vcx, is_causal=True)
                    o.backward(torch.ones_like(o))
        case(f"T={T} 2 x chunked causal {be.name} (expanded kv)", run_chunks, win)
    del q, k, v, kx, vx, qc, kc, vc, kcx, vcx
    torch.cuda.empty_cache()

print("| case | ms | TFLOP/s (3.5x fwd, visible pairs) |")
for r in rows:
    print(f"| {r[0]} | {r[1] if r[1] is None else round(r[1], 2)} | {r[2] if isinstance(r[2], str) else round(r[2])} |")
