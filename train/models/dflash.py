"""DFlash block-diffusion drafter (z-lab, arXiv 2602.06036) with per-layer sliding windows.

A stack of Qwen3-style decoder layers (q/k RMSNorm, RoPE, SwiGLU) with no embedding or LM head of
its own: block tokens are embedded and decoded by the target's (frozen) embedding and LM head.

    context  = hidden_norm(fc(concat(target hidden states at target_layer_ids)))   [B, T, H]
    block    = embed([last verified token, mask, ..., mask])                        [B, Q, H]
    each layer: queries from the block; keys/values = [context ; block]
    slot k of a block anchored at position a predicts the token at a + k.

The config is a ``Qwen3Config`` carrying the DFlash fields the published checkpoints carry
(``architectures: [DFlashDraftModel]``, ``dflash_config: {target_layer_ids, block_size,
mask_token_id}``, ``block_size``, ``num_target_layers``, ``layer_types``, ``sliding_window``), and
weight names match theirs (``fc``, ``hidden_norm``, ``layers.*``, ``norm``). Masks come from
``train/masks.py`` (one per layer type); attention from ``kernels/attention.py``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3PreTrainedModel, Qwen3RMSNorm, Qwen3RotaryEmbedding, rotate_half

from kernels.attention import attention

# Legend: B batch, T context length, Q block queries, H hidden, Hq/Hkv heads, D head dim.


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [B, heads, L, D]; cos/sin: [B, L, D]
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


def make_dflash_config(target_config, *, num_hidden_layers: int, block_size: int, mask_token_id: int, target_layer_ids: list[int],
                       layer_types: list[str], sliding_window: int | None, sliding_block_causal: bool = True) -> Qwen3Config:
    """The drafter's config: the target's attention/MLP shape, DFlash fields on top."""
    t = target_config.get_text_config()
    rope = getattr(t, "rope_parameters", None) or {"rope_type": "default", "rope_theta": getattr(t, "rope_theta", 1e6)}
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    config = Qwen3Config(
        vocab_size=t.vocab_size, hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
        num_hidden_layers=num_hidden_layers, num_attention_heads=t.num_attention_heads,
        num_key_value_heads=t.num_key_value_heads, head_dim=head_dim, rms_norm_eps=t.rms_norm_eps,
        max_position_embeddings=t.max_position_embeddings, rope_parameters=dict(rope), attention_bias=False,
        layer_types=list(layer_types), sliding_window=sliding_window,
        use_sliding_window="sliding_attention" in layer_types, max_window_layers=num_hidden_layers,
        tie_word_embeddings=False, architectures=["DFlashDraftModel"],
    )
    config.block_size = block_size
    config.num_target_layers = t.num_hidden_layers
    config.dflash_config = {"target_layer_ids": list(target_layer_ids), "block_size": block_size, "mask_token_id": mask_token_id}
    config.sliding_block_causal = sliding_block_causal
    return config


def sliding_block_causal(config: Qwen3Config) -> bool:
    """Whether sliding layers are causal inside the block: our key, else z-lab's ``is_causal``
    (which, when set, applies to every layer; full layers are always bidirectional here)."""
    if getattr(config, "sliding_block_causal", None) is not None:
        return bool(config.sliding_block_causal)
    is_causal = getattr(config, "is_causal", None)
    if is_causal and "full_attention" in config.layer_types:
        raise ValueError("config.json: is_causal=true with full_attention layers (causal full layers) is not supported")
    return True if is_causal is None else bool(is_causal)


class HeadOrderLinear(nn.Linear):
    """``nn.Linear`` whose head slices (rows: ``head_dim=0``, q_proj; columns: ``head_dim=1``, o_proj) can
    be taken in group-major order: ``forward(x, group_major=True)`` uses the weight with head
    h * G + g (Hugging Face's order: KV head h, its g-th query head) moved to g * Hkv + h, the order
    FA4's key-interval kernels take without regrouping copies (``kernels.key_intervals``). A copy of
    the weight per call, not of the activations; the parameters keep Hugging Face's order, and the
    call goes through the module (forward hooks, DeepSpeed ZeRO-3's parameter gathering)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, heads: tuple[int, int, int], head_dim: int):
        super().__init__(in_features, out_features, bias=bias)
        self.heads, self.head_dim = heads, head_dim  # (Hkv, G, D); the weight's dimension holding them

    def forward(self, x: torch.Tensor, group_major: bool = False) -> torch.Tensor:
        if not group_major:
            return super().forward(x)
        weight = self.weight.unflatten(self.head_dim, self.heads).transpose(self.head_dim, self.head_dim + 1)
        bias = self.bias
        if bias is not None and self.head_dim == 0:
            bias = bias.unflatten(0, self.heads).transpose(0, 1).flatten()
        return F.linear(x, weight.flatten(self.head_dim, self.head_dim + 2), bias)


class DFlashAttention(nn.Module):
    def __init__(self, config: Qwen3Config, layer_idx: int):
        super().__init__()
        self.layer_type = config.layer_types[layer_idx]
        self.head_dim = config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.scaling = 1.0 / math.sqrt(self.head_dim)
        heads = (self.num_kv_heads, self.num_heads // self.num_kv_heads, self.head_dim)
        self.q_proj = HeadOrderLinear(config.hidden_size, self.num_heads * self.head_dim, config.attention_bias, heads, head_dim=0)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=config.attention_bias)
        self.o_proj = HeadOrderLinear(self.num_heads * self.head_dim, config.hidden_size, config.attention_bias, heads, head_dim=1)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def key_value(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # x: [B, L, H] -> k, v: [B, Hkv, L, D] (k normed and rotated)
        b, length, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, length, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return apply_rope(k, cos, sin), v

    def query(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, group_major: bool = False) -> torch.Tensor:
        # x: [B, Q, H] -> q: [B, Hq, Q, D] (normed and rotated); group_major: heads ordered g * Hkv + h
        b, q_len, _ = x.shape
        q = self.q_norm(self.q_proj(x, group_major=group_major).view(b, q_len, self.num_heads, self.head_dim)).transpose(1, 2)
        return apply_rope(q, cos, sin)

    def output(self, out: torch.Tensor, group_major: bool = False) -> torch.Tensor:
        # out: [B, Hq, Q, D] -> [B, Q, H]
        b, _, q_len, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, self.num_heads * self.head_dim), group_major=group_major)

    def forward(self, x: torch.Tensor, context: torch.Tensor, rope_q: tuple, rope_ctx: tuple, mask) -> torch.Tensor:
        # x: [B, Q, H] (normed block states); context: [B, T, H] (projected features)
        group_major = getattr(mask, "group_major", False)  # what the mask's kernels take (KeyIntervalMask)
        q = self.query(x, *rope_q, group_major=group_major)
        k_ctx, v_ctx = self.key_value(context, *rope_ctx)
        k_blk, v_blk = self.key_value(x, *rope_q)
        k = torch.cat([k_ctx, k_blk], dim=2)
        v = torch.cat([v_ctx, v_blk], dim=2)
        return self.output(attention(q, k, v, mask, scale=self.scaling), group_major)


class DFlashDecoderLayer(nn.Module):
    def __init__(self, config: Qwen3Config, layer_idx: int):
        super().__init__()
        self.self_attn = DFlashAttention(config, layer_idx)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, x: torch.Tensor, context: torch.Tensor, rope_q: tuple, rope_ctx: tuple, mask) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), context, rope_q, rope_ctx, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDraftModel(Qwen3PreTrainedModel):
    config_class = Qwen3Config
    base_model_prefix = ""
    _no_split_modules = ["DFlashDecoderLayer"]

    def __init__(self, config: Qwen3Config):
        super().__init__(config)
        dflash = config.dflash_config
        self.target_layer_ids = list(dflash["target_layer_ids"])
        self.block_size = dflash["block_size"]
        self.mask_token_id = dflash["mask_token_id"]
        self.layers = nn.ModuleList(DFlashDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.fc = nn.Linear(len(self.target_layer_ids) * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        self.post_init()

    @property
    def layer_types(self) -> list[str]:
        return list(self.config.layer_types)

    def project_context(self, features: torch.Tensor) -> torch.Tensor:
        # features: [B, T, k*H] target hidden states -> [B, T, H]
        return self.hidden_norm(self.fc(features))

    def forward(self, block_embeds: torch.Tensor, features: torch.Tensor, block_positions: torch.Tensor, masks: dict) -> torch.Tensor:
        """Draft hidden states for every block slot.

        Args:
            block_embeds: [B, Q, H] target embeddings of the block tokens (last verified token, masks).
            features: [B, T, k*H] target hidden states at ``target_layer_ids``, positions 0..T-1.
            block_positions: [B, Q] absolute position of each block slot.
            masks: layer type -> mask over [context ; block] keys ([B, 1, Q, T+Q] bool, or a flex
                ``BlockMask``), see ``train/masks.py``.

        Returns:
            [B, Q, H] final-normed hidden states; the target's LM head turns them into logits.
        """
        context = self.project_context(features)
        ctx_positions = torch.arange(features.shape[1], device=features.device).expand(features.shape[0], -1)
        rope_ctx = self.rotary_emb(block_embeds, ctx_positions)
        rope_q = self.rotary_emb(block_embeds, block_positions)
        x = block_embeds
        for layer, layer_type in zip(self.layers, self.config.layer_types):
            x = layer(x, context, rope_q, rope_ctx, masks[layer_type])
        return self.norm(x)
