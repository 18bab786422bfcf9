"""A DFlash drafter at inference: per-layer context caches and one-pass block drafting.

DFlash's context keys/values come from the projected target features only (not from the previous
draft layer), so each accepted position is projected once and written into every layer's cache:

    features [n, k*H] -> fc, hidden_norm -> context [n, H] -> per layer: k_proj/k_norm/RoPE, v_proj

A block anchored at position a (slot 0 = the last verified token, slots 1..B-1 = mask tokens) then
attends to the cached context keys < a and to its own slots. Each layer's cache holds keys at
consecutive positions and the block's keys/values are written just after them, so attention always
reads one contiguous slice whose last B keys are the block: the bottom-right-aligned layout of
``kernels/attention.py``, where a block-causal sliding layer is exactly ``causal=True,
window=W`` (FlashInfer ``window_left = W - 1``) and a full layer is ``causal=False``.

A sliding layer keeps only its last W - 1 context positions plus slack (``ContextKV(keep=...)``):
when the buffer fills, the kept tail moves to the front, so memory is O(W) however long the prompt.
``tests/test_infer_drafter.py`` checks that this gives the same logits as a full cache under the
windowed mask, and that the cached path equals the training forward.

Inference-time window (SGLang's ``--speculative-draft-window-size``): ``window="trained"`` keeps the
checkpoint's ``sliding_window``; an int replaces it in every sliding layer; None removes it (full
attention everywhere). In-block causality of sliding layers stays as trained.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from infer.sampling import SamplingConfig, choose
from kernels.attention import cached_attention
from train.models.dflash import DFlashDraftModel, sliding_block_causal

# Legend: n positions appended, B block size, H hidden, Hkv kv heads, D head dim, V vocab, C buffer capacity.


class ContextKV:
    """One draft layer's context keys/values at consecutive positions, plus B scratch slots for the block.

    Args:
        keep: None keeps every position (full layer); an int keeps at least the last ``keep`` positions.
        capacity: context positions the buffer holds (for ``keep``: ``keep`` + slack, compacted when full).
        block_size: scratch slots after the context for the block's own keys/values.
    """

    def __init__(self, num_kv_heads: int, head_dim: int, capacity: int, keep: int | None, block_size: int,
                 dtype: torch.dtype, device: torch.device):
        shape = (capacity + block_size, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [C + B, Hkv, D]
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.capacity = capacity
        self.keep = keep
        self.block_size = block_size
        self.first_pos = 0  # position held in slot 0
        self.length = 0  # context slots in use

    @property
    def end_pos(self) -> int:
        return self.first_pos + self.length

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        # k, v: [n, Hkv, D] for positions end_pos .. end_pos + n - 1
        n = k.shape[0]
        if self.keep is not None and self.length + n > self.capacity:
            # compact: keep only what the last `keep` positions after this append still need
            if n >= self.keep:
                k, v = k[n - self.keep:], v[n - self.keep:]
                tail = 0
            else:
                tail = min(self.keep - n, self.length)
                self.k[:tail] = self.k[self.length - tail:self.length].clone()
                self.v[:tail] = self.v[self.length - tail:self.length].clone()
            self.first_pos = self.end_pos + n - k.shape[0] - tail
            self.length = tail
            n = k.shape[0]
        if self.length + n > self.capacity:
            raise ValueError(f"draft context cache full: {self.length + n} positions > capacity {self.capacity}")
        self.k[self.length:self.length + n] = k
        self.v[self.length:self.length + n] = v
        self.length += n

    def with_block(self, k_blk: torch.Tensor, v_blk: torch.Tensor, from_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the block's keys/values after the context; return [keys from ``from_pos`` ; block] views."""
        # k_blk, v_blk: [B, Hkv, D] -> k, v: [K, Hkv, D]
        b = k_blk.shape[0]
        self.k[self.length:self.length + b] = k_blk
        self.v[self.length:self.length + b] = v_blk
        assert max(from_pos, 0) >= self.first_pos, "the window reaches positions the cache dropped"
        lo = max(from_pos - self.first_pos, 0)
        return self.k[lo:self.length + b], self.v[lo:self.length + b]


@dataclass(frozen=True)
class LayerAttention:
    causal: bool  # causal inside the block (context keys are always before the block)
    window: int | None  # W keys visible including the query; None = all


def layer_attention(model: DFlashDraftModel, window="trained") -> list[LayerAttention]:
    """Each draft layer's attention rule at inference, with the window override applied."""
    config = model.config
    if window == "trained":
        window = config.sliding_window
    elif window is not None and (not isinstance(window, int) or window < 1):
        raise ValueError(f"window={window!r}; expected 'trained', None (full attention) or a positive int")
    block_causal = sliding_block_causal(config)
    rules = []
    for layer_type in config.layer_types:
        if layer_type == "sliding_attention":
            rules.append(LayerAttention(causal=block_causal, window=window))
        else:
            rules.append(LayerAttention(causal=False, window=None))
    return rules


class DFlashDrafter:
    """Drafts a block of tokens from the target's features with a DFlash model.

    Args:
        model: the loaded ``DFlashDraftModel``.
        embed_tokens, lm_head: the target's (shared, frozen) embedding and LM head.
        window: inference-time window, see the module docstring.
        attention_backend: ``sdpa`` or ``flashinfer``.
        keep_slack: extra positions a sliding layer's buffer holds before it compacts.
    """

    def __init__(self, model: DFlashDraftModel, embed_tokens: nn.Module, lm_head: nn.Module, window="trained",
                 attention_backend: str = "sdpa", keep_slack: int = 1024):
        self.model = model.eval().requires_grad_(False)
        self.embed_tokens = embed_tokens
        self.lm_head = lm_head
        self.block_size = model.block_size
        self.mask_token_id = model.mask_token_id
        self.target_layer_ids = model.target_layer_ids
        self.rules = layer_attention(model, window)
        self.attention_backend = attention_backend
        self.keep_slack = keep_slack
        self.window_arg = window
        self.caches: list[ContextKV] = []

    tree = False  # drafting protocol of infer/generate.py: chains (blocks) only

    @property
    def verify_tokens(self) -> int:
        return self.block_size

    def with_window(self, window) -> "DFlashDrafter":
        """The same drafter under another inference window."""
        return DFlashDrafter(self.model, self.embed_tokens, self.lm_head, window, self.attention_backend, self.keep_slack)

    @property
    def device(self) -> torch.device:
        return self.model.fc.weight.device

    def reset(self, max_positions: int) -> None:
        """Empty caches able to hold positions ``0 .. max_positions-1``."""
        cfg = self.model.config
        dtype = self.model.fc.weight.dtype
        self.caches = []
        for rule in self.rules:
            # the slot-0 query at anchor a needs context a-W+1 .. a-1: W - 1 positions
            keep = None if rule.window is None or rule.window - 1 >= max_positions else rule.window - 1
            capacity = max_positions if keep is None else min(max_positions, keep + self.keep_slack)
            self.caches.append(ContextKV(cfg.num_key_value_heads, cfg.head_dim, capacity, keep, self.block_size, dtype, self.device))

    @torch.no_grad()
    def append_context(self, features: torch.Tensor, start: int, token_ids: torch.Tensor | None = None) -> None:
        """Project target features at positions ``start .. start+n-1`` into every layer's cache (DFlash ignores the tokens)."""
        # features: [n, k*H]
        assert all(c.end_pos == start for c in self.caches), "context positions must arrive in order"
        context = self.model.project_context(features.to(self.model.fc.weight.dtype))[None]  # [1, n, H]
        positions = torch.arange(start, start + features.shape[0], device=self.device)[None]
        cos, sin = self.model.rotary_emb(context, positions)
        for layer, cache in zip(self.model.layers, self.caches):
            k, v = layer.self_attn.key_value(context, cos, sin)  # [1, Hkv, n, D]
            cache.append(k[0].transpose(0, 1), v[0].transpose(0, 1))

    @torch.no_grad()
    def draft_logits(self, token: torch.Tensor, anchor: int) -> torch.Tensor:
        """Logits for block slots 1..B-1 (the tokens at ``anchor+1 .. anchor+B-1``).

        Args:
            token: [] or [1] the last verified token, at position ``anchor`` (not yet in the context).
            anchor: its position; the context must hold positions ``.. anchor-1``.

        Returns:
            [B-1, V] fp32 logits.
        """
        b = self.block_size
        ids = torch.full((b,), self.mask_token_id, dtype=torch.long, device=self.device)
        ids[0] = token.reshape(())
        x = self.embed_tokens(ids)[None].to(self.model.fc.weight.dtype)  # [1, B, H]
        positions = torch.arange(anchor, anchor + b, device=self.device)[None]
        cos, sin = self.model.rotary_emb(x, positions)
        for layer, cache, rule in zip(self.model.layers, self.caches, self.rules):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.query(h, cos, sin)[0].transpose(0, 1)  # [B, Hq, D]
            k_blk, v_blk = attn.key_value(h, cos, sin)
            from_pos = 0 if rule.window is None else anchor - rule.window + 1
            k, v = cache.with_block(k_blk[0].transpose(0, 1), v_blk[0].transpose(0, 1), from_pos)
            out = cached_attention(q, k, v, causal=rule.causal, window=rule.window, scale=attn.scaling,
                                   backend=self.attention_backend)  # [B, Hq, D]
            x = x + attn.output(out.transpose(0, 1)[None])
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        hidden = self.model.norm(x)[0, 1:]  # slot 0 is the known token
        return self.lm_head(hidden.to(self.lm_head.weight.dtype)).float()

    @torch.no_grad()
    def draft(self, token: torch.Tensor, anchor: int, sampling: SamplingConfig,
              generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft tokens [B-1] for ``anchor+1 ..`` and, when sampling, their distributions [B-1, V]."""
        return choose(self.draft_logits(token, anchor), sampling, generator)
