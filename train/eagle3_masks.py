"""Attention masks for EAGLE-3 training-time test (TTT), as pure functions.

Step j (0-based) of the unrolled drafter runs T queries, one per index t, and writes T new keys.
Its queries see the keys of steps 0..j laid side by side:

    keys     kv = s * T + u          step s, index u        (K = (j + 1) * T)
    position index u at step s sits at RoPE position u + 1 + s (train/models/eagle3.py)

A query (index t, step j, position p = t + 1 + j) sees
    step-0 keys   u <= t (causal), u a real token or u == t          -- the context cache
    step-s keys   u == t for 1 <= s <= j (the diagonal)               -- its own earlier drafts
and in a sliding layer only keys at positions > p - W (W keys counting the query itself), the
window the same query has at inference: the context cache's last positions and the draft chain.
Every query sees itself (step j, index t), so no softmax row is empty (padding rows included).

``ttt_visible`` uses tensor ops only: it fills a dense boolean mask for SDPA (CPU) and is the
flex_attention ``mask_mod`` (GPU), whose block mask skips every tile the window rules out.
"""

from __future__ import annotations

import torch

# Legend: Bsz batch, T indices per step, j step, K = (j + 1) * T keys.


def ttt_visible(b: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor, step: int, ctx_valid: torch.Tensor,
                window: int | None) -> torch.Tensor:
    """True where query ``q_idx`` of step ``step`` may attend to key ``kv_idx`` (broadcasting).

    Args:
        b, q_idx, kv_idx: integer tensors, broadcastable to each other.
        step: j, the drafting step the queries belong to.
        ctx_valid: [Bsz, T] bool, True on real tokens.
        window: W keys visible counting the query itself, or None (full attention).
    """
    seq_len = ctx_valid.shape[1]
    key_step = kv_idx // seq_len
    u = kv_idx % seq_len
    context = (key_step == 0) & (u <= q_idx) & (ctx_valid[b, u] | (u == q_idx))
    diagonal = (key_step >= 1) & (key_step <= step) & (u == q_idx)
    visible = context | diagonal
    if window is not None:
        query_pos = q_idx + step
        key_pos = u + key_step
        visible = visible & (key_pos > query_pos - window)
    return visible


def ttt_dense_mask(ctx_valid: torch.Tensor, step: int, window: int | None) -> torch.Tensor:
    """Boolean SDPA mask [Bsz, 1, T, (step + 1) * T] (True = attend) from ``ttt_visible``."""
    bsz, seq_len = ctx_valid.shape
    device = ctx_valid.device
    b = torch.arange(bsz, device=device)[:, None, None]
    q = torch.arange(seq_len, device=device)[None, :, None]
    kv = torch.arange((step + 1) * seq_len, device=device)[None, None, :]
    return ttt_visible(b, q, kv, step, ctx_valid, window)[:, None]


def ttt_flex_block_mask(ctx_valid: torch.Tensor, step: int, window: int | None, tile: int = 128):
    """flex_attention ``BlockMask`` for the same rule (GPU); tiles with no visible pair are skipped."""
    from torch.nn.attention.flex_attention import create_block_mask

    bsz, seq_len = ctx_valid.shape

    def mask_mod(b, h, q_idx, kv_idx):
        return ttt_visible(b, q_idx, kv_idx, step, ctx_valid, window)

    # compiled on the GPU: built tile by tile, never the dense [T, (j+1)T] mask (7.5 GB at 32K, step 6)
    return create_block_mask(mask_mod, B=bsz, H=None, Q_LEN=seq_len, KV_LEN=(step + 1) * seq_len,
                             device=ctx_valid.device, BLOCK_SIZE=tile, _compile=ctx_valid.is_cuda)
