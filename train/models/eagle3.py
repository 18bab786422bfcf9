"""EAGLE-3 drafter (Li et al., arXiv 2503.01840) with per-layer sliding windows.

    features = concat(target hidden states at target_layer_ids: low, mid, high)   [B, T, 3H]
    h0       = fc(features)              (EAGLE-3.1 ``fc_norm``: RMSNorm each part first)
    layer 0  : attention input [input_layernorm(embed(token)) ; hidden_norm(h)]  (2H -> q/k/v)
               residual = h; then post_attention_layernorm -> SwiGLU MLP, as Llama
    layer i>0: a plain Llama decoder layer
    logits   = lm_head(norm(h_out)) over the draft vocabulary (``draft_vocab_size`` tokens)
    next step: h_out (``norm_output``, EAGLE-3.1: norm(h_out)) is fed back as ``h``

Index t of the drafter holds the target's features at position t and the *next* token x_{t+1}, so
it sits at RoPE position t + 1 and predicts x_{t+2}; each further drafting step moves one position
on (vLLM, SGLang and speculators place draft steps the same way).

Draft vocabulary: draft id i is target id ``i + d2t[i]``; ``t2d[j]`` says whether target id j has
a draft id (``build_draft_vocab``). The token embedding is the target's, frozen.

The config is a ``LlamaConfig`` (the decoder layers are Llama layers whatever the target) carrying
``draft_vocab_size``, ``target_hidden_size``, ``target_layer_ids`` (ours, see train/target.py),
``layer_types``, ``sliding_window``, ``fc_norm``, ``norm_output``, ``norm_before_residual`` and
``ttt_length``. Weight names follow vLLM speculators (``layers.{i}``, ``layers.0.hidden_norm``,
``fc``, ``fc_norm.{k}``, ``norm``, ``lm_head``, ``embed_tokens``, ``d2t``, ``t2d``);
``train/export.py`` renames them for SGLang.

Attention is the caller's: every layer asks ``attend(layer_idx, q, k, v)`` for its output, so the
training-time test (train/eagle3_objective.py: keys of earlier steps, masks) and the inference
caches (infer/) drive the same layers.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Callable

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaPreTrainedModel, LlamaRMSNorm, LlamaRotaryEmbedding, rotate_half

# Legend: B batch, L positions in this pass, H hidden, Hq/Hkv heads, D head dim, Vd draft vocabulary.

Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (layer, q, k, v) -> out [B, Hq, L, D]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [B, heads, L, D]; cos/sin: [B, L, D]
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


def make_eagle3_config(target_config, *, num_hidden_layers: int, target_layer_ids: list[int], layer_types: list[str],
                       sliding_window: int | None, draft_vocab_size: int, ttt_length: int = 7, fc_norm: bool = False,
                       norm_output: bool = False, norm_before_residual: bool = False) -> LlamaConfig:
    """The drafter's config: the target's attention/MLP shape, EAGLE-3 fields on top."""
    t = target_config.get_text_config()
    rope = getattr(t, "rope_parameters", None) or {"rope_type": "default", "rope_theta": getattr(t, "rope_theta", 5e5)}
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    config = LlamaConfig(
        vocab_size=t.vocab_size, hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
        num_hidden_layers=num_hidden_layers, num_attention_heads=t.num_attention_heads,
        num_key_value_heads=t.num_key_value_heads, head_dim=head_dim, rms_norm_eps=t.rms_norm_eps,
        max_position_embeddings=t.max_position_embeddings, rope_parameters=dict(rope), attention_bias=False,
        mlp_bias=False, hidden_act="silu", tie_word_embeddings=False, architectures=["Eagle3DraftModel"],
    )
    config.draft_vocab_size = min(draft_vocab_size, t.vocab_size)
    config.target_hidden_size = t.hidden_size
    config.target_layer_ids = list(target_layer_ids)
    config.layer_types = list(layer_types)
    config.sliding_window = sliding_window
    config.ttt_length = ttt_length
    config.fc_norm = fc_norm
    config.norm_output = norm_output
    config.norm_before_residual = norm_before_residual
    return config


def build_draft_vocab(token_counts: Counter | dict[int, int], target_vocab_size: int, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (d2t [Vd] long, t2d [V] bool): the ``draft_vocab_size`` most frequent target ids.

    ``token_counts`` counts loss-masked tokens (what the drafter must predict). Ties, and ids never
    seen, go by id, so the choice is deterministic; the kept ids are sorted by id.
    """
    draft_vocab_size = min(draft_vocab_size, target_vocab_size)
    ranked = sorted(range(target_vocab_size), key=lambda i: (-token_counts.get(i, 0), i))
    kept = torch.tensor(sorted(ranked[:draft_vocab_size]), dtype=torch.long)
    d2t = kept - torch.arange(draft_vocab_size)
    t2d = torch.zeros(target_vocab_size, dtype=torch.bool)
    t2d[kept] = True
    return d2t, t2d


class Eagle3Attention(nn.Module):
    def __init__(self, config: LlamaConfig, input_size: int):
        super().__init__()
        self.head_dim = config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.scaling = 1.0 / math.sqrt(self.head_dim)
        self.q_proj = nn.Linear(input_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(input_size, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(input_size, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # x: [B, L, in] -> q [B, Hq, L, D], k/v [B, Hkv, L, D] (q, k rotated)
        b, length, _ = x.shape
        q = self.q_proj(x).view(b, length, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def output(self, out: torch.Tensor) -> torch.Tensor:
        # out: [B, Hq, L, D] -> [B, L, H]
        b, _, length, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, length, self.num_heads * self.head_dim))


class Eagle3DecoderLayer(nn.Module):
    """Layer 0 reads [embedding ; hidden] (2H); later layers are plain Llama layers."""

    def __init__(self, config: LlamaConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.first = layer_idx == 0
        self.norm_before_residual = bool(getattr(config, "norm_before_residual", False))
        h = config.hidden_size
        self.self_attn = Eagle3Attention(config, 2 * h if self.first else h)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        if self.first:
            self.hidden_norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=config.rms_norm_eps)

    def forward(self, h: torch.Tensor, embeds: torch.Tensor, rope: tuple, attend: Attend) -> torch.Tensor:
        if self.first:
            normed = self.hidden_norm(h)
            residual = normed if self.norm_before_residual else h
            x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        else:
            residual, x = h, self.input_layernorm(h)
        q, k, v = self.self_attn.qkv(x, *rope)
        h = residual + self.self_attn.output(attend(self.layer_idx, q, k, v))
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3DraftModel(LlamaPreTrainedModel):
    config_class = LlamaConfig
    base_model_prefix = ""
    _no_split_modules = ["Eagle3DecoderLayer"]

    def __init__(self, config: LlamaConfig):
        super().__init__(config)
        h = config.hidden_size
        self.target_layer_ids = list(config.target_layer_ids)
        num_features = len(self.target_layer_ids)
        target_h = getattr(config, "target_hidden_size", None) or h
        self.embed_tokens = nn.Embedding(config.vocab_size, h)
        self.embed_tokens.weight.requires_grad_(False)  # the target's, frozen
        if getattr(config, "fc_norm", False):
            self.fc_norm = nn.ModuleList(LlamaRMSNorm(target_h, eps=config.rms_norm_eps) for _ in range(num_features))
        self.fc = nn.Linear(num_features * target_h, h, bias=False)
        self.layers = nn.ModuleList(Eagle3DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(h, config.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(config.vocab_size, dtype=torch.bool) if config.draft_vocab_size == config.vocab_size
                             else torch.zeros(config.vocab_size, dtype=torch.bool))
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.post_init()

    @property
    def layer_types(self) -> list[str]:
        return list(self.config.layer_types)

    @property
    def sliding_window(self) -> int | None:
        return self.config.sliding_window

    @property
    def ttt_length(self) -> int:
        return int(getattr(self.config, "ttt_length", 7))

    def set_draft_vocab(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        if d2t.shape != self.d2t.shape or t2d.shape != self.t2d.shape:
            raise ValueError(f"draft vocabulary: d2t {tuple(d2t.shape)} / t2d {tuple(t2d.shape)}, expected {tuple(self.d2t.shape)} / {tuple(self.t2d.shape)}")
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def draft_ids_in_target(self) -> torch.Tensor:
        """[Vd] the target id of every draft id (rows of the target's LM head the draft head mirrors)."""
        return self.draft_to_target(torch.arange(self.config.draft_vocab_size, device=self.d2t.device))

    def project_features(self, features: torch.Tensor) -> torch.Tensor:
        # features: [B, L, k*H_target] -> [B, L, H]
        if hasattr(self, "fc_norm"):
            parts = features.chunk(len(self.fc_norm), dim=-1)
            features = torch.cat([norm(p) for norm, p in zip(self.fc_norm, parts)], dim=-1)
        return self.fc(features)

    def rope(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rotary_emb(x, positions)

    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
        """One drafting step over L indices.

        Args:
            input_ids: [B, L] target token ids (the token after each index).
            hidden: [B, L, H] ``project_features(features)`` on the first step, else ``next_hidden``
                of the previous step.
            positions: [B, L] RoPE positions.
            attend: ``(layer, q, k, v) -> out``; owns the keys of earlier indices/steps and the masks.

        Returns:
            [B, L, H] the last layer's output before the final norm (``logits``, ``next_hidden``).
        """
        embeds = self.embed_tokens(input_ids).to(hidden.dtype)
        rope = self.rope(hidden, positions)
        h = hidden
        for layer in self.layers:
            h = layer(h, embeds, rope, attend)
        return h

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """[B, L, H] -> [B, L, Vd] draft-vocabulary logits."""
        return self.lm_head(self.norm(h))

    def next_hidden(self, h: torch.Tensor) -> torch.Tensor:
        """What the next drafting step reads as ``hidden`` (EAGLE-3.1 ``norm_output``: the normed state)."""
        return self.norm(h) if getattr(self.config, "norm_output", False) else h
