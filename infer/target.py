"""The target's forward over a preallocated KV cache (after gpt-fast's ``KVCache``), on the HF model's own weights.

Why not Hugging Face's ``StaticCache``: its layers keep their own write offset, so a forward at a
position the cache has already passed (what rejecting drafts needs) writes in the wrong place.
Here the caller names the first position of every forward; a forward at ``start`` writes
keys/values ``start .. start+n-1`` and reads keys ``0 .. start+n-1`` under a causal mask, so
rejected positions need no rollback: the next forward writes over them before anything reads them.

Supported: decoder-only models whose layers are ``input_layernorm -> self_attn(q/k/v/o_proj, optional
q_norm/k_norm) -> post_attention_layernorm -> mlp`` with full attention (Llama 3.x, Qwen2/2.5,
Qwen3, Mistral without a window). Anything else is refused at load time with the reason; HF's own
model stays the reference in tests.

Features follow ``train/target.py``'s convention: layer id i = output of decoder layer i.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from kernels.attention import cached_attention
from train.target import decoder_layers

# Legend: n tokens in this forward, V vocab, L layers, C cache capacity (positions), Hkv kv heads, D head dim.


def check_supported(model: nn.Module) -> None:
    """Raise ValueError naming what the cached forward cannot run."""
    config = model.config.get_text_config()
    name = f"target {config.model_type!r}"
    types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if types != {"full_attention"} or getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        raise ValueError(f"{name}: layer_types {sorted(types)}: the inference loop runs full-attention targets only (gpt-oss-style windows in the target are not supported yet)")
    layer = decoder_layers(model)[0]
    attn = getattr(layer, "self_attn", None)
    needed = ["q_proj", "k_proj", "v_proj", "o_proj"]
    if attn is None or not all(hasattr(attn, n) for n in needed) or not hasattr(layer, "mlp"):
        raise ValueError(f"{name}: decoder layer {type(layer).__name__} lacks self_attn.{{q,k,v,o}}_proj / mlp; expected a Llama/Qwen-style layer")
    if hasattr(attn, "sinks") or getattr(config, "attn_logit_softcapping", None):
        raise ValueError(f"{name}: attention sinks / logit soft-capping are not supported by the inference loop")


class CachedTarget:
    """The target LM with a static KV cache; returns logits and the drafter's feature layers.

    Args:
        model: a loaded HF causal LM (its modules are used in place, nothing is copied).
        feature_layer_ids: layer ids whose outputs are returned as features (may be empty).
        attention_backend: ``sdpa`` or ``flashinfer`` (see ``kernels/attention.py``).
    """

    def __init__(self, model: nn.Module, feature_layer_ids: list[int], attention_backend: str = "sdpa"):
        check_supported(model)
        self.model = model.eval().requires_grad_(False)
        config = model.config.get_text_config()
        base = model.model
        self.layers = decoder_layers(model)
        self.embed_tokens = model.get_input_embeddings()
        self.norm = base.norm
        self.lm_head = model.get_output_embeddings()
        self.rotary_emb = base.rotary_emb
        self.num_kv_heads = config.num_key_value_heads
        self.num_heads = config.num_attention_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.scale = self.head_dim ** -0.5
        self.feature_layer_ids = list(feature_layer_ids)
        self.attention_backend = attention_backend
        self.k_cache: torch.Tensor | None = None  # [L, C, Hkv, D]
        self.v_cache: torch.Tensor | None = None

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def capacity(self) -> int:
        return 0 if self.k_cache is None else self.k_cache.shape[1]

    def allocate(self, capacity: int) -> None:
        """Make room for positions ``0 .. capacity-1`` (reuses the buffers when they are big enough)."""
        if self.capacity >= capacity:
            return
        shape = (len(self.layers), capacity, self.num_kv_heads, self.head_dim)
        self.k_cache = self.v_cache = None  # free the old buffers first
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, start: int, last_logits_only: bool = False, positions: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run tokens at positions ``start .. start+n-1`` against the cached keys ``0 .. start-1``.

        Args:
            input_ids: [n] token ids.
            start: position of the first token; every position before it must be in the cache.
            last_logits_only: return the last position's logits only (prefill).
            positions: optional [n] RoPE positions (tree verification: ``start + depth``); the keys
                are still written to cache slots ``start .. start+n-1``.
            mask: optional [n, n] bool, which new tokens each new token sees (tree verification:
                its ancestors and itself); every cached slot before ``start`` stays visible.

        Returns:
            logits [n, V] (or [1, V]) in fp32, and features [n, k*H] (None without feature layers).
        """
        n = input_ids.shape[0]
        end = start + n
        if end > self.capacity:
            raise ValueError(f"forward to position {end} exceeds the KV cache capacity {self.capacity}; call allocate() first")
        x = self.embed_tokens(input_ids)[None]  # [1, n, H]
        if positions is None:
            positions = torch.arange(start, end, device=self.device)
        cos, sin = self.rotary_emb(x, positions.reshape(1, n))
        if mask is not None:
            mask = torch.cat([torch.ones(n, start, dtype=torch.bool, device=self.device), mask.to(self.device)], dim=1)  # [n, end]
        features: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            x = x + self._attention(i, layer, layer.input_layernorm(x), cos, sin, start, end, mask)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            if i in self.feature_layer_ids:
                features[i] = x[0]
        if last_logits_only:
            x = x[:, -1:]
        logits = self.lm_head(self.norm(x))[0].float()
        if not features:
            return logits, None
        return logits, torch.cat([features[i] for i in self.feature_layer_ids], dim=-1)

    def move(self, slots: torch.Tensor, dest: int) -> None:
        """Copy the keys/values of cache ``slots`` [m] to slots ``dest .. dest+m-1`` (an accepted tree path)."""
        m = slots.shape[0]
        self.k_cache[:, dest:dest + m] = self.k_cache[:, slots]  # advanced indexing copies first: overlaps are safe
        self.v_cache[:, dest:dest + m] = self.v_cache[:, slots]

    def _attention(self, i: int, layer: nn.Module, h: torch.Tensor, cos, sin, start: int, end: int,
                   mask: torch.Tensor | None = None) -> torch.Tensor:
        # h: [1, n, H] -> [1, n, H]; writes this layer's keys/values at start..end-1
        attn = layer.self_attn
        n = h.shape[1]
        q = attn.q_proj(h).view(1, n, self.num_heads, self.head_dim)
        k = attn.k_proj(h).view(1, n, self.num_kv_heads, self.head_dim)
        v = attn.v_proj(h).view(1, n, self.num_kv_heads, self.head_dim)
        if hasattr(attn, "q_norm"):  # Qwen3
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        self.k_cache[i, start:end] = k[0].transpose(0, 1)
        self.v_cache[i, start:end] = v[0]
        out = cached_attention(q[0].transpose(0, 1), self.k_cache[i, :end], self.v_cache[i, :end],
                               causal=True, window=None, scale=self.scale, backend=self.attention_backend, mask=mask)  # [n, Hq, D]
        return attn.o_proj(out.reshape(1, n, self.num_heads * self.head_dim))
