"""DFlash block-diffusion drafter (z-lab, arXiv 2602.06036) with per-layer sliding windows: the
model, its training masks and its cached drafting, one file for training and inference.

A stack of Qwen3-style decoder layers (q/k RMSNorm, RoPE, SwiGLU) with no embedding or LM head of
its own: block tokens are embedded and decoded by the target's (frozen) embedding and LM head. With a
draft vocabulary (``config.draft_vocab_size`` < the target's, vLLM speculators' DFlash option) it
decodes with the target's LM-head rows of those ids only (``lm_head`` [Vd, H], frozen; ``d2t``: draft
id i is target id i + d2t[i]; ``t2d``: which target ids it has), so a block pass reads Vd rows, not V.

    context  = hidden_norm(fc(concat(target hidden states at target_layer_ids)))   [B, T, H]
    block    = embed([last verified token, mask, ..., mask])                        [B, Q, H]
    each layer: queries from the block; keys/values = [context ; block]
    slot k of a block anchored at position a predicts the token at a + k.

One ``DFlashDraftModel.forward`` serves both uses; the cache is an argument:
- training (``train/dflash.py``): many blocks per sequence, the context keys computed from all the
  target features in the pass, one mask per layer type (the masks section below);
- drafting (``DFlashDrafter`` at the end): one block, the context keys read from each layer's
  ``ContextKV`` (``models/target.py``), written once per accepted position by ``append_context``.

The config is a ``Qwen3Config`` carrying the DFlash fields the published checkpoints carry
(``architectures: [DFlashDraftModel]``, ``dflash_config: {target_layer_ids, block_size,
mask_token_id}``, ``block_size``, ``num_target_layers``, ``layer_types``, ``sliding_window``), and
weight names match theirs (``fc``, ``hidden_norm``, ``layers.*``, ``norm``). Attention runs through
``swa_kernels/attention.py`` (SDPA for a dense mask, flex / FlashAttention-4 on the GPU, FlashInfer or
SDPA over caches).

Training masks. Layout of one training sequence (T context positions, N anchors, block size B):

    queries  q = n * B + k          block n, slot k, position anchors[n] + k       (Q = N * B)
    keys     kv < T                  context position kv (projected target features)
             kv = T + m * B + l      block m, slot l, position anchors[m] + l       (K = T + Q)

A query at position p = a_n + k sees
    context keys   j < a_n (strictly before its anchor), j a real (non-padding) token, and in a
                   sliding layer only j >= p - W + 1 (the W-key window counts the query itself);
    block keys     its own block only (blocks never see each other); causal (l <= k) in sliding
                   layers unless ``block_causal=False``, bidirectional in full layers; in a sliding
                   layer also a_n + l >= p - W + 1 (and, non-causal, a_n + l <= p + W - 1).
Every query sees at least itself, so no softmax row is empty (padded anchor slots included).

``dflash_visible`` is written with tensor ops only, so the same function fills a dense boolean
mask for SDPA (CPU) and serves as a flex_attention ``mask_mod`` (GPU), whose block mask then skips
every 128 x 128 tile the window rules out: sliding-layer cost grows with W, not with T.

Grouped-query packing (``flex_packed_block_mask``): a block's B queries under the G query heads of
one KV head all see nearly the same keys (one anchor), so flex runs with the rows packed as
(block, head of the group, slot): a 128-row tile then holds 128 / (G B) whole blocks and one key
range, not 128 / B blocks spread over 128 / B different anchors (fewer partially masked tiles).
``swa_kernels.attention.attention`` packs and unpacks around the kernel.

Drafting. A block anchored at position a (slot 0 = the last verified token, slots 1..B-1 = mask
tokens) attends to the cached context keys < a and to its own slots. Each layer's cache holds keys
at consecutive positions and the block's keys/values are written just after them, so attention
reads one contiguous slice whose last B keys are the block: the bottom-right-aligned layout of
``swa_kernels/attention.py``, where a block-causal sliding layer is exactly ``causal=True, window=W``
(FlashInfer ``window_left = W - 1``) and a full layer is ``causal=False``. A sliding layer keeps only
its last W - 1 context positions plus slack: memory is O(W) however long the prompt.
``tests/test_infer_drafter.py`` checks this against a full cache under the windowed mask and
against the training forward.

Trees (greedy, ``tree_topk``/``tree_tokens``): a block pass predicts every slot at once from the context alone (the
slots before it hold mask tokens), so it gives one distribution per slot, not one per prefix. ``block_tree`` grows
EAGLE-2's dynamic tree over those marginals, as Medusa's heads grow theirs: the children of every depth-d node are slot
d's top-k tokens; the k best nodes of each depth (by summed log-prob) are expanded, and the best ``tree_tokens`` nodes
are verified in one target pass (``models/trees.py``). The drafter's next block needs the accepted path's features only.
With ``tree_redraft`` = R the nodes expanded at depths 1 .. R are drafted again, as blocks with their paths in place of
the first mask tokens (all of a depth's k nodes in one pass of k blocks per row), so their children know their parent, as
EAGLE's do; a drafter learns to read such tokens when trained with ``drafter.reveal_prob``.

Inference-time window (what SGLang's ``--speculative-draft-window-size`` sets for an EAGLE-3 draft; for a DFlash draft
SGLang reads ``layer_types`` / ``sliding_window`` from its config, and the flag bounds the committed context it keeps,
read in sglang 0.5.23's ``speculative/dflash_worker_v2.py``):
``window="trained"`` keeps the
checkpoint's ``sliding_window``; an int replaces it in every sliding layer; None removes it (full
attention everywhere). In-block causality of sliding layers stays as trained.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3PreTrainedModel, Qwen3RMSNorm, Qwen3RotaryEmbedding, rotate_half

from swa_kernels import block_attention as block_attention_kernel
from swa_kernels.decode_attention import takes_head_dim
from swa_kernels.decode_attention import Rope
from swa_kernels import skinny_gemm
from swa_kernels.int8_weights import Int8Weight, check_weights, int8_linear, int8_weight
from swa_kernels.attention import PackedQueryMask, aligned_visible, attention, block_mask_from_tiles, cached_attention, grouped_attention, masked_softmax
from swa_kernels.key_intervals import KeyIntervalMask, ctx_keys_for, dflash_key_intervals, interval_tables, plan_from_tables
from swa_kernels.argmax import row_argmax
from models.sampling import SamplingConfig, choose
from models.static_target import (CapturedSteps, concat_linears, few_row_products, move_kept_positions, prepack_by_default,
                                  prepacked_copy, rotate)
from models.target import ContextKV, check_rope_taken
from models.trees import DraftTree, select_trees, tree_masks, tree_options

# Legend: B batch (Bsz in masks), T context length, N anchors, Q block queries, K keys, H hidden, Hq/Hkv heads,
# D head dim, V vocab, C cache capacity.


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [B, heads, L, D]; cos/sin: [B, L, D]
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


def make_dflash_config(target_config, *, num_hidden_layers: int, block_size: int, mask_token_id: int, target_layer_ids: list[int],
                       layer_types: list[str], sliding_window: int | None, sliding_block_causal: bool = True,
                       draft_vocab_size: int | None = None) -> Qwen3Config:
    """The drafter's config: the target's attention/MLP shape, DFlash fields on top. ``draft_vocab_size`` below the
    target's vocabulary gives the drafter a reduced head (see ``DFlashDraftModel``); else (z-lab's layout) none."""
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
    check_rope_taken(config, rope, Qwen3RotaryEmbedding)
    config.block_size = block_size
    config.num_target_layers = t.num_hidden_layers
    config.dflash_config = {"target_layer_ids": list(target_layer_ids), "block_size": block_size, "mask_token_id": mask_token_id}
    config.sliding_block_causal = sliding_block_causal
    if draft_vocab_size is not None:
        if draft_vocab_size < 2:
            raise ValueError(f"draft_vocab_size={draft_vocab_size}; expected >= 2 or null (the target's vocabulary)")
        if draft_vocab_size < t.vocab_size:
            config.draft_vocab_size = draft_vocab_size
    return config


def draft_vocab_size(config) -> int | None:
    """The reduced head's width, or None: the drafter decodes with the target's whole LM head."""
    size = getattr(config, "draft_vocab_size", None)
    return size if size is not None and size < config.vocab_size else None


def sliding_block_causal(config: Qwen3Config) -> bool:
    """Whether sliding layers are causal inside the block: our key, else z-lab's ``is_causal``
    (which, when set, applies to every layer; full layers are always bidirectional here)."""
    if getattr(config, "sliding_block_causal", None) is not None:
        return bool(config.sliding_block_causal)
    is_causal = getattr(config, "is_causal", None)
    if is_causal and "full_attention" in config.layer_types:
        raise ValueError("config.json: is_causal=true with full_attention layers (causal full layers) is not supported")
    return True if is_causal is None else bool(is_causal)


# ----------------------------------------------------------------------------- masks (training)

@dataclass(frozen=True)
class LayerMaskSpec:
    window: int | None  # keys visible counting the query itself; None = no window (full layer)
    block_causal: bool  # causal inside the block

    @staticmethod
    def for_layer(layer_type: str, sliding_window: int | None, sliding_block_causal: bool = True) -> "LayerMaskSpec":
        if layer_type == "sliding_attention":
            return LayerMaskSpec(window=sliding_window, block_causal=sliding_block_causal)
        if layer_type == "full_attention":
            return LayerMaskSpec(window=None, block_causal=False)
        raise ValueError(f"layer type {layer_type!r}; expected sliding_attention or full_attention")


def dflash_visible(
    b: torch.Tensor,
    q_idx: torch.Tensor,
    kv_idx: torch.Tensor,
    anchors: torch.Tensor,
    ctx_valid: torch.Tensor,
    block_size: int,
    spec: LayerMaskSpec,
    ctx_lo: torch.Tensor | None = None,
) -> torch.Tensor:
    """True where query ``q_idx`` may attend to key ``kv_idx`` in sequence ``b`` (broadcasting).

    Args:
        b, q_idx, kv_idx: integer tensors, broadcastable to each other.
        anchors: [Bsz, N] anchor positions (padded slots: 0).
        ctx_valid: [Bsz, T] bool, True on real tokens.
        block_size: B.
        spec: the layer's window and in-block causality.
        ctx_lo: [Bsz, N] packed documents (``data.pack_documents``): the first context key each anchor's block may see
            (its document's start); None: 0.
    """
    ctx_len = ctx_valid.shape[1]
    n = q_idx // block_size
    k = q_idx % block_size
    anchor = anchors[b, n]
    pos = anchor + k
    is_ctx = kv_idx < ctx_len
    # torch.where, not clamp: FlashAttention-4's flex lowering has no minimum/maximum
    ctx_ok = (kv_idx < anchor) & ctx_valid[b, torch.where(is_ctx, kv_idx, ctx_len - 1)]
    if ctx_lo is not None:
        ctx_ok = ctx_ok & (kv_idx >= ctx_lo[b, n])
    blk = torch.where(is_ctx, 0, kv_idx - ctx_len)
    m = blk // block_size
    l = blk % block_size
    blk_ok = m == n
    if spec.block_causal:
        blk_ok = blk_ok & (l <= k)
    if spec.window is not None:
        ctx_ok = ctx_ok & (kv_idx > pos - spec.window)
        blk_ok = blk_ok & (l > k - spec.window)
        if not spec.block_causal:  # a non-causal window reaches W - 1 slots ahead too (z-lab's rule)
            blk_ok = blk_ok & (l < k + spec.window)
    return torch.where(is_ctx, ctx_ok, blk_ok)


def dense_mask(anchors: torch.Tensor, ctx_valid: torch.Tensor, block_size: int, spec: LayerMaskSpec,
               ctx_lo: torch.Tensor | None = None) -> torch.Tensor:
    """Boolean SDPA mask [Bsz, 1, Q, K] (True = attend) from ``dflash_visible``."""
    bsz, num_anchors = anchors.shape
    q_len = num_anchors * block_size
    kv_len = ctx_valid.shape[1] + q_len
    device = anchors.device
    b = torch.arange(bsz, device=device)[:, None, None]
    q = torch.arange(q_len, device=device)[None, :, None]
    kv = torch.arange(kv_len, device=device)[None, None, :]
    return dflash_visible(b, q, kv, anchors, ctx_valid, block_size, spec, ctx_lo)[:, None]


def dflash_tile_structure(anchors: torch.Tensor, ctx_valid: torch.Tensor, block_size: int, spec: LayerMaskSpec, q_rows: int,
                          kv_tile: int, ctx_lo: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Which (query tile, key tile) pairs of ``dflash_visible`` hold a visible pair (kept) and which hold only
    visible pairs (full), [Bsz, Q / q_rows, K / kv_tile] bool each, from each query's two key intervals
    (``swa_kernels.key_intervals.dflash_key_intervals``, the rule FlashAttention-4's kernels run), not from a [Q, K] mask
    (16 rows x 4096 queries x 6144 keys is 400M evaluations of the rule per layer type and step on the GPU).

    Exact for right-padded rows (``ctx_valid`` a prefix of each row, the trainer's batches). With gaps inside the
    context the intervals run to the last real key, so a kept tile may hold only padding keys (still correct: flex
    applies the rule inside kept tiles), and a context tile is full only if all its keys are real. Block-key tiles are
    never marked full.
    """
    bsz, n = anchors.shape
    ctx_len = ctx_valid.shape[1]
    q_len, kv_len = n * block_size, ctx_len + n * block_size
    q_tiles, kv_tiles = -(-q_len // q_rows), -(-kv_len // kv_tile)
    device = anchors.device
    ctx_valid = ctx_valid.to(device)
    last_real = (ctx_valid * torch.arange(1, ctx_len + 1, device=device)).amax(1)  # [Bsz] one past the last real key
    rows = dflash_key_intervals(anchors, last_real, block_size, spec.window, spec.block_causal, ctx_len, ctx_lo).long()  # [Bsz, Q, 4]
    lo1, hi1, lo2, hi2 = (rows[..., i, None] for i in range(4))  # [Bsz, Q, 1]: context, own block
    start = torch.arange(kv_tiles, device=device) * kv_tile  # [Kt]
    end = (start + kv_tile).clamp(max=kv_len)
    kept = (torch.maximum(start, lo1) < torch.minimum(end, hi1)) | (torch.maximum(start, lo2) < torch.minimum(end, hi2))
    tile_real = F.pad(ctx_valid, (0, kv_tiles * kv_tile - ctx_len)).view(bsz, kv_tiles, kv_tile).all(-1)[:, None]  # [Bsz, 1, Kt]
    # full: context tiles only (a key tile spans several blocks at the trainer's sizes, and blocks never see each other)
    full = (lo1 <= start) & (end <= hi1) & tile_real  # [Bsz, Q, Kt]
    pad = q_tiles * q_rows - q_len  # rows past the last query: none (kept: nothing; full: no condition)
    kept = F.pad(kept, (0, 0, 0, pad), value=False).view(bsz, q_tiles, q_rows, kv_tiles).any(2)
    full = F.pad(full, (0, 0, 0, pad), value=True).view(bsz, q_tiles, q_rows, kv_tiles).all(2)
    return kept, full & kept


def flex_block_mask(anchors: torch.Tensor, ctx_valid: torch.Tensor, block_size: int, spec: LayerMaskSpec, tile: int = 128,
                    ctx_lo: torch.Tensor | None = None):
    """flex_attention ``BlockMask`` for the same rule (GPU); tiles with no visible pair are skipped."""
    q_len = anchors.shape[1] * block_size

    def mask_mod(b, h, q_idx, kv_idx):
        return dflash_visible(b, q_idx, kv_idx, anchors, ctx_valid, block_size, spec, ctx_lo)

    kept, full = dflash_tile_structure(anchors, ctx_valid, block_size, spec, tile, tile, ctx_lo)
    return block_mask_from_tiles(kept, full, mask_mod, q_len, ctx_valid.shape[1] + q_len, tile, tile)


def flex_packed_block_mask(anchors: torch.Tensor, ctx_valid: torch.Tensor, block_size: int, spec: LayerMaskSpec, groups: int,
                           tile: int = 128, q_tile: int | None = None, kernel_options: dict | None = None,
                           ctx_lo: torch.Tensor | None = None):
    """``flex_block_mask`` for queries packed by KV group (module docstring), or None when a tile
    cannot hold whole blocks (``q_tile``, default ``tile``, not a multiple of ``groups * block_size``).
    ``kernel_options`` travel with the mask to flex_attention (e.g. FlashAttention-4's kernels)."""
    rows_per_block = groups * block_size
    q_tile = q_tile or tile
    if groups < 2 or q_tile % rows_per_block:
        return None
    bsz, num_anchors = anchors.shape
    q_len, kv_len = num_anchors * block_size, ctx_valid.shape[1] + num_anchors * block_size

    def packed_mask_mod(b, h, row, kv_idx):  # row = (block n, head g, slot k) -> query n * B + k
        return dflash_visible(b, row // rows_per_block * block_size + row % block_size, kv_idx, anchors, ctx_valid, block_size, spec, ctx_lo)

    # A packed tile holds the same blocks as an unpacked tile of tile / G rows: the tile structure
    # (skipped / partial / full) is the unpacked one at that height, over Q rows, not G * Q.
    kept, full = dflash_tile_structure(anchors, ctx_valid, block_size, spec, q_tile // groups, tile, ctx_lo)
    block_mask = block_mask_from_tiles(kept, full, packed_mask_mod, groups * q_len, kv_len, q_tile, tile)
    return PackedQueryMask(block_mask, groups, block_size, kernel_options)


def key_interval_mask(anchors: torch.Tensor, ctx_valid: torch.Tensor, block_size: int, spec: LayerMaskSpec, groups: int,
                      head_dim: int = 128, group_major: bool = False, ctx_lo: torch.Tensor | None = None) -> KeyIntervalMask:
    """The same rule as per-row key intervals for FlashAttention-4's kernels (``swa_kernels.key_intervals``):
    query n * B + k sees the context [max(0, p - W + 1), a_n) and its own block's slots. The context must
    be right-padded (``ctx_valid`` a prefix of each row), as the trainer's batches are; a device-side
    assert checks it without a host sync. ``group_major``: the mask asks for q's heads in the order
    g * Hkv + h (the DFlash drafter then permutes its q_proj rows and o_proj columns in the forward),
    which spares the backward four regrouping copies of q, out, dout and dq."""
    bsz, ctx_len = ctx_valid.shape
    lengths = ctx_valid.sum(1)
    torch._assert_async((ctx_valid == (torch.arange(ctx_len, device=ctx_valid.device) < lengths[:, None])).all(),
                        "key_interval_mask: ctx_valid is not a prefix of each row (left padding or gaps)")
    ctx_keys = ctx_keys_for(ctx_len)
    make = _compiled_interval_plan() if anchors.is_cuda else interval_plan_tensors
    rows, tables = make(anchors, lengths, block_size, spec.window, spec.block_causal, ctx_keys, groups,
                        ctx_keys + anchors.shape[1] * block_size, head_dim, ctx_lo)
    return KeyIntervalMask(plan_from_tables(rows, groups, head_dim, tables), ctx_len, ctx_keys, group_major)


def interval_plan_tensors(anchors: torch.Tensor, lengths: torch.Tensor, block_size: int, window: int | None, block_causal: bool,
                          ctx_keys: int, groups: int, num_keys: int, head_dim: int, ctx_lo: torch.Tensor | None = None):
    """DFlash's intervals and their kernel tables, as tensors only (``key_interval_mask``'s work, compiled on a GPU)."""
    rows = dflash_key_intervals(anchors, lengths, block_size, window, block_causal, ctx_keys, ctx_lo)
    return rows, interval_tables(rows, groups, num_keys, head_dim)


@functools.cache
def _compiled_interval_plan():
    # the ~90 small ops of a plan as a few fused kernels: the host queues the trainer's step (BENCHMARKS.md, "DFlash's
    # trainer against 54207b2 on two more leases": key_interval_mask took ~6 ms of a profiled step's host time)
    from swa_kernels.attention import raise_recompile_limit

    raise_recompile_limit()  # one graph per layer rule and context width (trainer.pad_multiple's few shapes)
    return torch.compile(interval_plan_tensors, dynamic=False)


# ----------------------------------------------------------------------------- the model

class HeadOrderLinear(nn.Linear):
    """``nn.Linear`` whose head slices (rows: ``head_dim=0``, q_proj; columns: ``head_dim=1``, o_proj) can
    be taken in group-major order: ``forward(x, group_major=True)`` uses the weight with head
    h * G + g (Hugging Face's order: KV head h, its g-th query head) moved to g * Hkv + h, the order
    FA4's key-interval kernels take without regrouping copies (``swa_kernels.key_intervals``). A copy of
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

    def forward(self, x: torch.Tensor, rope_q: tuple, cache: "LayerCache") -> torch.Tensor:
        # drafting: x [B, Q, H] (normed block states); cache: this layer's cached context keys and attention rule (the
        # block's keys go after them). Training runs DFlashDecoderLayer.attention_inputs / attention_output_and_mlp.
        q = self.query(x, *rope_q)
        k_blk, v_blk = self.key_value(x, *rope_q)
        return self.output(cache.attend(q, k_blk, v_blk, self.scaling))


class DFlashDecoderLayer(nn.Module):
    def __init__(self, config: Qwen3Config, layer_idx: int):
        super().__init__()
        self.self_attn = DFlashAttention(config, layer_idx)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    # The training forward in three parts: attention_inputs and attention_output_and_mlp hold every small op
    # (norms, rotary, SiLU, casts, residuals) around the projections; DFlashDraftModel.compile_regions compiles
    # them (fused kernels, a few launches each), and the attention between them takes any mask type.
    def attention_inputs(self, x: torch.Tensor, rope_q: tuple, context: torch.Tensor, rope_ctx: tuple,
                         group_major: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, Q, H] block states, context [B, T, H] -> q [B, Hq, Q, D], k/v [B, Hkv, T + Q, D] ([context ; block])."""
        h = self.input_layernorm(x)
        q = self.self_attn.query(h, *rope_q, group_major=group_major)
        k_blk, v_blk = self.self_attn.key_value(h, *rope_q)
        k_ctx, v_ctx = self.self_attn.key_value(context, *rope_ctx)
        return q, torch.cat([k_ctx, k_blk], dim=2), torch.cat([v_ctx, v_blk], dim=2)

    def attention_output_and_mlp(self, x: torch.Tensor, out: torch.Tensor, group_major: bool = False) -> torch.Tensor:
        x = x + self.self_attn.output(out, group_major)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward(self, x: torch.Tensor, rope_q: tuple, mask=None, context: torch.Tensor | None = None, rope_ctx: tuple | None = None,
                cache: "LayerCache | None" = None, regions: tuple | None = None) -> torch.Tensor:
        if cache is not None:
            x = x + self.self_attn(self.input_layernorm(x), rope_q, cache=cache)
            return x + self.mlp(self.post_attention_layernorm(x))
        inputs, output_and_mlp = regions or (self.attention_inputs, self.attention_output_and_mlp)
        group_major = getattr(mask, "group_major", False)  # what the mask's kernels take (KeyIntervalMask)
        q, k, v = inputs(x, rope_q, context, rope_ctx, group_major)
        return output_and_mlp(x, attention(q, k, v, mask, scale=self.self_attn.scaling), group_major)


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
        vd = draft_vocab_size(config)
        if vd is not None:  # the reduced head: the target's LM-head rows of the draft ids, frozen (speculators' DFlash)
            self.lm_head = nn.Linear(config.hidden_size, vd, bias=False)
            self.lm_head.weight.requires_grad_(False)
            self.register_buffer("d2t", torch.zeros(vd, dtype=torch.long))  # draft id i is target id i + d2t[i]
            self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))  # target id j in the draft vocabulary
        self.post_init()

    @property
    def layer_types(self) -> list[str]:
        return list(self.config.layer_types)

    @property
    def has_draft_vocab(self) -> bool:
        return hasattr(self, "d2t")

    @torch.no_grad()
    def set_draft_vocab(self, d2t: torch.Tensor, t2d: torch.Tensor, target_lm_head_weight: torch.Tensor) -> None:
        """The draft vocabulary (``models.eagle3.build_draft_vocab``) and the head's rows, copied from the target's."""
        if not self.has_draft_vocab:
            raise ValueError("set_draft_vocab: this DFlash drafter has no draft vocabulary (config.draft_vocab_size unset)")
        if d2t.shape != self.d2t.shape or t2d.shape != self.t2d.shape:
            raise ValueError(f"draft vocabulary: d2t {tuple(d2t.shape)} / t2d {tuple(t2d.shape)}, expected "
                             f"{tuple(self.d2t.shape)} / {tuple(self.t2d.shape)}")
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)
        rows = self.draft_ids_in_target().to(target_lm_head_weight.device)
        self.lm_head.weight.copy_(target_lm_head_weight[rows].to(self.lm_head.weight))

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids] if self.has_draft_vocab else draft_ids

    def draft_ids_in_target(self) -> torch.Tensor:
        """[Vd] the target id of every draft id."""
        return self.draft_to_target(torch.arange(self.d2t.shape[0], device=self.d2t.device))

    def target_to_draft(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Each target id's draft id, -1 where the draft vocabulary lacks it (labels the head cannot predict)."""
        index = torch.full((self.config.vocab_size,), -1, dtype=torch.long, device=self.d2t.device)
        index[self.draft_ids_in_target()] = torch.arange(self.d2t.shape[0], device=self.d2t.device)
        return torch.where(target_ids >= 0, index[target_ids.clamp(min=0)], -1)

    def head(self, target_lm_head: nn.Module) -> nn.Module:
        """The LM head drafting decodes with: the reduced one, else the target's."""
        return self.lm_head if self.has_draft_vocab else target_lm_head

    def to_target_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """[..., Vd] -> [..., V]: -inf outside the draft vocabulary, so softmax and argmax over the target's ids equal
        theirs over the draft ids (sampling stays exact)."""
        if not self.has_draft_vocab:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.config.vocab_size), float("-inf"))
        return full.index_copy_(-1, self.draft_ids_in_target(), logits)

    def compile_regions(self) -> None:
        """Compile the training forward's regions around attention (``DFlashDecoderLayer.attention_inputs`` and
        ``attention_output_and_mlp``, ``project_context``): one compiled code for every layer (their parameters
        are inputs), one per shape. Eager, these ran ~700 small kernels a step on the reference target, half the
        GPU's time. Not saved, not used by drafting (``cache=``)."""
        from swa_kernels.attention import raise_recompile_limit

        raise_recompile_limit()
        self._regions = [(torch.compile(layer.attention_inputs, dynamic=False), torch.compile(layer.attention_output_and_mlp, dynamic=False))
                         for layer in self.layers]
        self._project_context = torch.compile(self.project_context, dynamic=False)

    def project_context(self, features: torch.Tensor) -> torch.Tensor:
        # features: [B, T, k*H] target hidden states -> [B, T, H]
        return self.hidden_norm(self.fc(features))

    def forward(self, block_embeds: torch.Tensor, features: torch.Tensor | None, block_positions: torch.Tensor, masks: dict | None = None,
                cache: "DraftCache | None" = None) -> torch.Tensor:
        """Draft hidden states for every block slot.

        Args:
            block_embeds: [B, Q, H] target embeddings of the block tokens (last verified token, masks).
            features: [B, T, k*H] target hidden states at ``target_layer_ids``, positions 0..T-1
                (training); None with a cache.
            block_positions: [B, Q] absolute position of each block slot.
            masks: layer type -> mask over [context ; block] keys ([B, 1, Q, T+Q] bool, a flex
                ``BlockMask`` or a ``KeyIntervalMask``; see the masks section); None with a cache.
            cache: drafting (B = 1, one block): the context keys of every layer, already written by
                ``DFlashDrafter.append_context``, and each layer's attention rule.

        Returns:
            [B, Q, H] final-normed hidden states; the target's LM head turns them into logits.
        """
        if cache is not None:
            rope_q = self.rotary_emb(block_embeds, block_positions)
            x = block_embeds
            for i, layer in enumerate(self.layers):
                x = layer(x, rope_q, cache=cache.layer(i))
            return self.norm(x)
        # compile_regions' pieces, unless an enclosing compiled function traces the whole forward (the trainer's
        # compile_scope=step): there they are plain code in its graph
        regions = None if torch.compiler.is_compiling() else getattr(self, "_regions", None)
        context = (self._project_context if regions else self.project_context)(features)
        ctx_positions = torch.arange(features.shape[1], device=features.device).expand(features.shape[0], -1)
        rope_ctx = self.rotary_emb(block_embeds, ctx_positions)
        rope_q = self.rotary_emb(block_embeds, block_positions)
        x = block_embeds
        for i, (layer, layer_type) in enumerate(zip(self.layers, self.config.layer_types)):
            x = layer(x, rope_q, masks[layer_type], context, rope_ctx, regions=regions[i] if regions else None)
        return self.norm(x)


# ----------------------------------------------------------------------------- drafting (inference)

@dataclass(frozen=True)
class LayerAttention:
    causal: bool  # causal inside the block (context keys are always before the block)
    window: int | None  # W keys visible including the query; None = all


def layer_attention(model: DFlashDraftModel, window="trained") -> list[LayerAttention]:
    """Each draft layer's attention rule at inference, with the window override applied."""
    config = model.config
    trained = window == "trained"
    if trained:
        window = config.sliding_window
        if window is None and "sliding_attention" in config.layer_types:
            # Qwen3Config drops sliding_window unless use_sliding_window: a sliding layer would run unwindowed
            raise ValueError(f"layer_types {config.layer_types} with sliding_window=None (use_sliding_window="
                             f"{getattr(config, 'use_sliding_window', None)}); expected the window the sliding layers were trained with")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"the drafter config's sliding_window={window!r}; expected a positive int (W keys, the query's own included)"
                         if trained else f"window={window!r}; expected 'trained', None (full attention) or a positive int")
    block_causal = sliding_block_causal(config)
    rules = []
    for i, layer_type in enumerate(config.layer_types):
        if layer_type == "sliding_attention":
            rules.append(LayerAttention(causal=block_causal, window=window))
        elif layer_type == "full_attention":
            rules.append(LayerAttention(causal=False, window=None))
        else:
            raise ValueError(f"layer_types[{i}]={layer_type!r}; expected sliding_attention or full_attention")
    return rules


@dataclass
class LayerCache:
    """One layer's view of the drafting cache: its context keys, its attention rule, the block's anchor."""

    context: ContextKV
    rule: LayerAttention
    anchor: int
    backend: str

    def attend(self, q: torch.Tensor, k_blk: torch.Tensor, v_blk: torch.Tensor, scale: float) -> torch.Tensor:
        """q [1, Hq, B, D], k_blk/v_blk [1, Hkv, B, D] -> [1, Hq, B, D]: the block over [cached context ; itself]."""
        from_pos = 0 if self.rule.window is None else self.anchor - self.rule.window + 1
        k, v = self.context.with_block(k_blk[0].transpose(0, 1), v_blk[0].transpose(0, 1), from_pos)  # [K, Hkv, D]
        out = cached_attention(q[0].transpose(0, 1), k, v, causal=self.rule.causal, window=self.rule.window, scale=scale,
                               backend=self.backend)  # [B, Hq, D]
        return out.transpose(0, 1)[None]


@dataclass
class DraftCache:
    """``DFlashDraftModel.forward``'s cache argument: every layer's ``ContextKV`` and rule, for a block at ``anchor``."""

    contexts: list[ContextKV]
    rules: list[LayerAttention]
    anchor: int
    backend: str = "sdpa"

    def layer(self, i: int) -> LayerCache:
        return LayerCache(self.contexts[i], self.rules[i], self.anchor, self.backend)


def block_tree(logits: torch.Tensor, topk: int, total: int, redraft=None,
               redrafted: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's dynamic draft tree over one block's per-slot distributions (greedy; no host sync, fixed shapes).

    Slot d's distribution does not depend on the tokens a tree puts before it (those slots held mask tokens in the
    pass), so every depth-d node has the same candidate children, slot d's top-k tokens. Depth 1: slot 1's top-k. Each
    further depth: the k best nodes of the previous depth times their candidate children (k * k candidates, score = the
    summed log-probs of the path), the k best of them the next frontier. The tree is the ``total`` best candidates
    (``select_trees``: scores only fall along a path, so the selection is ancestor-closed).

    Re-drafted depths (``redrafted`` > 0, a drafter trained with revealed slots: ``drafter.reveal_prob``): the k nodes of
    each frontier at depths 1 .. ``redrafted`` are drafted again as blocks with their paths in place of the first mask
    tokens, ``redraft(paths [B, k, d]) -> logits [B, k, D, Vd]`` (paths as indices into the logits' last dim), so their
    children come from a distribution that knows their parent; deeper nodes take theirs from their nearest re-drafted
    ancestor's block.

    Args: logits [B, D, Vd] fp32 for block slots 1 .. D (-inf: an id the drafter cannot draft); topk <= the finite ids.
    Returns: ids [B, total] (indices into the logits' last dim), parent rows [B, total] (rows of [root, nodes], 0 = the
    root), depths [B, total] (1 .. D) and the verify mask [B, total + 1, total + 1] (``tree_masks``).
    """
    bsz, depth, _ = logits.shape
    k, device = topk, logits.device
    top_logp, top_ids = torch.log_softmax(logits, -1).topk(k, dim=-1)  # [B, D, k]
    pool_ids, pool_scores, pool_parent = [top_ids[:, 0]], [top_logp[:, 0]], [torch.full((bsz, k), -1, device=device)]
    pool_depth = [torch.ones(k, dtype=torch.long, device=device)]
    frontier, frontier_scores = torch.arange(k, device=device).expand(bsz, k), top_logp[:, 0]  # pool indices, scores
    # each frontier node's candidate children per slot, [B, k, D, k]: the first block's until a node is re-drafted
    node_logp, node_ids = top_logp[:, None].expand(bsz, k, depth, k), top_ids[:, None].expand(bsz, k, depth, k)
    paths = top_ids[:, 0, :, None]  # [B, k, d] the frontier's tokens from depth 1 (kept while re-drafting)
    size = k
    for d in range(1, depth):
        if d <= redrafted:
            node_logp, node_ids = torch.log_softmax(redraft(paths), -1).topk(k, dim=-1)  # [B, k, D, k]
        candidates = (frontier_scores[:, :, None] + node_logp[:, :, d]).flatten(1)  # [B, k * k]: parent i, child j at i * k + j
        children = node_ids[:, :, d].flatten(1)
        pool_ids.append(children)
        pool_scores.append(candidates)
        pool_parent.append(frontier.repeat_interleave(k, dim=1))
        pool_depth.append(torch.full((k * k,), d + 1, device=device))
        best = candidates.topk(k, dim=-1).indices  # [B, k]
        frontier, frontier_scores = size + best, candidates.gather(1, best)
        if redrafted:  # the new frontier inherits its parents' candidates (and paths, for the next re-draft)
            parent = best // k
            node_logp = node_logp.gather(1, parent[:, :, None, None].expand(bsz, k, depth, k))
            node_ids = node_ids.gather(1, parent[:, :, None, None].expand(bsz, k, depth, k))
            if d < redrafted:
                paths = torch.cat([paths.gather(1, parent[:, :, None].expand(bsz, k, d)), children.gather(1, best)[:, :, None]], dim=2)
        size += k * k
    ids, parents, depths = select_trees(torch.cat(pool_ids, 1), torch.cat(pool_scores, 1), torch.cat(pool_parent, 1),
                                        torch.cat(pool_depth), total)
    return ids, parents, depths, tree_masks(parents, depth)


def dflash_tree_options(model: "DFlashDraftModel", tree_topk, tree_tokens, tree_lookup, tree_redraft=0) -> tuple[bool, int, int]:
    """``tree_options`` for a DFlash drafter: the depth is the block's drafts; prompt lookup's branch at most as deep
    (an accepted path is appended to the drafter as one block); ``tree_redraft`` (``block_tree``'s re-drafted depths)
    in 0 .. block - 2, with a tree."""
    depth = model.block_size - 1
    if isinstance(tree_lookup, int) and not isinstance(tree_lookup, bool) and tree_lookup > depth:  # (other values: tree_options)
        raise ValueError(f"tree_lookup={tree_lookup}; a DFlash tree with block size {model.block_size} takes prompt lookup's chain "
                         f"of at most {depth} drafts")
    if not isinstance(tree_redraft, int) or isinstance(tree_redraft, bool) or not 0 <= tree_redraft <= depth - 1:
        raise ValueError(f"tree_redraft={tree_redraft!r}; expected an int in 0 .. {depth - 1} (depths re-drafted in a block of {model.block_size})")
    if tree_redraft and tree_topk is None and tree_tokens is None:
        raise ValueError(f"tree_redraft={tree_redraft}: re-drafting grows a tree; give --tree-topk/--tree-tokens too")
    return tree_options(tree_topk, tree_tokens, tree_lookup, depth, draft_vocab_size(model.config) or model.config.vocab_size)


def block_ids(token: torch.Tensor, block_size: int, mask_token_id: int, paths: torch.Tensor | None = None) -> torch.Tensor:
    """A block's input ids: the verified ``token`` [B], then mask tokens -> [B, b]; with ``paths`` [B, R, d] (target ids
    for slots 1 .. d) R blocks per row, [B, R, b]: ``block_tree``'s re-drafts (training shows such slots:
    ``train.dflash.build_blocks(reveal=...)``)."""
    bsz, device = token.shape[0], token.device
    if paths is None:
        ids = torch.full((bsz, block_size), mask_token_id, dtype=torch.long, device=device)
        ids[:, 0] = token
        return ids
    rows, d = paths.shape[1], paths.shape[2]
    ids = torch.full((bsz, rows, block_size), mask_token_id, dtype=torch.long, device=device)
    ids[:, :, 0] = token[:, None]
    ids[:, :, 1:d + 1] = paths
    return ids


class DFlashDrafter:
    """Drafts a block of tokens from the target's features with a DFlash model.

    Args:
        model: the loaded ``DFlashDraftModel``.
        embed_tokens, lm_head: the target's (shared, frozen) embedding and LM head (a drafter with a draft
            vocabulary decodes with its own reduced head instead, its logits spread over the target's ids).
        window: inference-time window, see the module docstring.
        attention_backend: ``sdpa`` or ``flashinfer``.
        keep_slack: extra positions a sliding layer's buffer holds before it compacts.
        tree_topk, tree_tokens: a dynamic tree over the block's marginals (``block_tree``, greedy only; either turns
            trees on, the other defaults as for EAGLE-3: ``models.trees.tree_options``).
        tree_lookup: trees only: prompt lookup's chain of up to this many drafts (at most block - 1) joins each tree.
        tree_redraft: trees only: the depths whose nodes are drafted again with their path in place (``block_tree``;
            for a drafter trained with ``drafter.reveal_prob``), one block pass per expanded node; 0: none.
    """

    def __init__(self, model: DFlashDraftModel, embed_tokens: nn.Module, lm_head: nn.Module, window="trained",
                 attention_backend: str = "sdpa", keep_slack: int = 1024, tree_topk: int | None = None,
                 tree_tokens: int | None = None, tree_lookup: int = 0, tree_redraft: int = 0):
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
        self.tree, self.tree_topk, self.tree_tokens = dflash_tree_options(model, tree_topk, tree_tokens, tree_lookup, tree_redraft)
        self.tree_lookup, self.tree_redraft = tree_lookup, tree_redraft
        # target tokens per verify pass: the block, or the root and the tree's nodes (prompt lookup's branch included)
        self.verify_tokens = self.tree_tokens + tree_lookup + 1 if self.tree else self.block_size

    def with_window(self, window) -> "DFlashDrafter":
        """The same drafter and drafting mode under another inference window."""
        return DFlashDrafter(self.model, self.embed_tokens, self.lm_head, window, self.attention_backend, self.keep_slack,
                             self.tree_topk if self.tree else None, self.tree_tokens if self.tree else None, self.tree_lookup,
                             self.tree_redraft)

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
            [B-1, V] fp32 logits (-inf outside a draft vocabulary).
        """
        return self.logits_for_ids(block_ids(token.reshape(1), self.block_size, self.mask_token_id)[0], anchor)

    @torch.no_grad()
    def logits_for_ids(self, ids: torch.Tensor, anchor: int) -> torch.Tensor:
        """``draft_logits`` for a block's input ids [B] as given (``benchmarks/probe_dflash_known_slot.py`` puts tokens
        where the loop puts mask tokens): [B-1, V] fp32."""
        x = self.embed_tokens(ids)[None].to(self.model.fc.weight.dtype)  # [1, B, H]
        positions = torch.arange(anchor, anchor + ids.shape[0], device=self.device)[None]
        hidden = self.model(x, None, positions, cache=DraftCache(self.caches, self.rules, anchor, self.attention_backend))
        hidden = hidden[0, 1:]  # slot 0 is the known token
        head = self.model.head(self.lm_head)
        return self.model.to_target_logits(head(hidden.to(head.weight.dtype)).float())

    @torch.no_grad()
    def draft(self, token: torch.Tensor, anchor: int, sampling: SamplingConfig,
              generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft tokens [B-1] for ``anchor+1 ..`` and, when sampling, their distributions [B-1, V]."""
        return choose(self.draft_logits(token, anchor), sampling, generator)

    @torch.no_grad()
    def draft_tree(self, token: torch.Tensor, anchor: int) -> DraftTree:
        """The dynamic tree over the block's marginals after the verified ``token`` at ``anchor`` (``block_tree``; its
        re-drafts one block pass per node, paths of target ids as the eager logits are over the target's vocabulary)."""
        if not self.tree:
            raise ValueError("draft_tree on a chain drafter; give tree_topk/tree_tokens")

        def redraft(paths: torch.Tensor) -> torch.Tensor:  # [1, k, d] -> [1, k, D, V]
            ids = block_ids(token.reshape(1), self.block_size, self.mask_token_id, paths)[0]  # [k, b]
            return torch.stack([self.logits_for_ids(row, anchor) for row in ids])[None]

        ids, parents, depths, _ = block_tree(self.draft_logits(token, anchor)[None], self.tree_topk, self.tree_tokens,
                                             redraft, self.tree_redraft)
        return DraftTree(tokens=ids[0], parents=parents[0], depths=depths[0])


# ----------------------------------------------------------------------------- drafting over static caches

Matrix = torch.Tensor | Int8Weight  # a drafter matrix as the static drafter multiplies it (``drafter_products``)


@dataclass
class FusedLayer:
    """One layer's projections that share an input, concatenated (``models.static_target.concat_linears``), and its
    other two (the model's own matrices, prepacked copies, or int8 copies)."""

    wqkv: Matrix  # q | k | v rows, [(Hq + 2 Hkv) D, H]
    bqkv: torch.Tensor | None
    w13: Matrix  # gate | up rows, [2 I, H]
    b13: torch.Tensor | None
    wo: Matrix  # o_proj
    bo: torch.Tensor | None
    w2: Matrix  # down_proj
    b2: torch.Tensor | None


@dataclass
class FusedWeights:
    """``StaticDFlashDrafter``'s matrices: the fused ones copies made once (the model's parameters are not touched);
    with ``prepack``, every one a copy in oneDNN's blocked layout for ``prepacked_linear`` (the CPU in fp32); with
    ``int8``, every one (the LM head drafting decodes with included: a copy, the target's own stays as it is) a
    weight-only int8 copy (``swa_kernels/int8_weights.py``). Biases and norms stay in the model's dtype."""

    layers: list[FusedLayer]
    wkv: Matrix  # every layer's k | v rows, layer after layer: [L * 2 Hkv D, H] (an append's one product)
    bkv: torch.Tensor | None
    fc: Matrix  # the feature projection [H, k H]
    bfc: torch.Tensor | None
    head: Matrix  # the LM head drafting decodes with (the target's, or a draft vocabulary's)
    bhead: torch.Tensor | None

    @staticmethod
    @torch.no_grad()
    def of(model: DFlashDraftModel, head: nn.Linear, prepack: bool = False, int8: bool = False) -> "FusedWeights":
        pack = prepacked_copy if prepack else (lambda m: m)
        matrix = (lambda m: int8_weight(m, pack)) if int8 else pack
        layers = []
        for layer in model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            wqkv, bqkv = concat_linears([attn.q_proj, attn.k_proj, attn.v_proj])
            w13, b13 = concat_linears([mlp.gate_proj, mlp.up_proj])
            layers.append(FusedLayer(matrix(wqkv), bqkv, matrix(w13), b13, matrix(attn.o_proj.weight), attn.o_proj.bias,
                                     matrix(mlp.down_proj.weight), mlp.down_proj.bias))
        wkv, bkv = concat_linears([lin for layer in model.layers for lin in (layer.self_attn.k_proj, layer.self_attn.v_proj)])
        return FusedWeights(layers, matrix(wkv), bkv, matrix(model.fc.weight), model.fc.bias, matrix(head.weight), head.bias)


def drafter_products(linear):
    """``linear(x, weight, bias)`` (``few_row_products``'s) that also takes ``Int8Weight`` matrices: those through
    ``int8_linear``, its non-kernel path running ``linear`` over their float codes (only int8 drafters take the wrapper:
    the others keep the plain product, with no type check a call)."""
    def products(x: torch.Tensor, w: Matrix, bias: torch.Tensor | None) -> torch.Tensor:
        return int8_linear(x, w, bias, linear) if isinstance(w, Int8Weight) else linear(x, w, bias)
    return products


def block_visible(slot_pos: torch.Tensor, anchor: torch.Tensor, block_size: int, rule: LayerAttention) -> torch.Tensor:
    """Which keys each block query sees, over a static cache of context slots followed by the block's own.

    Args:
        slot_pos: [B, S] the position each context slot holds (-1: empty).
        anchor: [B] the block's anchor a; query (and block key) k is at position a + k.
        block_size: b.
        rule: the layer's in-block causality and window.

    Returns:
        [B, b, S + b] bool: context slots holding a position in [0, a) (later ones are rejected drafts not yet
        written over), then the block's slots, both under ``aligned_visible`` (positions, the window counting the
        query itself).
    """
    q_pos = anchor[:, None] + torch.arange(block_size, device=anchor.device)  # [B, b]
    key_pos = torch.cat([slot_pos, q_pos], dim=1)  # [B, S + b]
    filled = torch.cat([(slot_pos >= 0) & (slot_pos < anchor[:, None]), torch.ones_like(q_pos, dtype=torch.bool)], dim=1)
    return aligned_visible(q_pos[:, :, None], key_pos[:, None, :], rule.causal, rule.window) & filled[:, None, :]


def rows_visible(visible: torch.Tensor, rows: int) -> torch.Tensor:
    """``block_visible``'s [B, b, S + b] for R blocks at the same anchor over the same context -> [B, R*b, S + R*b]: every
    block's queries see the context as one block does, and their own block's keys alone (block-diagonal)."""
    if rows == 1:
        return visible
    bsz, b, _ = visible.shape
    context, own = visible[:, :, :-b], visible[:, :, -b:]  # [B, b, S], [B, b, b]
    eye = torch.eye(rows, dtype=torch.bool, device=visible.device)
    blocks = (eye[None, :, None, :, None] & own[:, None, :, None, :]).reshape(bsz, rows * b, rows * b)
    return torch.cat([context.repeat(1, rows, 1), blocks], dim=2)


def _softmax_over_slots(scores: torch.Tensor, visible: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """``masked_softmax`` for rows (g, slot) under a mask of the slots alone: scores [B, Hkv, G*b, K], visible
    [B, 1, 1, b, K] broadcast over g (no per-layer copy of the mask for every query head)."""
    b, h, rows, keys = scores.shape
    return masked_softmax(scores.view(b, h, -1, visible.shape[-2], keys), visible, scale, dtype).view(b, h, rows, keys)


def choose_block_attention(name: str | None, device: torch.device, head_dim: int) -> str:
    """``split_kv`` or ``products`` for ``StaticDFlashDrafter``'s block attention: by default the kernel on a GPU with
    Triton and a power-of-two head dimension >= 16, the products elsewhere; an explicit ``split_kv`` that cannot run is an error."""
    if name not in (None, "split_kv", "products"):
        raise ValueError(f"block_attention={name!r}; expected 'split_kv' or 'products'")
    # tl.dot multiplies over the head dimension: at least 16 wide on a GPU
    runnable = block_attention_kernel.available() and takes_head_dim(head_dim)
    if name == "split_kv" and not runnable:
        raise ValueError(f"block_attention='split_kv' needs Triton (pip install triton) and a power-of-two head_dim of at "
                         f"least 16 (this drafter's: {head_dim}); use 'products'")
    if name is not None:
        return name
    return "split_kv" if device.type == "cuda" and runnable else "products"


class StaticDFlashDrafter:
    """DFlash drafting for the static loop: fixed-shape buffers for a batch of rows, so the block pass and the
    context append are captured as CUDA graphs (``models.static_target.CapturedStep``) on a GPU; a greedy chain's whole
    drafting step (the append, then the next block) as one graph that reads the verify's outputs and writes the next
    verify's inputs (``StaticTarget.chain_inputs``) in place (``start_chain``, ``append_and_draft``).

    Per layer: context keys/values ``[B, Hkv, S + block, D]`` and the position each slot holds, ``[B, S]``
    (-1: empty). A full layer keeps every position (S = capacity); a sliding layer of window W is a ring of
    S = W + block slots, position p in slot p mod S (the slack lets an append write a whole verify block, its
    rejected tail included, without evicting a position the next anchor's window still needs). The last
    ``block`` slots are scratch for the block's own keys. Which keys a block query sees comes from the slot
    positions (``visible``), the rules of ``layer_attention`` and the window convention of the module docstring:
    the same drafts as ``DFlashDrafter`` (``tests/test_static_drafters.py``).

    Appends take whole verify blocks: positions after the accepted ones hold rejected tokens' features until the
    next append (at the first unaccepted position) writes over them, and no block query sees them before that
    (context keys must lie before the anchor).

    Fewer, larger kernels (at the 8B shape the block pass's weights take ~1.1 ms to read and its ~0.8 ms more was
    launches and small kernels): each layer's q|k|v and gate|up projections are one matrix each (``FusedLayer``), an
    append projects every layer's keys and values in one product (``wkv``), and on a GPU a chain's block attention is one
    split-KV kernel a layer (``block_attention="split_kv"``, ``swa_kernels/block_attention.py``) that reads which slots a
    query sees from the slot positions; elsewhere (the CPU, trees' re-drafts) the visibility mask is built once per
    step for each distinct rule (layers of one rule share their slot positions), broadcast over the query heads.
    These matrices are inference-only copies made at construction (the ``DFlashDraftModel`` is left as it is, so it
    still trains and runs as the reference): weights loaded into the model afterwards are not seen; ``with_window``
    shares them. ``weights="int8"`` makes them weight-only int8 copies (``swa_kernels/int8_weights.py``), the LM head the
    drafter decodes with included: half the bytes a pass reads on a GPU, the drafts moved by the rounding only.
    """

    appends_whole_block = True  # infer.generate passes every verified position's features, not the accepted ones only

    def __init__(self, model: DFlashDraftModel, embed_tokens: nn.Module, lm_head: nn.Module, window="trained", capture: bool | None = None,
                 compile: bool | None = None, fused: "FusedWeights | None" = None, tree_topk: int | None = None,
                 tree_tokens: int | None = None, tree_lookup: int = 0, tree_redraft: int = 0, draft_tokens: int | None = None,
                 triton_products: bool | None = None, prepack: bool | None = None, weights: str = "model",
                 block_attention: str | None = None):
        check_weights(weights)
        self.model = model.eval().requires_grad_(False)
        self.embed_tokens = embed_tokens
        self.lm_head = lm_head
        self.head = model.head(lm_head)  # a draft vocabulary's reduced head reads Vd rows, not the target's V
        # the CPU in fp32: every product on oneDNN-prepacked copies, as StaticTarget's (the block pass's 16-row
        # products ~1.45x faster than MKL's sgemm on the plain matrices on the 2-core machine)
        if prepack is None:
            prepack = prepack_by_default(self.device, model.fc.weight.dtype)
        self.prepack = prepack
        # weights="int8": every matrix of the pass and the append (the head it decodes with included) a weight-only int8
        # copy, half the bytes a few-row product reads on a GPU; the drafts move by the rounding, the output does not
        self.weights = weights
        self.fused = fused or FusedWeights.of(model, self.head, prepack, int8=weights == "int8")
        self.block = model.block_size  # the trained block: the caches' scratch and a tree's depth
        # trees (``DFlashDrafter``'s options; batched in ``infer.batch``): the accepted path comes back as one block
        self.tree, self.tree_topk, self.tree_tokens = dflash_tree_options(model, tree_topk, tree_tokens, tree_lookup, tree_redraft)
        self.tree_lookup, self.tree_redraft = tree_lookup, tree_redraft
        # draft_tokens (chains): verify the block's first k drafts only. Where every layer is causal inside the block
        # (the recipes' sliding layers), slot j sees no later slot, so the pass runs the first k + 1 slots alone and
        # drafts what the whole block's first k slots would; else the whole block runs and its first k drafts are kept.
        # Lossless either way; fewer verified tokens for a lower ceiling on accepted drafts (a compute-bound step: the CPU)
        if draft_tokens is not None and (self.tree or not 1 <= draft_tokens <= self.block - 1):
            raise ValueError(f"draft_tokens={draft_tokens}: a DFlash chain verifies 1 .. {self.block - 1} drafts (its block of "
                             f"{self.block}); trees take --tree-tokens")
        self.drafts = self.block - 1 if draft_tokens is None else draft_tokens
        self.block_causal = all(rule.causal for rule in layer_attention(model, window))
        self.pass_slots = self.drafts + 1 if self.block_causal else self.block
        self.block_size = self.block if self.tree else self.drafts + 1  # the loop's protocol: most tokens one step makes
        self.verify_tokens = self.tree_tokens + tree_lookup + 1 if self.tree else self.drafts + 1
        self.mask_token_id = model.mask_token_id
        self.target_layer_ids = model.target_layer_ids
        self.rules = layer_attention(model, window)
        self.window_arg = window
        self.capture = self.device.type == "cuda" if capture is None else capture
        self.compile = self.device.type == "cuda" if compile is None else compile
        # the pass's few-row products through swa_kernels/skinny_gemm.py where it has a measured tiling (q|k|v, gate|up, the
        # head at Qwen3-8B's widths: 4-7% faster than cuBLAS there); cuBLAS for the rest, on the CPU and at more rows
        self.triton_products = (self.device.type == "cuda" and skinny_gemm.available) if triton_products is None else triton_products
        self.linear = few_row_products(prepack, self.triton_products)
        # a chain's block attention: ``split_kv`` (swa_kernels/block_attention.py, Triton: one pass over the slots, the mask
        # from the slot positions in the kernel) or ``products`` (two products and a masked softmax over a mask tensor);
        # trees' re-drafts and the CPU's staged passes keep the products
        self.block_attention = choose_block_attention(block_attention, self.device, model.config.head_dim)
        if weights == "int8":  # its matrices are Int8Weight copies: their products through int8_linear
            self.linear = drafter_products(self.linear)
        if self.compile:  # the block pass's norms, RoPE, masks and activations fused (one compiled graph per batch size)
            from swa_kernels.attention import raise_recompile_limit

            raise_recompile_limit()
        # dynamic=None: a second capacity recompiles once with that dimension symbolic, not once per capacity
        self.block_fn = torch.compile(self._block_logits) if self.compile else self._block_logits
        self.block_greedy_fn = torch.compile(self._block_greedy) if self.compile else self._block_greedy
        # the block append too (fc, norms, k/v projections, RoPE, ring writes: ~60 small kernels eager)
        self.append_fn = torch.compile(self._append) if self.compile else self._append
        # a greedy chain's whole drafting step, the append and the next block pass, as one graph (``append_and_draft``)
        self.step_fn = torch.compile(self._append_and_block) if self.compile else self._append_and_block
        self.tree_fn = torch.compile(self._draft_tree) if self.compile else self._draft_tree
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.slot_pos: dict[LayerAttention, torch.Tensor] = {}  # per distinct rule: its layers' slots hold the same positions
        self.capacity = self.batch = 0
        self.graphs = CapturedSteps()
        self._pos = None
        # the batch-1 protocol (``infer.generate``): the token ids whose features row 0's context holds at positions 0 ..
        # after the last generation, what a next turn's prompt may reuse (``kept_prefix``)
        self.context_ids: list[int] = []

    def with_window(self, window) -> "StaticDFlashDrafter":
        return StaticDFlashDrafter(self.model, self.embed_tokens, self.lm_head, window, self.capture, self.compile, self.fused,
                                   self.tree_topk if self.tree else None, self.tree_tokens if self.tree else None, self.tree_lookup,
                                   self.tree_redraft, None if self.tree else self.drafts, self.triton_products, self.prepack,
                                   self.weights, self.block_attention)

    @property
    def device(self) -> torch.device:
        return self.model.fc.weight.device

    def allocate(self, capacity: int, batch: int = 1, keep: int = 0) -> None:
        """Caches for positions ``0 .. capacity-1`` in ``batch`` rows (buffers reused while the size fits), empty but for
        ``keep``: positions ``0 .. keep-1`` of every row stay where the buffers stay and move to their slots in new
        buffers of the same batch (a prefix the next request reuses, ``infer.generate``'s ``cached_ids``; a ring keeps
        its last ``slots`` of them). ``kept_prefix`` says how much of that a prompt can use."""
        # buffers (and the graphs on them) kept while they fit and are at most twice (or 2048 positions more than) asked
        if batch != self.batch or not capacity <= self.capacity <= max(2 * capacity, capacity + 2048):
            cfg, dtype = self.model.config, self.model.fc.weight.dtype
            old = (self.k, self.v, self.slot_pos) if keep and batch == self.batch else None
            self.k, self.v, self.slot_pos = [], [], {}
            self.graphs.clear()
            for rule in self.rules:
                slots = capacity if rule.window is None or rule.window + self.block >= capacity else rule.window + self.block
                shape = (batch, cfg.num_key_value_heads, slots + self.block, cfg.head_dim)
                self.k.append(torch.zeros(shape, dtype=dtype, device=self.device))
                self.v.append(torch.zeros(shape, dtype=dtype, device=self.device))
                if rule not in self.slot_pos:
                    self.slot_pos[rule] = torch.full((batch, slots), -1, dtype=torch.long, device=self.device)
            positions = torch.arange(capacity + self.block, device=self.device)[None]
            cos, sin = self.model.rotary_emb(self.k[0], positions)
            self.cos, self.sin = cos[0], sin[0]  # [capacity + block, D]
            self.capacity, self.batch = capacity, batch
            if old is not None:  # the kept prefix into the new buffers (a rule's positions written once per layer of it)
                old_k, old_v, old_pos = old
                for rule, k_new, v_new, k_old, v_old in zip(self.rules, self.k, self.v, old_k, old_v):
                    move_kept_positions(self.slot_pos[rule], k_new, v_new, old_pos[rule], k_old, v_old, keep)
        for slot_pos in self.slot_pos.values():
            slot_pos.masked_fill_(slot_pos >= keep, -1)

    def reset(self, max_positions: int, keep: int = 0) -> None:
        """``infer.generate``'s batch-1 protocol (``keep``: the positions a reused prefix holds, as ``allocate``)."""
        self.allocate(max_positions + self.block, 1, keep)

    def kept_prefix(self, row: int, keep: int, length: int) -> int:
        """How many leading positions of row ``row``'s context a prompt of ``length`` tokens reuses, given that its first
        ``keep`` tokens are what the row held there (their features in the row's slots, written by the turn before):
        ``keep`` when every position below it that the prompt's next blocks can see is still held (a sliding layer's ring
        of W + block slots has written over positions more than that far behind its newest), else 0. The row forgets
        every position from the returned count on (the prefill writes them again). One host sync."""
        keep = min(keep, length - 1)  # keep may be ``length``: the prompt's last token runs for the first new token
        for rule, held in self.slot_pos.items():
            low = 0 if rule.window is None else max(0, length - rule.window + 1)  # the first block (at length) sees > length - W
            if keep > low and int(((held[row] >= low) & (held[row] < keep)).sum()) != keep - low:
                keep = 0
                break
        for held in self.slot_pos.values():
            held[row].masked_fill_(held[row] >= keep, -1)
        return keep

    def clear_row(self, row: int) -> None:
        """Forget row ``row``'s context (a new prompt in that row of a batch)."""
        for slot_pos in self.slot_pos.values():
            slot_pos[row] = -1

    def move_row(self, src: int, dst: int) -> None:
        """Row ``src``'s context (every layer's keys and values, the slots' positions) into row ``dst``: ``infer.batch``
        packs a draining batch's live rows into the first ones on the CPU, so the passes below run over those alone
        (they take the first B rows of the buffers when given B < the allocated batch)."""
        for k_buf, v_buf in zip(self.k, self.v):
            k_buf[dst], v_buf[dst] = k_buf[src], v_buf[src]
        for slot_pos in self.slot_pos.values():
            slot_pos[dst] = slot_pos[src]

    # --------------------------------------------------------------------------------------- the two passes

    def _append(self, features: torch.Tensor, start: torch.Tensor, row: int | None = None) -> None:
        # features [B, m, k*H] at positions start[b] .. start[b]+m-1 (row given: [1, m, k*H] into that row only)
        bsz, m, _ = features.shape
        hkv, d = self.model.config.num_key_value_heads, self.model.config.head_dim
        # the first B rows (a packed batch), or that row. Written by index into the buffers themselves: an in-place
        # scatter into a row slice made torch.compile write each layer's whole buffer out and copy it back (~6 µs a
        # layer's k or v at the 8B shape, against ~1 for the m rows)
        rows = torch.arange(bsz, device=start.device) if row is None else torch.full((1,), row, device=start.device)
        context = self.model.hidden_norm(self.linear(features.to(self.model.fc.weight.dtype), self.fused.fc, self.fused.bfc))  # [B, m, H]
        positions = start[:, None] + torch.arange(m, device=start.device)  # [B, m]
        cos, sin = self.cos[positions][:, :, None], self.sin[positions][:, :, None]  # [B, m, 1, D]
        kv = self.linear(context, self.fused.wkv, self.fused.bkv).view(bsz, m, len(self.rules), 2, hkv, d)  # every layer's, one product
        heads = torch.arange(hkv, device=start.device)[None, :, None]
        for i, (layer, k_buf, v_buf) in enumerate(zip(self.model.layers, self.k, self.v)):
            slots = k_buf.shape[2] - self.block
            keep = min(m, slots)  # a ring keeps only the last `slots` positions of a long append
            k = rotate(layer.self_attn.k_norm(kv[:, m - keep:, i, 0]), cos[:, m - keep:], sin[:, m - keep:])  # [B, keep, Hkv, D]
            index = (rows[:, None, None], heads, (positions[:, m - keep:] % slots)[:, None, :])  # [B, Hkv, keep] -> a D-row
            k_buf.index_put_(index, k.transpose(1, 2))
            v_buf.index_put_(index, kv[:, m - keep:, i, 1].transpose(1, 2))
        for slot_pos in self.slot_pos.values():
            keep = min(m, slot_pos.shape[1])
            slot_pos.index_put_((rows[:, None], positions[:, m - keep:] % slot_pos.shape[1]), positions[:, m - keep:])

    def _append_and_block(self, features: torch.Tensor, values: torch.Tensor, pos: torch.Tensor, ids: torch.Tensor) -> None:
        # ``append_and_draft``'s step: the verified block's features [B, m, k*H] at pos [B], then the block after the
        # target's token at pos + accepted + 1 (values [B, m+1]: accepted, the m-1 drafts, the token), written in place as
        # the next verify's ids [B, m] and position (pos: read first, written last; the graph's one update)
        self._append(features, pos)
        anchor = pos + values[:, 0] + 1
        token = values[:, -1]
        ids.copy_(torch.cat([token[:, None], self._block_greedy(token, anchor)], dim=1))
        pos.copy_(anchor)

    def _block_logits(self, token: torch.Tensor, anchor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # token [B] at anchor [B] -> logits [B, block-1, Vd] fp32 (Vd = V without a draft vocabulary) and the greedy
        # drafts [B, block-1] as target ids
        logits = self._block_pass(block_ids(token, self.pass_slots, self.mask_token_id), anchor)[:, :self.drafts]
        return logits, self.model.draft_to_target(row_argmax(logits))

    def _block_greedy(self, token: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
        # ``_block_logits``'s greedy drafts alone: no fp32 logits written, the argmax over the head's own dtype (the
        # cast is exact: the same drafts) in ``row_argmax``'s two passes
        logits = self._block_pass(block_ids(token, self.pass_slots, self.mask_token_id), anchor, float_logits=False)
        return self.model.draft_to_target(row_argmax(logits[:, :self.drafts]))

    def _context_slots(self, anchor: torch.Tensor, slots: int) -> int:
        """How many of a layer's ``slots`` context slots a pass over blocks at ``anchor`` [B] reads: on the CPU the first
        ``min(slots, max(anchor))`` (slot j < S holds position j or j + kS, and only positions before a row's anchor are
        seen, so the slots from the furthest anchor on are invisible to every row; reading the anchor costs no sync
        there; at MT-Bench's lengths most of a 2,064-slot ring is empty); elsewhere all of them (fixed shapes for the
        graphs)."""
        return min(slots, int(anchor.max())) if anchor.device.type == "cpu" else slots

    def _visible(self, anchor: torch.Tensor, rows: int = 1, slots: int | None = None) -> dict:
        # [B, 1, 1, R*b, S' + R*b] per rule, broadcast over the KV heads and the G query heads of each (rows (g, slot));
        # b = ``slots`` (the block's first b slots; default the whole block); S' = ``_context_slots``
        b = slots or self.block
        return {rule: rows_visible(block_visible(self._context_of(slot_pos[:anchor.shape[0]], anchor), anchor, b, rule),
                                   rows)[:, None, None]
                for rule, slot_pos in self.slot_pos.items()}

    def _context_of(self, slot_pos: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
        # a rule's slot positions [B, S] cut to the slots the pass reads ([B, S'], S' = ``_context_slots``): the masks and
        # the keys of one pass must cover the same slots
        return slot_pos[:, :self._context_slots(anchor, slot_pos.shape[1])]

    def _block_pass(self, ids: torch.Tensor, anchor: torch.Tensor, visible: dict | None = None, drafts: int | None = None,
                    start: int = 0, batch_rows: torch.Tensor | None = None, float_logits: bool = True,
                    keep_keys: bool = False) -> torch.Tensor:
        # the block pass alone (trees take their top-k, not the argmax): ids [B, b] -> logits [B, d, Vd] fp32 (d: b-1, or
        # the chain's kept drafts if fewer), the block's keys in each layer's scratch slots; ids [B, R, b] -> [B, R, b-1,
        # Vd], R blocks per row over the same context (``block_tree``'s re-drafts): the context's slots then the R blocks'
        # keys, each block seeing its own.
        # visible: ``_visible(anchor, R)`` when the caller already has it (a tree's re-drafts share one)
        # drafts: how many of the slots after the anchor reach the head (default the chain's, ``self.drafts``)
        # start, batch_rows (``_rest_of_block``): ids are the block's slots start .. start+b-1 (its earlier slots' keys are
        # in the scratch already), for the batch rows ``batch_rows`` (their used slots gathered; this pass's keys are not
        # written back); every slot reaches the head when start > 0 (slot 0, the anchor, drafts nothing)
        # keep_keys: the block's keys written into each row's scratch for a later pass to read (``first_drafts``): the
        # products path (the split-KV kernel takes the block's keys raw and writes them nowhere)
        drafts = self.drafts if drafts is None else drafts
        multi = ids.dim() == 3
        bsz, rows, b = ids.shape if multi else (ids.shape[0], 1, ids.shape[1])
        n = rows * b
        hq, hkv, d = self.model.config.num_attention_heads, self.model.config.num_key_value_heads, self.model.config.head_dim
        x = self.embed_tokens(ids.reshape(bsz, n)).to(self.model.fc.weight.dtype)  # [B, R*b, H]
        q_pos = anchor[:, None] + torch.arange(start, start + b, device=ids.device)  # [B, b]
        q_pos = q_pos.repeat(1, rows) if multi else q_pos  # [B, R*b]
        cos, sin = self.cos[q_pos][:, :, None], self.sin[q_pos][:, :, None]  # [B, R*b, 1, D]
        # one kernel a layer over the slots (its mask from the slot positions): a single block from slot 0, every row
        split_kv = self.block_attention == "split_kv" and not multi and batch_rows is None and start == 0 and not keep_keys
        if not split_kv:
            visible = self._visible(anchor, rows, b) if visible is None else visible
        # the context slots each layer reads (the slots ``visible`` covers): the anchor read once a pass, not once a layer
        used_of = {slots: self._context_slots(anchor, slots) for slots in {k_buf.shape[2] - self.block for k_buf in self.k}}
        for layer, w, rule, k_buf, v_buf in zip(self.model.layers, self.fused.layers, self.rules, self.k, self.v):
            attn = layer.self_attn
            q, k, v = self.linear(layer.input_layernorm(x), w.wqkv, w.bqkv).split([hq * d, hkv * d, hkv * d], dim=-1)
            if split_kv:  # raw projections in: the norms, RoPE and the block's keys inside the kernel (three kernels fewer)
                rope = Rope(self.cos, self.sin, attn.q_norm.weight, attn.k_norm.weight, attn.q_norm.variance_epsilon)
                out = block_attention_kernel.block_attention(
                    q.view(bsz, n, hq, d), k_buf[:bsz], v_buf[:bsz], self.slot_pos[rule][:bsz], anchor, attn.scaling,
                    rule.causal, rule.window, k_new=k.view(bsz, n, hkv, d), v_new=v.view(bsz, n, hkv, d),
                    rope=rope).view(bsz, n, hq * d)
            else:  # the two products over a mask from the slot positions (trees' re-drafts, staged passes, the CPU)
                q = rotate(attn.q_norm(q.view(bsz, n, hq, d)), cos, sin)  # [B, R*b, Hq, D]
                k = rotate(attn.k_norm(k.view(bsz, n, hkv, d)), cos, sin).transpose(1, 2)
                v = v.view(bsz, n, hkv, d).transpose(1, 2)
                slots = k_buf.shape[2] - self.block  # the context's slots; the last block's worth: scratch for the block's keys
                used = used_of[slots]
                if multi:
                    keys, values = torch.cat([k_buf[:bsz, :, :used], k], dim=2), torch.cat([v_buf[:bsz, :, :used], v], dim=2)
                elif batch_rows is not None:  # the rows asked for: their context and earlier slots gathered, then these slots
                    keys = torch.cat([k_buf[batch_rows, :, :used], k_buf[batch_rows, :, slots:slots + start], k], dim=2)
                    values = torch.cat([v_buf[batch_rows, :, :used], v_buf[batch_rows, :, slots:slots + start], v], dim=2)
                else:  # the first B rows (a packed batch: B < the allocated rows): the keys into the scratch, read in place
                    end = slots + start + b
                    k_buf[:bsz, :, end - b:end], v_buf[:bsz, :, end - b:end] = k, v
                    keys, values = k_buf[:bsz, :, :end], v_buf[:bsz, :, :end]
                    if used < slots:  # the used context slots, then the block's scratch
                        keys = torch.cat([keys[:, :, :used], keys[:, :, slots:]], dim=2)
                        values = torch.cat([values[:, :, :used], values[:, :, slots:]], dim=2)
                qg = q.transpose(1, 2).reshape(bsz, hkv, hq // hkv * n, d)  # rows (g, slot): heads h * G + g
                out = grouped_attention(qg, keys, values, visible[rule], attn.scaling, softmax=_softmax_over_slots)
                out = out.view(bsz, hq, n, d).transpose(1, 2).reshape(bsz, n, hq * d)
            x = x + self.linear(out, w.wo, w.bo)
            gate, up = self.linear(layer.post_attention_layernorm(x), w.w13, w.b13).chunk(2, dim=-1)
            x = x + self.linear(layer.mlp.act_fn(gate) * up, w.w2, w.b2)
        # only the slots whose drafts are kept reach the norm and the head: a chain of k drafts (``draft_tokens``) over a
        # block pass of 16 slots writes, casts and reads back k rows of 152K logits, not 15 (its argmax: ``row_argmax``).
        # contiguous: the slot slice is a strided 4-D view, which nn.Linear multiplies as a bmm against the head expanded
        # per row (on the CPU a third of the speed of one matrix product over the rows)
        first_head = 1 if start == 0 else 0
        hidden = self.model.norm(x.view(bsz, rows, b, -1)[:, :, first_head:first_head + drafts].contiguous())
        logits = self.linear(hidden.to(self.head.weight.dtype), self.fused.head, self.fused.bhead)
        logits = logits.float() if float_logits else logits  # the greedy chain's argmax reads the head's own dtype
        return logits if multi else logits[:, 0]

    def _rest_of_block(self, anchor: torch.Tensor, rows: torch.Tensor, first: int) -> torch.Tensor:
        # slots first+1 .. drafts of the blocks at anchor [R] of batch rows ``rows`` [R], after ``first_drafts`` wrote
        # slots 0 .. first into every row's scratch: logits [R, drafts-first, Vd] fp32
        s0, n = first + 1, self.drafts - first  # a trimmed chain stops short of the block
        ids = torch.full((rows.shape[0], n), self.mask_token_id, dtype=torch.long, device=anchor.device)
        # the visibility of a block of s0 + n slots, its last n query rows: slot j sees the context and slots 0 .. j
        visible = {rule: block_visible(self._context_of(slot_pos[rows], anchor), anchor, s0 + n, rule)[:, None, None, s0:]
                   for rule, slot_pos in self.slot_pos.items()}
        return self._block_pass(ids, anchor, visible, drafts=n, start=s0, batch_rows=rows)

    @property
    def drafts_in_stages(self) -> bool:
        """Whether a chain's block can be drafted in two passes (``first_drafts``, then ``rest_drafts`` for some rows):
        every layer causal inside the block (slot j sees no later slot, so the first slots alone draft what the whole
        block's would), uncaptured (the second pass's rows vary), a chain."""
        return self.block_causal and not self.capture and not self.tree

    @torch.no_grad()
    def first_drafts(self, token: torch.Tensor, anchor: torch.Tensor, first: int) -> torch.Tensor:
        """The greedy drafts [B, first] (target ids) of the blocks after ``token`` [B] at ``anchor`` [B]: the block pass
        over slots 0 .. first alone, its keys left in each row's scratch for ``rest_drafts``. ``drafts_in_stages`` only."""
        if not self.drafts_in_stages or not 1 <= first < self.drafts:
            raise ValueError(f"first_drafts({first}): needs a block-causal chain drafter, uncaptured, and 1 <= first < {self.drafts}")
        logits = self._block_pass(block_ids(token, first + 1, self.mask_token_id), anchor, drafts=first, keep_keys=True)
        return self.model.draft_to_target(row_argmax(logits))

    @torch.no_grad()
    def rest_drafts(self, anchor: torch.Tensor, rows: torch.Tensor, first: int) -> torch.Tensor:
        """The greedy drafts first+1 .. of the blocks ``first_drafts`` began, for batch rows ``rows`` [R] (their anchors
        ``anchor`` [R]): [R, drafts - first] target ids, the same as the whole block's pass drafts there."""
        return self.model.draft_to_target(row_argmax(self._rest_of_block(anchor, rows, first)))

    def _draft_tree(self, token: torch.Tensor, anchor: torch.Tensor):
        # every re-drafted depth's k blocks sit at the same anchor over the same context: one visibility for them all
        redrafts_visible = self._visible(anchor, self.tree_topk) if self.tree_redraft else None

        def redraft(paths: torch.Tensor) -> torch.Tensor:  # draft-vocabulary paths [B, k, d] -> [B, k, b-1, Vd]
            ids = block_ids(token, self.block, self.mask_token_id, self.model.draft_to_target(paths))
            return self._block_pass(ids, anchor, redrafts_visible)

        first = self._block_pass(block_ids(token, self.block, self.mask_token_id), anchor)
        ids, parents, depths, mask = block_tree(first, self.tree_topk, self.tree_tokens, redraft, self.tree_redraft)
        return self.model.draft_to_target(ids), parents, depths, mask

    def _run(self, name: str, fn, *inputs, borrowed: tuple[int, ...] = ()):
        return self.graphs(name, fn, *inputs, borrowed=borrowed) if self.capture else fn(*inputs)

    @torch.no_grad()
    def append(self, features: torch.Tensor, start: torch.Tensor, row: int | None = None) -> None:
        """Target features [B, m, k*H] of positions ``start[b] ..`` into every layer's context (``row``: features
        [1, m, k*H] into that row alone, a prompt in a batch). Captured for whole-batch block appends; prompt chunks
        run eagerly."""
        if row is None and features.shape[1] == self.block_size:
            self._run("append", self.append_fn, features, start)
        else:
            self._append(features, start, row)

    @torch.no_grad()
    def block_logits(self, token: torch.Tensor, anchor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [B, block-1, Vd] (fp32, over the draft vocabulary if the drafter has one: ``choose`` reads them) for
        positions ``anchor+1 ..`` and the greedy drafts [B, block-1] (target ids). On a GPU these are the captured
        graph's output buffers: valid until the next call."""
        return self._run("block", self.block_fn, token, anchor)

    @torch.no_grad()
    def block_greedy(self, token: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
        """``block_logits``'s greedy drafts [B, block-1] alone (no logits kept): a greedy chain's block pass. On a GPU the
        captured graph's output buffer: valid until the next call."""
        return self._run("block_greedy", self.block_greedy_fn, token, anchor)

    @torch.no_grad()
    def draft_tree(self, token: torch.Tensor, anchor: torch.Tensor):
        """Every row's tree over its block's marginals after the verified ``token`` [B] at ``anchor`` [B] (``block_tree``,
        as ``DFlashDrafter.draft_tree`` grows it): tokens [B, N] (target ids), parents [B, N] (rows of [root, nodes]),
        depths [B, N] and the verify mask [B, N+1, N+1]. On a GPU the captured graph's buffers: valid until the next call."""
        if not self.tree:
            raise ValueError("draft_tree on a chain drafter; give tree_topk/tree_tokens")
        return self._run("tree", self.tree_fn, token, anchor)

    def choose(self, logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator | None):
        """``models.sampling.choose`` over one row's block logits [block-1, Vd]: target ids, and their distributions
        over the target's vocabulary."""
        return choose(self.model.to_target_logits(logits), sampling, generator)

    # --------------------------------------------------------------------------------------- batch-1 protocol

    def _position(self, value: int) -> torch.Tensor:
        if self._pos is None:
            self._pos = torch.zeros(1, dtype=torch.long, device=self.device)
        self._pos.fill_(value)
        return self._pos

    def append_context(self, features: torch.Tensor, start: int, token_ids: torch.Tensor | None = None) -> None:
        self.append(features[None], self._position(start))

    @torch.no_grad()
    def draft(self, token: torch.Tensor, anchor: int, sampling: SamplingConfig,
              generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.draft_at(token, self._position(anchor), sampling, generator)

    @torch.no_grad()
    def start_chain(self, token: torch.Tensor, anchor: int, ids: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A greedy chain's first block after ``token`` ([] or [1]) at ``anchor``, written into the target's verify inputs
        (``StaticTarget.chain_inputs``: ``ids`` [1, block_size], the token then the drafts, and ``pos`` [1], the block's
        position). ``append_and_draft`` then updates both in place, step after step. Returns (ids[0], pos)."""
        if ids.shape != (1, self.block_size) or pos.shape != (1,):
            raise ValueError(f"start_chain: ids {tuple(ids.shape)}, pos {tuple(pos.shape)}; expected (1, {self.block_size}) and (1,)")
        pos.fill_(anchor)
        drafts = self.block_greedy(token.reshape(1), pos)
        ids.copy_(torch.cat([token.reshape(1, 1), drafts], dim=1))
        return ids[0], pos

    @torch.no_grad()
    def append_and_draft(self, features: torch.Tensor, values: torch.Tensor, ids: torch.Tensor,
                         pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A greedy chain's drafting for one loop step, on a GPU one captured graph: the verified block's features
        [block_size, k*H] into the context at the block's position (``pos`` [1], as ``start_chain`` or the step before
        left it), then the next block after the target's token at that position + accepted + 1 (``values`` [block_size +
        1]: the accepted count, the drafts, the token, as ``StaticTarget.greedy_step`` returns them), written in place as
        the next verify's ``ids`` [1, block_size] and ``pos``. The graph reads ``features`` and ``values`` (the target
        graph's outputs) and the target's buffers in place: between the verify's graph and this one, and this one and the
        next verify's, no copy or small kernel is launched (``infer.generate``). Returns (ids[0], pos)."""
        if (features.shape[0] != self.block_size or values.shape != (self.block_size + 1,)
                or ids.shape != (1, self.block_size) or pos.shape != (1,)):
            raise ValueError(f"append_and_draft: features {tuple(features.shape)}, values {tuple(values.shape)}, ids "
                             f"{tuple(ids.shape)}, pos {tuple(pos.shape)}; expected {self.block_size} positions, "
                             f"{self.block_size + 1} values, ids (1, {self.block_size}) and pos (1,)")
        self._run("append_and_draft", self.step_fn, features[None], values[None], pos, ids, borrowed=(0, 1, 2, 3))
        return ids[0], pos

    @torch.no_grad()
    def draft_at(self, token: torch.Tensor, anchor: torch.Tensor, sampling: SamplingConfig,
                 generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``draft`` with the anchor a device tensor ([] or [1]): ``infer.generate`` launches the next block before the
        host has read how many drafts were accepted."""
        if sampling.greedy:
            return self.block_greedy(token.reshape(1), anchor.reshape(1))[0].clone(), None
        logits, _ = self.block_logits(token.reshape(1), anchor.reshape(1))
        return self.choose(logits[0], sampling, generator)
