"""One attention entry point: flex_attention for a ``BlockMask``, SDPA for a dense boolean mask.

Shapes: q [B, Hq, Q, D], k/v [B, Hkv, K, D] (grouped-query attention when Hq > Hkv); returns
[B, Hq, Q, D]. The backend follows the mask type, so the caller picks it once when it builds masks
(flex on CUDA, dense SDPA on CPU; tests may force either).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


@functools.cache
def compiled_flex_attention():
    from torch.nn.attention.flex_attention import flex_attention

    # flex_attention only reaches kernel speed compiled; compiled once per process.
    return torch.compile(flex_attention, dynamic=False)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, scale: float | None = None) -> torch.Tensor:
    """Masked attention; ``mask`` is a flex ``BlockMask`` or a bool tensor broadcastable to [B, Hq, Q, K]."""
    if isinstance(mask, torch.Tensor) or mask is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    from torch.nn.attention.flex_attention import flex_attention

    flex = compiled_flex_attention() if q.is_cuda else flex_attention  # eager flex: CPU tests only
    return flex(q, k, v, block_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
