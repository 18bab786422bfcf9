"""One-off probe: cuDNN's native diagonal band (cudnn-frontend's torch ops) for sliding-window training attention.

    python benchmarks/probe_cudnn_band.py

Checks the band's meaning against a dense mask (window_left = W keys counting the query itself),
the log-sum-exp layout, the backward given (out, lse), then times forward + backward.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.measure import median_ms, require_cuda  # noqa: E402
require_cuda(__doc__, __name__, flags=False)  # one line on a machine without a CUDA GPU


def main() -> None:
    import cudnn
    import cudnn.sdpa.fwd.torch_op  # noqa: F401  (registers torch.ops.cudnn.sdpa_fwd / sdpa_bwd)

    print("cudnn frontend", cudnn.__version__, "backend", cudnn.backend_version(), "torch", torch.__version__,
          torch.cuda.get_device_name())
    torch.manual_seed(0)
    dev = "cuda"
    hq, hkv, d, w = 32, 8, 128, 2048
    scale = d ** -0.5
    t = 4096
    q = torch.randn(1, hq, t, d, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, hkv, t, d, device=dev, dtype=torch.bfloat16)
    v = torch.randn(1, hkv, t, d, device=dev, dtype=torch.bfloat16)
    pos = torch.arange(t, device=dev)
    mask = (pos[None] <= pos[:, None]) & (pos[None] > pos[:, None] - w)
    qr, kr, vr = (x.double().requires_grad_() for x in (q, k, v))
    ref = F.scaled_dot_product_attention(qr, kr, vr, attn_mask=mask, scale=scale, enable_gqa=True)
    dout = torch.randn_like(q)
    ref.backward(dout.double())
    scores = (qr.detach() @ kr.detach().repeat_interleave(hq // hkv, 1).transpose(-1, -2)) * scale
    ref_lse = scores.masked_fill(~mask, float("-inf")).logsumexp(-1)
    out, lse = torch.ops.cudnn.sdpa_fwd(q, k, v, scale, is_causal=True, window_left=w, return_lse=True)
    print("lse", tuple(lse.shape), lse.dtype, "max |lse - ref|", float((lse.reshape(1, hq, t).double() - ref_lse).abs().max()))
    print("out max |d|", float((out.double() - ref).abs().max()))
    dq, dk, dv = torch.ops.cudnn.sdpa_bwd(dout, q, k, v, out, lse, scale, is_causal=True, window_left=w)
    for name, g, r in (("dq", dq, qr.grad), ("dk", dk, kr.grad), ("dv", dv, vr.grad)):
        print(name, tuple(g.shape), "max |d|", float((g.double() - r).abs().max()), "ref max", float(r.abs().max()))
    for wl in (w - 1, w + 1):  # off-by-one would show here
        o2 = torch.ops.cudnn.sdpa_fwd(q, k, v, scale, is_causal=True, window_left=wl, return_lse=True)[0]
        print(f"window_left={wl}: out max |d| vs W={w} reference", float((o2.double() - ref).abs().max()))

    print(f"\n{'case':<40} {'T':>6} {'ms':>8} {'TFLOP/s':>8}")
    for t in (8192, 32768):
        q = torch.randn(1, hq, t, d, device=dev, dtype=torch.bfloat16)
        k = torch.randn(1, hkv, t, d, device=dev, dtype=torch.bfloat16)
        v = torch.randn(1, hkv, t, d, device=dev, dtype=torch.bfloat16)
        dout = torch.randn_like(q)
        for name, wl in (("cudnn band W=2048", w), ("cudnn causal", -1)):
            vis = (w * t - w * (w - 1) // 2) if wl > 0 else t * (t + 1) // 2

            def step():
                o, l = torch.ops.cudnn.sdpa_fwd(q, k, v, scale, is_causal=True, window_left=wl, return_lse=True)
                torch.ops.cudnn.sdpa_bwd(dout, q, k, v, o, l, scale, is_causal=True, window_left=wl)

            def fwd():
                torch.ops.cudnn.sdpa_fwd(q, k, v, scale, is_causal=True, window_left=wl, return_lse=True)

            ms = median_ms(step, warmup=3, repeats=10)
            ms_f = median_ms(fwd, warmup=3, repeats=10)
            flops = 4 * d * hq * vis
            print(f"{name + ' fwd+bwd':<40} {t:>6} {ms:>8.2f} {3.5 * flops / ms / 1e9:>8.0f}")
            print(f"{name + ' fwd':<40} {t:>6} {ms_f:>8.2f} {flops / ms_f / 1e9:>8.0f}")


if __name__ == "__main__":
    main()
