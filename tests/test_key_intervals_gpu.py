"""FlashAttention-4 with per-row key intervals (``swa_kernels.key_intervals``) against PyTorch attention
under the dense mask built element by element from the same intervals, and against DFlash's own
dense mask (skipped without flash-attn-4 on a Hopper GPU)."""

from __future__ import annotations

import pytest
import torch

from swa_kernels.key_intervals import ctx_keys_for, dflash_key_intervals, key_interval_attention, plan_key_intervals, reference_attention
from swa_kernels.window_attention import fa4_available
from models.dflash import LayerMaskSpec, dense_mask

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and fa4_available()
                                     and torch.cuda.get_device_capability()[0] == 9),
                                reason="needs flash-attn-4 on a Hopper GPU")


def dflash_tensors(ctx_len: int, n: int, hq: int, hkv: int, block: int = 16, seed: int = 0, d: int = 128):
    torch.manual_seed(seed)
    bsz = 2
    anchors = torch.sort(torch.randint(1, ctx_len - 40, (bsz, n), device="cuda")).values
    anchors[1, -3:] = 0  # padded anchor slots see no context
    lengths = torch.tensor([ctx_len, ctx_len - 37], device="cuda")
    keys = ctx_keys_for(ctx_len) + n * block
    q = torch.randn(bsz, n * block, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(bsz, keys, hkv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    return anchors, lengths, q, k, v


def grads(fn, q, k, v):
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = fn(q, k, v)
    out.float().square().sum().backward()
    return [out.detach().float(), q.grad.float(), k.grad.float(), v.grad.float()]


@pytest.mark.parametrize("ctx_len,n,window,causal,hq,hkv,d", [
    (3000, 40, 2048, True, 8, 2, 128),     # GQA 4: the forward packs 4 heads x 16 slots per block
    (3000, 40, 100, False, 8, 2, 128),     # a window shorter than the anchors' spread, bidirectional blocks
    (1000, 24, None, False, 4, 4, 128),    # full attention, no GQA
    (4096, 64, 512, True, 32, 8, 128),     # the 8B shape's heads
    (3000, 40, 256, True, 8, 4, 64),       # head_dim 64: FA4's backward takes 128-row tiles
    (2000, 41, 256, True, 8, 2, 64),       # an odd number of blocks: the last query tile is half empty
])
def test_fa4_key_intervals_equal_dense_reference(ctx_len, n, window, causal, hq, hkv, d) -> None:
    block = 16
    anchors, lengths, q, k, v = dflash_tensors(ctx_len, n, hq, hkv, block, d=d)
    rows = dflash_key_intervals(anchors, lengths, block, window, causal, ctx_keys_for(ctx_len))
    plan = plan_key_intervals(rows, hq // hkv, k.shape[1], d)
    got = grads(lambda q, k, v: key_interval_attention(q, k, v, plan), q, k, v)
    want = grads(lambda q, k, v: reference_attention(q.float(), k.float(), v.float(), rows), q, k, v)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        rel = float((a - b).norm() / b.norm())
        assert rel < 1e-2, f"{name}: relative difference {rel:.2e}"

    # and the intervals are DFlash's mask: the reference on models.dflash.dense_mask, keys re-laid out
    ctx_valid = torch.arange(ctx_len, device="cuda")[None] < lengths[:, None]
    mask = dense_mask(anchors, ctx_valid, block, LayerMaskSpec(window, causal))
    pad = ctx_keys_for(ctx_len) - ctx_len
    keep = torch.cat([torch.arange(ctx_len), ctx_len + pad + torch.arange(n * block)]).cuda()
    qt = q.float().transpose(1, 2)
    kt, vt = (x.float()[:, keep].transpose(1, 2).repeat_interleave(hq // hkv, 1) for x in (k, v))
    dflash = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask).transpose(1, 2)
    rel = float((got[0] - dflash).norm() / dflash.norm())
    assert rel < 1e-2, f"out vs DFlash's dense mask: relative difference {rel:.2e}"


def test_group_major_heads_and_head_swap() -> None:
    """q with heads ordered g * Hkv + h through the copy-free path equals the Hugging Face order;
    the Triton head swap equals PyTorch's transpose."""
    from swa_kernels.fa4_key_intervals import swap_heads

    hq, hkv, block = 8, 2, 16
    anchors, lengths, q, k, v = dflash_tensors(2000, 32, hq, hkv, block, seed=1)
    rows = dflash_key_intervals(anchors, lengths, block, 512, True, ctx_keys_for(2000))
    plan = plan_key_intervals(rows, hq // hkv, k.shape[1])
    order = torch.arange(hq, device="cuda").view(hkv, hq // hkv).t().reshape(-1)  # group-major slot -> HF head
    hf = grads(lambda q, k, v: key_interval_attention(q, k, v, plan), q, k, v)
    gm = grads(lambda q, k, v: key_interval_attention(q[:, :, order], k, v, plan, group_major=True)[:, :, order.argsort()], q, k, v)
    for name, a, b in zip(("out", "dq", "dk", "dv"), gm, hf):
        rel = float((a - b).norm() / b.norm())
        assert rel < 1e-3, f"{name}: relative difference {rel:.2e}"
    x = torch.randn(2, 7, 8 * 4, 128, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(swap_heads(x, 8, 4), x.view(2, 7, 8, 4, 128).transpose(2, 3).reshape(2, 7, 32, 128), rtol=0, atol=0)


@pytest.mark.parametrize("group_major", [False, True])
def test_key_intervals_compile_as_one_graph(group_major: bool) -> None:
    """FA4's entry points are custom ops: the attention compiles with ``fullgraph=True`` (Dynamo broke the
    graph inside FA4's Python before) and gives eager's output and gradients (the same kernels; FA4's backward
    adds dQ with atomics, so a few elements differ by an ulp between any two runs)."""
    torch._dynamo.reset()
    hq, hkv, block = 8, 2, 16
    anchors, lengths, q, k, v = dflash_tensors(2000, 32, hq, hkv, block, seed=2)
    rows = dflash_key_intervals(anchors, lengths, block, 512, True, ctx_keys_for(2000))
    plan = plan_key_intervals(rows, hq // hkv, k.shape[1])

    def attend(q, k, v):
        return key_interval_attention(q, k, v, plan, group_major=group_major)

    eager = grads(attend, q, k, v)
    compiled = grads(torch.compile(attend, fullgraph=True), q, k, v)
    for name, a, b in zip(("out", "dq", "dk", "dv"), compiled, eager):
        rel = float((a - b).norm() / b.norm())
        assert rel < 1e-4, f"{name}: relative difference {rel:.2e}"
