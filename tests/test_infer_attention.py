"""Inference attention layout (``swa_kernels/attention.py``) against element-by-element references.

One dense reference: the query at position p sees key j iff j <= p (causal) and p - W < j (window,
W keys including itself); a non-causal window is the symmetric band |p - j| < W. The drafter's
cached layout must give exactly the training masks of ``models/dflash.py`` for one block.
"""

from __future__ import annotations

import pytest
import torch

from swa_kernels.attention import aligned_mask, cached_attention
from models.dflash import LayerMaskSpec, dense_mask


def reference_mask(q_len: int, k_len: int, causal: bool, window: int | None) -> torch.Tensor:
    mask = torch.zeros(q_len, k_len, dtype=torch.bool)
    for i in range(q_len):
        p = k_len - q_len + i
        for j in range(k_len):
            ok = j <= p if causal else True
            if window is not None:
                ok = ok and p - window < j and (causal or j < p + window)
            mask[i, j] = ok
    return mask


@pytest.mark.parametrize("q_len,k_len", [(1, 1), (1, 9), (5, 5), (4, 13), (16, 40)])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [None, 1, 3, 4, 100])
def test_aligned_mask_matches_elementwise_reference(q_len, k_len, causal, window) -> None:
    got = aligned_mask(q_len, k_len, causal, window, torch.device("cpu"))
    got = torch.ones(q_len, k_len, dtype=torch.bool) if got is None else got
    assert torch.equal(got, reference_mask(q_len, k_len, causal, window))


@pytest.mark.parametrize("anchor", [1, 5, 17])
@pytest.mark.parametrize("block_size", [4, 8])
@pytest.mark.parametrize("spec", [LayerMaskSpec(None, False), LayerMaskSpec(3, True), LayerMaskSpec(6, False),
                                  LayerMaskSpec(1, True), LayerMaskSpec(2, False), LayerMaskSpec(64, True)])
def test_draft_layout_equals_training_mask(anchor, block_size, spec) -> None:
    # inference keys: context positions 0..a-1 then the block a..a+B-1 = training keys for T = a, one anchor at a
    training = dense_mask(torch.tensor([[anchor]]), torch.ones(1, anchor, dtype=torch.bool), block_size, spec)[0, 0]
    got = aligned_mask(block_size, anchor + block_size, spec.block_causal, spec.window, torch.device("cpu"))
    got = torch.ones_like(training) if got is None else got
    assert torch.equal(got, training)


@pytest.mark.parametrize("q_len,k_len,causal,window", [(1, 7, True, None), (6, 11, True, 4), (8, 8, False, None), (5, 12, False, 3)])
def test_cached_attention_sdpa_matches_softmax_loop(q_len, k_len, causal, window) -> None:
    torch.manual_seed(0)
    hq, hkv, d = 4, 2, 8
    q, k, v = torch.randn(q_len, hq, d), torch.randn(k_len, hkv, d), torch.randn(k_len, hkv, d)
    got = cached_attention(q, k, v, causal=causal, window=window, scale=d ** -0.5)
    mask = reference_mask(q_len, k_len, causal, window)
    want = torch.empty_like(got)
    for h in range(hq):
        kv_h = h // (hq // hkv)
        for i in range(q_len):
            scores = torch.tensor([float(q[i, h] @ k[j, kv_h]) * d ** -0.5 if mask[i, j] else float("-inf") for j in range(k_len)])
            want[i, h] = torch.softmax(scores, 0) @ v[:, kv_h]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def flashinfer_rule(q, k, v, causal=False, window_left=-1, sm_scale=None, custom_mask=None):
    """``flashinfer.single_prefill_with_kv_cache`` as its mask reads (include/flashinfer/attention/variants.cuh,
    bottom-right aligned): causal ``kv_idx <= kv_len - qo_len + qo_idx``; the window on the left only,
    ``kv_idx + qo_len + window_left >= kv_len + qo_idx``; a custom mask instead of both. Softmax over the kept keys."""
    q_len, k_len = q.shape[0], k.shape[0]
    if custom_mask is None:
        custom_mask = torch.zeros(q_len, k_len, dtype=torch.bool)
        for i in range(q_len):
            for j in range(k_len):
                custom_mask[i, j] = ((not causal or j <= k_len - q_len + i)
                                     and (window_left < 0 or j + q_len + window_left >= k_len + i))
    groups = q.shape[1] // k.shape[1]
    scores = torch.einsum("qhd,khd->hqk", q, k.repeat_interleave(groups, 1)) * sm_scale
    return torch.einsum("hqk,khd->qhd", scores.masked_fill(~custom_mask, float("-inf")).softmax(-1), v.repeat_interleave(groups, 1))


@pytest.mark.parametrize("q_len,k_len", [(1, 9), (8, 8), (8, 13), (16, 40)])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [None, 1, 3, 7, 8, 100])
def test_the_flashinfer_mapping_equals_the_dense_reference(monkeypatch, q_len, k_len, causal, window) -> None:
    """``backend="flashinfer"`` hands FlashInfer W - 1 as its left window; its window has no right edge, so a non-causal
    band narrower than the queries (a bidirectional sliding layer with W under the block size: the block's slot 0 saw
    slots >= W the training mask hides) goes as a custom mask. Checked through FlashInfer's own mask rule, written out
    element by element, against the dense reference (the GPU test runs the real kernel where it is installed)."""
    import sys
    import types

    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(single_prefill_with_kv_cache=flashinfer_rule))
    torch.manual_seed(0)
    q, k, v = torch.randn(q_len, 4, 8, dtype=torch.float64), torch.randn(k_len, 2, 8, dtype=torch.float64), torch.randn(k_len, 2, 8, dtype=torch.float64)
    got = cached_attention(q, k, v, causal=causal, window=window, scale=0.3, backend="flashinfer")
    want = flashinfer_rule(q, k, v, sm_scale=0.3, custom_mask=reference_mask(q_len, k_len, causal, window))
    torch.testing.assert_close(got, want)


def test_prompt_attention_leaves_cudnn_out_and_puts_the_backends_back(monkeypatch) -> None:
    """Prompt attention (shapes that change call by call) runs with cuDNN's backend off: it builds a plan per new shape
    (50-80 ms a prefill on an H200). The backends a caller had come back after, and the result is SDPA's."""
    import torch.nn.functional as F

    from swa_kernels import attention

    seen = []
    plain = F.scaled_dot_product_attention

    def recording(*args, **kwargs):
        seen.append((torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled(),
                     torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()))
        return plain(*args, **kwargs)

    q, k, v = torch.randn(3, 1, 4, 5, 8).unbind(0)
    before = torch.backends.cuda.cudnn_sdp_enabled()
    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    out = attention.prompt_sdpa(q, k, v, is_causal=True)
    assert seen == [(False, True, True, True)]
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
    torch.testing.assert_close(out, plain(q, k, v, is_causal=True), rtol=0, atol=0)
    # the paths with prompts of changing length go through it: the cached target's, and the static target's waves
    # (regeneration: from position 0, and past a cached prefix)
    seen.clear()
    cached_attention(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), causal=True, window=None, scale=0.5)
    assert seen and not seen[0][0]
    import transformers as tf

    from models.static_target import StaticTarget

    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(tf.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                               num_key_value_heads=2, vocab_size=64, max_position_embeddings=128)).eval()
    target = StaticTarget(model, [])
    target.allocate(64, batch=2)
    for starts in ([0, 0], [5, 9]):
        seen.clear()
        target.prefill_rows([torch.arange(4), torch.arange(7)], [0, 1], starts)
        assert len(seen) == 2 and not any(s[0] for s in seen)
