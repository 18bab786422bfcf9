"""EAGLE-3 drafter (Li et al., arXiv 2503.01840) with per-layer sliding windows.

    features = concat(target hidden states at target_layer_ids: low, mid, high)   [B, T, 3H]
    h0       = fc(features)              (EAGLE-3.1 ``fc_norm``: RMSNorm each part first; ``norm_before_fc``,
                                          speculators' default: one RMSNorm over the concatenation first)
    layer 0  : attention input [input_layernorm(embed(token)) ; hidden_norm(h)]  (2H -> q/k/v)
               residual = h; then post_attention_layernorm -> SwiGLU MLP, as Llama
    layer i>0: a plain Llama decoder layer
    logits   = lm_head(norm(h_out)) over the draft vocabulary (``draft_vocab_size`` tokens)
    next step: h_out (``norm_output``, EAGLE-3.1: norm(h_out)) is fed back as ``h``

Index t of the drafter holds the target's features at position t and the *next* token x_{t+1}, so
it sits at RoPE position t + 1 and predicts x_{t+2}; each further drafting step moves one position
on. vLLM's proposer puts index t at the target's position t instead: a constant offset, which RoPE's
relative angles and the window (both differences of positions) do not see, so the drafts are the same.

Draft vocabulary: draft id i is target id ``i + d2t[i]``; ``t2d[j]`` says whether target id j has
a draft id (``build_draft_vocab``). The token embedding is the target's, frozen.

The config is a ``LlamaConfig`` (the decoder layers are Llama layers whatever the target) carrying
``draft_vocab_size``, ``target_hidden_size``, ``target_layer_ids`` (ours, see models/target.py),
``layer_types``, ``sliding_window``, ``fc_norm``, ``norm_before_fc``, ``norm_output``, ``norm_before_residual``
and ``ttt_length``. Weight names follow vLLM speculators (``layers.{i}``, ``layers.0.hidden_norm``,
``fc``, ``fc_norm.{k}``, ``input_norm``, ``norm``, ``lm_head``, ``embed_tokens``, ``d2t``, ``t2d``);
``train/export.py`` renames them for SGLang.

Attention is the caller's: every layer asks ``attend(layer_idx, q, k, v)`` for its output, so one
forward serves the training-time test (``train/eagle3.py``: keys of earlier steps, masks) and
drafting (``Eagle3Drafter`` below: the caches), the cache an argument of ``attend``.

Drafting (``Eagle3Drafter``): per-layer draft KV caches, chain drafting and EAGLE-2 dynamic trees.
``StaticEagle3Drafter`` (the loop's chains and batched trees, captured as CUDA graphs on a GPU): the same chains and
trees over fixed-shape buffers, appending whole verify blocks (trees: the accepted path); its docstring says why that
stays exact.

Index t of the drafter holds the target's features f_t and the next token x_{t+1} at RoPE position
t + 1 (above), so an accepted position can only be processed once the token
after it is known. The last accepted position therefore waits ("pending") until the next call:

    append_context(f_a .. f_b, a, x_a .. x_b)   stores them; index b waits for x_{b+1}
    draft(x_{b+1}, b + 1, ...)                  step 0 ("extend") over the pending indices -> context
                                                cache; its output at index b predicts x_{b+2} (draft 1);
                                                chain steps j = 1 .. k-1 (position b+1+j) give drafts 2..k

Step 0 keys/values are the context: the target's true features of accepted positions, written
once into each layer's ``ContextKV`` (``models/target.py``; a sliding layer keeps only its last W - 1
indices + slack). Chain and tree keys live in the buffer's scratch slots after the context and are
dropped after verification; the accepted positions come back through ``append_context`` with the
target's features, as SGLang and vLLM re-extend them. Masks follow ``train/eagle3.py``'s TTT masks: a
query at position p sees context indices u with u + 1 > p - W and its own chain (or tree ancestors)
within the same window. Context and chain keys sit at consecutive positions, so a chain step is the
bottom-right-aligned causal window of ``swa_kernels/attention.py``; tree steps use an explicit mask.

Draft vocabulary: logits are over the draft vocabulary; tokens are returned as target ids and, when
sampling, probabilities are scattered into the target vocabulary (speculative sampling stays exact).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import Counter
from typing import Callable

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaPreTrainedModel, LlamaRMSNorm, LlamaRotaryEmbedding, rotate_half

from swa_kernels.attention import aligned_visible, cached_attention, grouped_attention
from swa_kernels.int8_weights import check_weights, int8_linears
from models.sampling import SamplingConfig, logits_to_probs, sample
from models.static_target import CapturedSteps, move_kept_positions
from models.target import ContextKV, check_rope_taken
from models.trees import DraftTree, select_trees, tree_masks, tree_options

# Legend: B batch, L positions in this pass, H hidden, Hq/Hkv heads, D head dim, Vd draft vocabulary.

Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (layer, q, k, v) -> out [B, Hq, L, D]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [B, heads, L, D]; cos/sin: [B, L, D]
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


def make_eagle3_config(target_config, *, num_hidden_layers: int, target_layer_ids: list[int], layer_types: list[str],
                       sliding_window: int | None, draft_vocab_size: int, ttt_length: int = 7, fc_norm: bool = False,
                       norm_output: bool = False, norm_before_residual: bool = False, norm_before_fc: bool = False) -> LlamaConfig:
    """The drafter's config: the target's attention/MLP shape, EAGLE-3 fields on top."""
    if fc_norm and norm_before_fc:
        raise ValueError("EAGLE-3: fc_norm (one RMSNorm per target feature) and norm_before_fc (one over their concatenation) "
                         "are alternatives; set one")
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
    check_rope_taken(config, rope, LlamaRotaryEmbedding)
    config.draft_vocab_size = min(draft_vocab_size, t.vocab_size)
    config.target_hidden_size = t.hidden_size
    config.target_layer_ids = list(target_layer_ids)
    config.layer_types = list(layer_types)
    config.sliding_window = sliding_window
    config.ttt_length = ttt_length
    config.fc_norm = fc_norm
    config.norm_output = norm_output
    config.norm_before_residual = norm_before_residual
    config.norm_before_fc = norm_before_fc
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
        if getattr(config, "norm_before_fc", False):  # speculators' EAGLE-3 default (gpt-oss style): one norm over the concatenation
            self.input_norm = LlamaRMSNorm(num_features * target_h, eps=config.rms_norm_eps)
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
        if hasattr(self, "input_norm"):
            features = self.input_norm(features)
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


# ----------------------------------------------------------------------------- drafting (inference)

# Legend: n/L indices, H hidden, Hq/Hkv heads, D head dim, Vd draft vocab, V target vocab, N tree nodes, k top-k.


def layer_windows(model: Eagle3DraftModel, window="trained") -> list[int | None]:
    """Each draft layer's window at inference (None = full attention), the override applied to sliding layers."""
    trained = window == "trained"
    if trained:
        window = model.sliding_window
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"the drafter config's sliding_window={window!r}; expected a positive int (W keys, the query's own included)"
                         if trained else f"window={window!r}; expected 'trained', None (full attention) or a positive int")
    for i, t in enumerate(model.layer_types):
        if t not in ("sliding_attention", "full_attention"):
            raise ValueError(f"layer_types[{i}]={t!r}; expected sliding_attention or full_attention")
    return [window if t == "sliding_attention" else None for t in model.layer_types]


def drafter_model(model: "Eagle3DraftModel", weights: str) -> "Eagle3DraftModel":
    """The model a drafter runs, in eval mode, frozen: ``model`` itself, or with ``weights="int8"`` a copy whose every
    linear (fc, the layer's projections, the draft head) multiplies an int8 copy of its weight
    (``swa_kernels.int8_weights.int8_linears``; the embedding, norms and d2t shared, the model left as it is)."""
    model = model.eval().requires_grad_(False)
    return int8_linears(model) if weights == "int8" else model


class Eagle3Drafter:
    """Drafts a chain of ``steps`` tokens, or a dynamic tree, with an ``Eagle3DraftModel``.

    Args:
        model: the loaded drafter (its own embedding and draft-vocabulary LM head).
        window: ``"trained"`` (the checkpoint's ``sliding_window``), None (full attention) or an int
            replacing it in every sliding layer.
        steps: chain length k (tree: depth); default the drafter's ``ttt_length``.
        tree_topk, tree_tokens: EAGLE-2 dynamic tree (greedy only): expand the top-k children of the
            top-k nodes per depth, verify the best ``tree_tokens`` nodes by cumulative log-prob
            (either given turns trees on; the other defaults to 8 / min(64, all candidates)).
        tree_lookup: trees only: prompt lookup's chain of up to this many drafts (n-gram drafting over the sequence so
            far, ``infer/prompt_lookup.py``) joins each tree as one more branch (``merge_chain``), a hybrid that takes
            prompt lookup's long copies where the text repeats itself; 0 = none.
        extend_chunk: most indices one step-0 pass runs (bounds memory on long prefills).
        keep_slack: extra indices a sliding layer's buffer holds before it compacts.
    """

    def __init__(self, model: Eagle3DraftModel, window="trained", steps: int | None = None, tree_topk: int | None = None,
                 tree_tokens: int | None = None, attention_backend: str = "sdpa", keep_slack: int = 1024, extend_chunk: int = 512,
                 tree_lookup: int = 0, weights: str = "model"):
        self.weights = check_weights(weights)
        self.model = drafter_model(model, weights)
        self.window_arg = window
        self.windows = layer_windows(model, window)
        self.steps = model.ttt_length if steps is None else steps
        if not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"draft steps={steps!r}; expected a positive int")
        self.tree, self.tree_topk, self.tree_tokens = tree_options(tree_topk, tree_tokens, tree_lookup, self.steps, model.config.draft_vocab_size)
        if extend_chunk < 1:
            raise ValueError(f"extend_chunk={extend_chunk}; expected >= 1")
        self.tree_lookup = tree_lookup
        self.block_size = max(self.steps, tree_lookup) + 1  # accepted drafts per step: 0 .. the deepest branch
        self.verify_tokens = (self.tree_tokens + tree_lookup if self.tree else self.steps) + 1  # target tokens per verify pass
        self.target_layer_ids = model.target_layer_ids
        self.attention_backend = attention_backend
        self.keep_slack = keep_slack
        self.extend_chunk = extend_chunk
        self.scratch = max(extend_chunk, self.steps, (self.steps - 1) * self.tree_topk if self.tree else 0)
        self.caches: list[ContextKV] = []
        self.pending_features: torch.Tensor | None = None  # [m, k*H] indices waiting for their next token
        self.pending_ids: torch.Tensor | None = None  # [m] tokens at those positions
        self.pending_start = 0

    def with_window(self, window) -> "Eagle3Drafter":
        """The same drafter and drafting mode under another inference window."""
        return Eagle3Drafter(self.model, window, self.steps, self.tree_topk if self.tree else None, self.tree_tokens if self.tree else None,
                             self.attention_backend, self.keep_slack, self.extend_chunk, self.tree_lookup, self.weights)

    @property
    def device(self) -> torch.device:
        return self.model.norm.weight.device  # (fc may be an Int8Linear)

    @property
    def dtype(self) -> torch.dtype:
        return self.model.norm.weight.dtype

    def reset(self, max_positions: int) -> None:
        """Empty caches able to hold indices ``0 .. max_positions-1``."""
        cfg = self.model.config
        self.caches = []
        for window in self.windows:
            # a query at position p needs context indices p-W .. p-1 (u + 1 > p - W): W - 1 of them before its own index
            keep = None if window is None or window - 1 >= max_positions else window - 1
            capacity = max_positions if keep is None else min(max_positions, keep + self.keep_slack)
            self.caches.append(ContextKV(cfg.num_key_value_heads, cfg.head_dim, capacity, keep, self.scratch, self.dtype, self.device))
        self.pending_features = self.pending_ids = None
        self.pending_start = 0

    # --- step 0: the context -------------------------------------------------------------------------

    @torch.no_grad()
    def append_context(self, features: torch.Tensor, start: int, token_ids: torch.Tensor) -> torch.Tensor:
        """Accepted positions ``start .. start+n-1``: their target features [n, k*H] and tokens [n].

        Indices whose next token is known are run now only when more than ``extend_chunk`` wait (prefill);
        otherwise ``draft`` runs them with the drafting pass. Returns the step-0 outputs [m, H] run now.
        """
        end = self.pending_start + (0 if self.pending_ids is None else self.pending_ids.shape[0])
        if start != end:
            raise ValueError(f"append_context at {start}; the drafter expects position {end} next")
        token_ids = torch.as_tensor(token_ids, device=self.device).reshape(-1)
        if self.pending_ids is None:
            self.pending_features, self.pending_ids = features, token_ids
        else:
            self.pending_features = torch.cat([self.pending_features, features])
            self.pending_ids = torch.cat([self.pending_ids, token_ids])
        outputs = []
        while self.pending_ids.shape[0] > self.extend_chunk:
            outputs.append(self._extend_pending(self.extend_chunk, self.pending_ids[1:self.extend_chunk + 1]))
        return torch.cat(outputs) if outputs else features.new_zeros(0, self.model.config.hidden_size)

    @torch.no_grad()
    def extend(self, next_token: torch.Tensor, pos: int) -> torch.Tensor:
        """Run every pending index (the last one's next token is ``next_token``, at position ``pos``); [m, H] outputs."""
        if self.pending_ids is None or self.pending_start + self.pending_ids.shape[0] != pos:
            raise ValueError(f"extend at position {pos}: the features of positions up to {pos - 1} must be appended first")
        next_ids = torch.cat([self.pending_ids[1:], next_token.reshape(1).to(self.pending_ids)])
        outputs = []
        while self.pending_ids is not None:
            m = min(self.extend_chunk, self.pending_ids.shape[0])
            outputs.append(self._extend_pending(m, next_ids[:m]))
            next_ids = next_ids[m:]
        return torch.cat(outputs)

    def _extend_pending(self, m: int, next_ids: torch.Tensor) -> torch.Tensor:
        first = self.pending_start
        h = self._run_context(self.pending_features[:m], next_ids, first)
        if m == self.pending_ids.shape[0]:
            self.pending_features = self.pending_ids = None
        else:
            self.pending_features, self.pending_ids = self.pending_features[m:], self.pending_ids[m:]
        self.pending_start = first + m
        return h

    def _run_context(self, features: torch.Tensor, next_ids: torch.Tensor, first: int) -> torch.Tensor:
        """Step 0 at indices ``first .. first+L-1`` (features [L, k*H], next tokens [L]); writes the context; [L, H]."""
        length = features.shape[0]
        hidden = self.model.project_features(features[None].to(self.dtype))  # [1, L, H]
        positions = torch.arange(first + 1, first + 1 + length, device=self.device)[None]

        def attend(i, q, k, v):
            cache, window = self.caches[i], self.windows[i]
            k, v = k[0].transpose(0, 1), v[0].transpose(0, 1)  # [L, Hkv, D]
            keys, values = cache.with_block(k, v, 0 if window is None else first - window + 1)
            out = cached_attention(q[0].transpose(0, 1), keys, values, causal=True, window=window,
                                   scale=self.model.layers[i].self_attn.scaling, backend=self.attention_backend)
            cache.append(k, v)  # after attention: a compaction may move the slice just read
            return out.transpose(0, 1)[None]

        return self.model(next_ids[None], hidden, positions, attend)[0]

    # --- proposals ------------------------------------------------------------------------------------

    def logits_for(self, h: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [n, Vd] (fp32) for the tokens at ``positions`` [n], from outputs h [n, H].

        Every proposal goes through here (tests override it to script proposals)."""
        return self.model.logits(h).float()

    def choose(self, h: torch.Tensor, positions: torch.Tensor, sampling: SamplingConfig,
               generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Target ids [n] and, when sampling, their distribution over the target vocabulary [n, V]."""
        logits = self.logits_for(h, positions)
        if sampling.greedy:
            return self.model.draft_to_target(logits.argmax(-1)), None
        probs = logits_to_probs(logits, sampling)  # [n, Vd]
        ids = self.model.draft_to_target(sample(probs, generator))
        full = probs.new_zeros(probs.shape[0], self.model.config.vocab_size)
        full[:, self.model.draft_ids_in_target()] = probs  # tokens outside the draft vocabulary: q = 0
        return ids, full

    # --- chains ---------------------------------------------------------------------------------------

    @torch.no_grad()
    def draft(self, token: torch.Tensor, pos: int, sampling: SamplingConfig,
              generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``steps`` draft tokens for positions ``pos+1 ..`` after the verified ``token`` at ``pos``.

        Returns target ids [k] and, when sampling, their distributions [k, V] over the target vocabulary.
        """
        h = self.extend(token, pos)[-1:]  # index pos-1, predicts position pos+1
        tokens, probs = [], []
        self.start_chain()
        for j in range(self.steps):
            if j > 0:
                h = self.chain_step(tokens[-1], self.model.next_hidden(h), pos, j)
            t, p = self.choose(h, torch.tensor([pos + 1 + j], device=self.device), sampling, generator)
            tokens.append(t)
            probs.append(p)
        return torch.cat(tokens), None if sampling.greedy else torch.cat(probs)

    def start_chain(self) -> None:
        self.chain_kv = [([], []) for _ in self.model.layers]

    def scratch_keys(self, i: int, k: torch.Tensor, v: torch.Tensor, query_pos: int) -> tuple[torch.Tensor, torch.Tensor, int | None]:
        """Layer i: record this pass's draft keys (k/v [1, Hkv, n, D]) after the earlier chain/tree keys
        and return (keys, values) = the context within the window followed by all of them, and the window."""
        cache, window = self.caches[i], self.windows[i]
        ks, vs = self.chain_kv[i]
        ks.append(k[0].transpose(0, 1))
        vs.append(v[0].transpose(0, 1))
        # a window shorter than the chain may exclude every context index: start the slice at the context's end
        from_pos = 0 if window is None else min(query_pos - window, cache.end_pos)
        keys, values = cache.with_block(torch.cat(ks), torch.cat(vs), from_pos)
        return keys, values, window

    def chain_step(self, token: torch.Tensor, hidden: torch.Tensor, pos: int, j: int) -> torch.Tensor:
        """Chain step j >= 1 from the last context index pos-1: input ``token`` [1] (target id, for
        position pos+j) and ``hidden`` [1, H]; returns the output [1, H] (predicts position pos+j+1)."""
        query_pos = pos + j

        def attend(i, q, k, v):
            keys, values, window = self.scratch_keys(i, k, v, query_pos)
            out = cached_attention(q[0].transpose(0, 1), keys, values, causal=True, window=window,
                                   scale=self.model.layers[i].self_attn.scaling, backend=self.attention_backend)
            return out.transpose(0, 1)[None]

        positions = torch.tensor([[query_pos]], device=self.device)
        return self.model(token.reshape(1, 1), hidden[None], positions, attend)[0]

    # --- trees ----------------------------------------------------------------------------------------

    @torch.no_grad()
    def draft_tree(self, token: torch.Tensor, pos: int) -> DraftTree:
        """EAGLE-2 dynamic tree after the verified ``token`` at ``pos`` (greedy drafting, no host sync).

        Depth 1: the top-k tokens of step 0. Each further depth runs the k best nodes of the previous
        depth (one pass of k queries), adds their top-k children (k*k candidates, score = cumulative
        log-prob) and keeps the k best as the next frontier. The tree is the best ``tree_tokens``
        candidates; parents score at least their children, so the selection is ancestor-closed.
        """
        k = self.tree_topk
        h = self.extend(token, pos)[-1:]
        logp = torch.log_softmax(self.logits_for(h, torch.tensor([pos + 1], device=self.device)), -1)[0]
        scores, ids = logp.topk(k)  # [k]
        pool_ids, pool_scores = [ids], [scores]
        pool_parent, pool_depth = [torch.full((k,), -1, device=self.device)], [torch.ones(k, dtype=torch.long, device=self.device)]
        frontier, frontier_ids, frontier_scores = torch.arange(k, device=self.device), ids, scores
        frontier_hidden, frontier_slot = self.model.next_hidden(h).expand(k, -1), torch.full((k,), -1, device=self.device)
        ancestors = torch.zeros(0, 0, dtype=torch.bool, device=self.device)  # [M, M] among expanded nodes
        expanded_depth = torch.zeros(0, dtype=torch.long, device=self.device)
        self.start_chain()
        size = k
        for d in range(1, self.steps):
            m = ancestors.shape[0]
            grown = torch.zeros(m + k, m + k, dtype=torch.bool, device=self.device)
            grown[:m, :m] = ancestors
            if m:  # a frontier node sees what its parent saw
                grown[m:, :m] = ancestors[frontier_slot.clamp(min=0)] & (frontier_slot >= 0)[:, None]
            grown[torch.arange(m, m + k), torch.arange(m, m + k)] = True
            ancestors = grown
            expanded_depth = torch.cat([expanded_depth, torch.full((k,), d, device=self.device)])
            out = self.tree_step(self.model.draft_to_target(frontier_ids), frontier_hidden, pos, d, ancestors[m:], expanded_depth)
            logp = torch.log_softmax(self.logits_for(out, torch.full((k,), pos + d + 1, device=self.device)), -1)
            top_logp, top_ids = logp.topk(k, dim=-1)  # [k, k]
            cand_scores = (frontier_scores[:, None] + top_logp).flatten()
            pool_ids.append(top_ids.flatten())
            pool_scores.append(cand_scores)
            pool_parent.append(frontier.repeat_interleave(k))
            pool_depth.append(torch.full((k * k,), d + 1, device=self.device))
            best = cand_scores.topk(k).indices
            row = best // k
            frontier, frontier_ids, frontier_scores = size + best, top_ids.flatten()[best], cand_scores[best]
            frontier_hidden, frontier_slot = self.model.next_hidden(out)[row], m + row
            size += k * k
        return select_tree(torch.cat(pool_ids), torch.cat(pool_scores), torch.cat(pool_parent), torch.cat(pool_depth),
                           self.tree_tokens, self.model)

    def tree_step(self, tokens: torch.Tensor, hidden: torch.Tensor, pos: int, d: int, ancestors: torch.Tensor,
                  expanded_depth: torch.Tensor) -> torch.Tensor:
        """Run k frontier nodes at depth d (tokens [k] target ids for position pos+d, hidden [k, H]).

        ancestors: [k, M] which expanded nodes (this depth's included, last k) each query sees;
        expanded_depth: [M]. Returns [k, H].
        """
        k = tokens.shape[0]
        query_pos = pos + d

        def attend(i, q, kk, vv):
            keys, values, window = self.scratch_keys(i, kk, vv, query_pos)
            nodes = ancestors if window is None else ancestors & (expanded_depth > d - window)
            # every query sits at the same position, and the slice starts at the window's edge: all context keys visible
            context = torch.ones(k, keys.shape[0] - nodes.shape[1], dtype=torch.bool, device=self.device)
            out = cached_attention(q[0].transpose(0, 1), keys, values, causal=True, window=window, mask=torch.cat([context, nodes], 1),
                                   scale=self.model.layers[i].self_attn.scaling, backend=self.attention_backend)
            return out.transpose(0, 1)[None]

        positions = torch.full((1, k), query_pos, device=self.device)
        return self.model(tokens[None], hidden[None], positions, attend)[0]


def select_tree(ids: torch.Tensor, scores: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, total: int,
                model: Eagle3DraftModel) -> DraftTree:
    """The ``total`` best pool nodes (draft ids [P], scores [P], parent pool index [P] or -1, depths [P]) as a ``DraftTree``."""
    chosen_ids, parent_rows, chosen_depths = select_trees(ids[None], scores[None], parents[None], depths, total)
    return DraftTree(tokens=model.draft_to_target(chosen_ids[0]), parents=parent_rows[0], depths=chosen_depths[0])


# ----------------------------------------------------------------------------- chain drafting over static caches

DRAFTED_ON_DEVICE = -1  # ``StaticEagle3Drafter._drafted_at`` after ``draft_at``: a position the host has not read


class StaticEagle3Drafter:
    """EAGLE-3 chain drafting for the static loop: fixed-shape buffers for a batch of rows, so a whole draft (step 0
    over the last verify block, then the k - 1 chain steps) is one tensor program with positions as device tensors,
    captured once per (batch, sampling settings) as a CUDA graph (``models.static_target.CapturedStep``) on a GPU and
    replayed. The drafts are ``Eagle3Drafter``'s (``tests/test_static_eagle3.py``), and so are its dynamic trees
    (``tree_topk``/``tree_tokens``, greedy; ``tests/test_static_eagle3_trees.py``): step 0 as for a chain, then each depth's
    k frontier nodes in one pass at position pos + d, their keys in scratch slots (d - 1) * k .., each seeing the ring
    within its window and its expanded ancestors (a per-row [k, M] mask); the pool, the selection of the best
    ``tree_tokens`` and the verify mask are fixed-shape tensor ops, so one graph per batch size drafts every row's tree.
    After the verify (``infer.batch``) the pending block is the root and the accepted path (positions pos .. pos + a),
    padded to P = max(steps, tree_lookup) + 1; its padding is never read, as a chain's rejected tail.

    Buffers (``allocate``), per layer: keys/values ``[B, Hkv, S + P, D]`` and the key position each of the first S
    slots holds, ``[B, S]`` (-1: empty), P = k + 1 (a verify block). Index t's key sits at position t + 1 (module
    docstring). A full layer has S = capacity; a sliding layer of window W is a ring of S = W + P slots, position p in
    slot p mod S. The last P slots are scratch: step 0's own keys while it attends, then the chain's keys. Per row, the
    pending block: target features ``[B, P, k*H]`` and tokens ``[B, P]`` of positions ``pending_start ..``.

    One step of the loop (``appends_whole_block``: the verify block's every position, accepted or not):

        append(f_a .. f_{a+k}, a, x_a .. x_{a+k})   the pending block (copies; nothing runs)
        draft_chain(x_b, b)                         b = a + accepted + 1, x_b the bonus token. Step 0 over the P
                                                    pending indices t = a .. a+k, index t reading token x_{t+1}: the
                                                    block's next token, or x_b where t + 1 == b. Its output at index
                                                    b - 1 (gathered by a device index) gives draft 1; chain steps
                                                    j = 1 .. k-1 at position b + j, fed the previous draft and hidden
                                                    state, give drafts 2 .. k; their keys go to scratch only.

    Step 0 writes every pending index's key into the ring, at positions a+1 .. a+P: those of indices >= b hold
    rejected drafts' features (or nothing, after a prompt), but context keys are read only up to the last context
    position (a for step 0, b for the chain), and the next step 0 (at b) writes positions b+1 .. b+P over them before
    anything could read them. A query at position q sees ring keys at p <= that position with q - W < p, and the
    scratch keys of its own pass within the window: the masks of ``Eagle3Drafter``. The ring loses position a + P - S
    = a - W at most, and the oldest position a later query needs is > b + 1 - W >= a + 2 - W.

    Prompts (``prefill``, eager): step 0 over each chunk's indices whose next token is known, against the ring and
    the chunk's own keys; the chunk's last index waits as row 0 of the pending block for the next chunk or the first
    draft (its other rows hold nothing; their keys land past the anchor, as above).
    """

    appends_whole_block = True  # infer.generate passes every verified position's features, not the accepted ones only

    def __init__(self, model: Eagle3DraftModel, window="trained", steps: int | None = None, capture: bool | None = None,
                 compile: bool | None = None, extend_chunk: int = 512, tree_topk: int | None = None, tree_tokens: int | None = None,
                 tree_lookup: int = 0, weights: str = "model"):
        self.weights = check_weights(weights)
        self.model = drafter_model(model, weights)
        self.window_arg = window
        self.windows = layer_windows(model, window)
        self.steps = model.ttt_length if steps is None else steps
        if not isinstance(self.steps, int) or isinstance(self.steps, bool) or self.steps < 1:
            raise ValueError(f"draft steps={steps!r}; expected a positive int")
        if extend_chunk < 1:
            raise ValueError(f"extend_chunk={extend_chunk}; expected >= 1")
        self.tree, self.tree_topk, self.tree_tokens = tree_options(tree_topk, tree_tokens, tree_lookup, self.steps, model.config.draft_vocab_size)
        self.tree_lookup = tree_lookup  # prompt lookup's chain joins each row's tree (``infer.batch``, ``merge_chains``)
        self.block_size = max(self.steps, tree_lookup) + 1  # P: the most a step accepts plus its bonus, the pending block
        # target tokens per verify pass; scratch slots: step 0's own keys, then the chain's (or the tree's expanded nodes')
        self.verify_tokens = self.tree_tokens + tree_lookup + 1 if self.tree else self.block_size
        self.scratch = max(self.block_size, (self.steps - 1) * self.tree_topk) if self.tree else self.block_size
        self.target_layer_ids = model.target_layer_ids
        self.extend_chunk = extend_chunk
        self.capture = self.device.type == "cuda" if capture is None else capture
        self.compile = self.device.type == "cuda" if compile is None else compile
        if self.compile:  # norms, RoPE, masks and the small products of every step fused (one compiled graph per batch size)
            from swa_kernels.attention import raise_recompile_limit

            raise_recompile_limit()
        self.draft_fn = torch.compile(self._draft_chain) if self.compile else self._draft_chain
        self.tree_fn = torch.compile(self._draft_tree) if self.compile else self._draft_tree
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.slot_pos: list[torch.Tensor] = []
        self.slots: list[int] = []
        self.batch = 0
        self.graphs = CapturedSteps()
        self._pos = None
        self._waiting: list[int | None] = []  # per row: the prompt index waiting in the pending block's row 0 (host)
        self._resume: list[int | None] = []  # per row: the position a kept prefix's prefill resumes at (``kept_prefix``)
        # the batch-1 protocol (``infer.generate``): the token ids its context was made from after the last generation
        self.context_ids: list[int] = []
        self._pending_at: int | None = None  # batch-1 protocol: the pending block's first position (host)
        self._drafted_at: int | None = None  # batch-1 protocol: the position of the last draft since an append (host;
        # DRAFTED_ON_DEVICE after ``draft_at``)

    def with_window(self, window) -> "StaticEagle3Drafter":
        """The same drafter under another inference window."""
        return StaticEagle3Drafter(self.model, window, self.steps, self.capture, self.compile, self.extend_chunk,
                                   self.tree_topk if self.tree else None, self.tree_tokens if self.tree else None, self.tree_lookup,
                                   self.weights)

    @property
    def device(self) -> torch.device:
        return self.model.norm.weight.device  # (fc may be an Int8Linear)

    @property
    def dtype(self) -> torch.dtype:
        return self.model.norm.weight.dtype

    def allocate(self, capacity: int, batch: int = 1, keep: int = 0) -> None:
        """Caches for key positions ``0 .. capacity-1`` in ``batch`` rows (buffers, and the graphs on them, kept while
        they fit and a full layer's is at most twice, or 2048 positions more than, what is asked), empty but for
        ``keep``: keys at positions ``< keep`` and each row's pending position stay where the buffers stay and move
        into new buffers of the same batch (a prefix the next request reuses; ``kept_prefix`` says how much of it)."""
        p = self.block_size
        slots = [capacity if w is None or w + p >= capacity else w + p for w in self.windows]
        if batch != self.batch or not all(need <= have <= max(2 * need, need + 2048) for need, have in zip(slots, self.slots)):
            cfg, dtype, device = self.model.config, self.dtype, self.device
            old = (self.k, self.v, self.slot_pos, self.pending_start) if keep and batch == self.batch else None
            self.k, self.v, self.slot_pos = [], [], []
            self.graphs.clear()
            for s in slots:
                shape = (batch, cfg.num_key_value_heads, s + self.scratch, cfg.head_dim)
                self.k.append(torch.zeros(shape, dtype=dtype, device=device))
                self.v.append(torch.zeros(shape, dtype=dtype, device=device))
                self.slot_pos.append(torch.full((batch, s), -1, dtype=torch.long, device=device))
            self.pending_features = torch.zeros(batch, p, self.model.fc.in_features, dtype=dtype, device=device)
            self.pending_ids = torch.zeros(batch, p, dtype=torch.long, device=device)
            self.pending_start = torch.zeros(batch, dtype=torch.long, device=device)
            self.noise = torch.ones(batch, self.steps, cfg.draft_vocab_size, device=device)  # Exp(1) draws for sampling
            self.slots, self.batch = slots, batch
            if old is not None:  # the kept prefix into the new buffers, and each row's pending position (``kept_prefix``)
                for k_new, v_new, pos_new, k_old, v_old, pos_old in zip(self.k, self.v, self.slot_pos, *old[:3]):
                    move_kept_positions(pos_new, k_new, v_new, pos_old, k_old, v_old, keep)
                self.pending_start.copy_(old[3])
        for slot_pos in self.slot_pos:
            slot_pos.masked_fill_(slot_pos >= keep, -1)
        self._waiting = [None] * batch
        self._resume = [None] * batch
        self._pending_at = self._drafted_at = None

    def kept_prefix(self, row: int, keep: int, length: int) -> int:
        """Where a prompt of ``length`` tokens whose first ``keep`` are what row ``row`` held there resumes its prefill (the
        target's too): index t's key sits at position t + 1 and was made with the token at t + 1, so keys at positions
        up to ``keep - 1`` and up to the row's pending position (later ones may hold rejected drafts') are the
        prompt's; kept when every one the prompt's first index sees is still held (a sliding layer's ring of W + P
        slots writes over older ones), else 0. The row forgets every later key; its next ``prefill`` starts there
        without a pending index. One host sync."""
        # keep may be ``length`` (the whole prompt is what the row held): the key at length - 1 is then the prompt's too
        start = min(keep - 1, int(self.pending_start[row]), length - 1) if keep > 0 else 0
        for held, window in zip(self.slot_pos, self.windows):
            low = 1 if window is None else max(1, start + 2 - window)  # the first index (position start + 1) sees past it
            if start > 0 and low <= start and int(((held[row] >= low) & (held[row] <= start)).sum()) != start - low + 1:
                start = 0
                break
        start = max(start, 0)
        for held in self.slot_pos:
            held[row].masked_fill_(held[row] > start, -1)
        self._waiting[row], self._resume[row] = None, start or None
        return start

    def reset(self, max_positions: int, keep: int = 0) -> None:
        """``infer.generate``'s batch-1 protocol: positions ``0 .. max_positions-1`` (keys one position later, and
        rejected drafts' keys up to a block past the last position); ``keep`` as ``allocate``'s."""
        self.allocate(max_positions + self.block_size, 1, keep)

    def clear_row(self, row: int) -> None:
        """Forget row ``row``'s context (a new prompt in that row of a batch)."""
        for slot_pos in self.slot_pos:
            slot_pos[row] = -1
        self._waiting[row] = self._resume[row] = None

    # --------------------------------------------------------------------------------------- prompts (eager)

    @torch.no_grad()
    def prefill(self, features: torch.Tensor, start: int, token_ids: torch.Tensor, row: int = 0) -> None:
        """A prompt chunk into row ``row``: target features [m, k*H] and tokens [m] of positions ``start ..
        start+m-1``, the chunks in order from position 0. Runs step 0 for every index whose next token is known
        (the previous chunk's last index included); the last one waits in the pending block."""
        resume = start > 0 and self._resume[row] == start  # a kept prefix (``kept_prefix``): index start-1's key is held
        if start == 0:
            self.clear_row(row)
        elif not resume and self._waiting[row] != start - 1:
            expected = "0" if self._waiting[row] is None else str(self._waiting[row] + 1)
            raise ValueError(f"prefill at position {start}; row {row} expects its prompt's position {expected} next")
        self._resume[row] = None
        feats = features.to(self.dtype)
        ids = torch.as_tensor(token_ids, device=self.device).reshape(-1)
        if start > 0 and not resume:  # index start-1 has waited for this chunk's first token
            feats = torch.cat([self.pending_features[row, :1], feats])
            ids = torch.cat([self.pending_ids[row, :1], ids])
        first = start if resume else max(start - 1, 0)
        n = feats.shape[0]
        for c in range(0, n - 1, self.extend_chunk):
            e = min(c + self.extend_chunk, n - 1)
            self._context_pass(row, feats[c:e], ids[c + 1:e + 1], first + c)
        self.pending_features[row, 0] = feats[-1]
        self.pending_ids[row, 0] = ids[-1]
        self.pending_start[row] = first + n - 1
        self._waiting[row] = first + n - 1

    def _context_pass(self, row: int, features: torch.Tensor, next_ids: torch.Tensor, first: int) -> None:
        # step 0 at indices first .. first+L-1 of one row (features [L, k*H], next tokens [L]); their keys into the ring
        length = features.shape[0]
        hidden = self.model.project_features(features[None])  # [1, L, H]
        positions = torch.arange(first + 1, first + 1 + length, device=self.device)[None]  # [1, L]
        q_pos = positions[0]

        def attend(i, q, k, v):
            s, window = self.slots[i], self.windows[i]
            held = self.slot_pos[i][row]  # [S]
            ctx = (held >= 0) & (held <= first) & aligned_visible(q_pos[:, None], held[None], True, window)  # [L, S]
            own = aligned_visible(q_pos[:, None], q_pos[None], True, window)  # [L, L]
            keys = torch.cat([self.k[i][row, :, :s], k[0]], dim=1).transpose(0, 1)  # [S + L, Hkv, D]
            values = torch.cat([self.v[i][row, :, :s], v[0]], dim=1).transpose(0, 1)
            out = cached_attention(q[0].transpose(0, 1), keys, values, causal=True, window=None, mask=torch.cat([ctx, own], dim=1),
                                   scale=self.model.layers[i].self_attn.scaling)
            self._write_ring(i, k, v, positions, slice(row, row + 1))  # after attention: the ring may drop what it read
            return out.transpose(0, 1)[None]

        self.model(next_ids[None], hidden, positions, attend)

    def _write_ring(self, i: int, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, rows=slice(None)) -> None:
        # k/v [b, Hkv, L, D] of key positions [b, L] into layer i's ring (a ring keeps the last S of a longer pass)
        s, length = self.slots[i], positions.shape[1]
        keep = min(length, s)
        k, v, positions = k[:, :, length - keep:], v[:, :, length - keep:], positions[:, length - keep:]
        slot = positions % s
        index = slot[:, None, :, None].expand_as(k)
        self.k[i][rows].scatter_(2, index, k)
        self.v[i][rows].scatter_(2, index, v)
        self.slot_pos[i][rows].scatter_(1, slot, positions)

    # --------------------------------------------------------------------------------------- the step (captured)

    def _attend(self, i: int, q: torch.Tensor, ctx: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
        # q [B, Hq, L, D]; ctx [B, L, S] visible ring slots; own [L or B, L, scratch] visible scratch slots -> [B, Hq, L, D]
        attn = self.model.layers[i].self_attn
        bsz, _, length, d = q.shape
        groups = attn.num_heads // attn.num_kv_heads
        visible = torch.cat([ctx.expand(bsz, length, ctx.shape[-1]), own.expand(bsz, length, own.shape[-1])], dim=2)  # [B, L, S + scratch]
        qg = q.reshape(bsz, attn.num_kv_heads, groups * length, d)  # rows (g, query): heads h * G + g
        out = grouped_attention(qg, self.k[i], self.v[i], visible[:, None].repeat(1, 1, groups, 1), attn.scaling)
        return out.view(bsz, attn.num_heads, length, d)

    def _step0(self, token: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        # step 0 over the pending block (its keys into the ring) after the verified ``token`` [B] at ``pos`` [B]; the
        # output [B, 1, H] at index pos - 1, which predicts position pos + 1
        bsz, p, device = token.shape[0], self.block_size, token.device
        start = self.pending_start  # [B]
        block = torch.arange(p, device=device)
        scratch = torch.arange(self.scratch, device=device)
        q_pos = start[:, None] + 1 + block  # [B, P]: index start + i sits at position start + i + 1
        following = torch.cat([self.pending_ids[:, 1:], token[:, None]], dim=1)  # x_{t+1} within the block
        next_ids = torch.where(q_pos == pos[:, None], token[:, None], following)  # the bonus token after index pos - 1

        def attend0(i, q, k, v):
            s, window = self.slots[i], self.windows[i]
            self.k[i][:, :, s:s + p] = k
            self.v[i][:, :, s:s + p] = v
            held = self.slot_pos[i][:, None, :]  # [B, 1, S]
            ctx = (held >= 0) & (held <= start[:, None, None]) & aligned_visible(q_pos[:, :, None], held, True, window)
            out = self._attend(i, q, ctx, aligned_visible(block[:, None], scratch[None], True, window))
            self._write_ring(i, k, v, q_pos)  # after attention: the ring may drop what it read
            return out

        h = self.model(next_ids, self.model.project_features(self.pending_features), q_pos, attend0)  # [B, P, H]
        # index pos - 1 predicts pos + 1 (clamped: a batch's idle row, at any position, drafts garbage, not a device assert)
        row = (pos - 1 - start).clamp(0, p - 1)
        return h.gather(1, row[:, None, None].expand(bsz, 1, h.shape[2]))

    def _context_visible(self, i: int, pos: torch.Tensor, query_pos: torch.Tensor) -> torch.Tensor:
        # [B, 1, S]: layer i's ring slots a draft query at ``query_pos`` [B] sees (context keys up to position pos [B])
        held = self.slot_pos[i][:, None, :]
        return (held >= 0) & (held <= pos[:, None, None]) & aligned_visible(query_pos[:, None, None], held, True, self.windows[i])

    def _draft_chain(self, token: torch.Tensor, pos: torch.Tensor, sampling: SamplingConfig):
        # token [B] (target id) at pos [B] -> drafts [B, k] (target ids), logits [B, k, Vd] fp32, probs [B, k, V] or None
        bsz = token.shape[0]
        scratch = torch.arange(self.scratch, device=token.device)
        h = self._step0(token, pos)
        drafts, logits, probs = [], [], []
        for j in range(self.steps):
            if j > 0:  # chain step j at position pos + j, fed draft j and the last hidden state
                def attend(i, q, k, v, j=j):
                    s, window = self.slots[i], self.windows[i]
                    self.k[i][:, :, s + j - 1:s + j] = k
                    self.v[i][:, :, s + j - 1:s + j] = v
                    # scratch slot l holds step l + 1's key (position pos + 1 + l): this chain's, up to this step
                    return self._attend(i, q, self._context_visible(i, pos, pos + j), aligned_visible(j - 1, scratch, True, window)[None])

                h = self.model(drafts[-1][:, None], self.model.next_hidden(h), (pos + j)[:, None], attend)  # [B, 1, H]
            step_logits = self.model.logits(h)[:, 0].float()  # [B, Vd]
            if sampling.greedy:
                ids = step_logits.argmax(dim=-1)
            else:  # models.sampling.sample with its Exp(1) draws made outside (draft_chain): argmax(p / E)
                step_probs = logits_to_probs(step_logits, sampling)
                ids = (step_probs / self.noise[:, j]).argmax(dim=-1)
                probs.append(step_probs)
            drafts.append(self.model.draft_to_target(ids))
            logits.append(step_logits)
        full = None
        if probs:  # into the target vocabulary; tokens outside the draft vocabulary: q = 0
            probs = torch.stack(probs, dim=1)  # [B, k, Vd]
            index = self.model.draft_ids_in_target().expand_as(probs)
            full = probs.new_zeros(bsz, self.steps, self.model.config.vocab_size).scatter_(2, index, probs)
        return torch.stack(drafts, dim=1), torch.stack(logits, dim=1), full

    def _draft_tree(self, token: torch.Tensor, pos: torch.Tensor):
        # token [B] at pos [B] -> every row's EAGLE-2 dynamic tree, as ``Eagle3Drafter.draft_tree`` grows it (fixed shapes):
        # tokens [B, N] (target ids), parents [B, N] (rows of [root, nodes]), depths [B, N], mask [B, N+1, N+1]
        bsz, k, device = token.shape[0], self.tree_topk, token.device
        h = self._step0(token, pos)  # [B, 1, H]
        logp = torch.log_softmax(self.model.logits(h)[:, 0].float(), -1)  # [B, Vd]
        scores, ids = logp.topk(k)  # [B, k]
        pool_ids, pool_scores, pool_parent = [ids], [scores], [torch.full((bsz, k), -1, device=device)]
        pool_depth = [torch.ones(k, dtype=torch.long, device=device)]
        frontier, frontier_ids, frontier_scores = torch.arange(k, device=device).expand(bsz, k), ids, scores  # pool indices
        frontier_hidden, frontier_slot = self.model.next_hidden(h).expand(bsz, k, h.shape[2]), None  # slot: among expanded nodes
        # scratch slot m holds the m-th expanded node's key (depth m // k + 1); which expanded nodes each one sees:
        ancestors = torch.zeros(bsz, self.scratch, self.scratch, dtype=torch.bool, device=device)  # [B, M, M], M = scratch
        expanded_depth = torch.arange(self.scratch, device=device) // k + 1
        eye = torch.eye(k, dtype=torch.bool, device=device)
        size = k
        for d in range(1, self.steps):
            m = (d - 1) * k
            if frontier_slot is not None:  # a frontier node sees what its parent saw
                ancestors[:, m:m + k] = ancestors.gather(1, frontier_slot[:, :, None].expand(bsz, k, self.scratch))
            ancestors[:, m:m + k, m:m + k] |= eye  # (no host scalar: this runs inside a CUDA graph capture)
            sees = ancestors[:, m:m + k]  # [B, k, M]

            def attend(i, q, kk, vv, m=m, d=d, sees=sees):
                s, window = self.slots[i], self.windows[i]
                self.k[i][:, :, s + m:s + m + k] = kk
                self.v[i][:, :, s + m:s + m + k] = vv
                own = sees if window is None else sees & (expanded_depth > d - window)
                return self._attend(i, q, self._context_visible(i, pos, pos + d), own)

            positions = (pos + d)[:, None].expand(bsz, k)
            out = self.model(self.model.draft_to_target(frontier_ids), frontier_hidden, positions, attend)  # [B, k, H]
            logp = torch.log_softmax(self.model.logits(out).float(), -1)  # [B, k, Vd]
            top_logp, top_ids = logp.topk(k, dim=-1)  # [B, k, k]
            cand_scores = (frontier_scores[:, :, None] + top_logp).flatten(1)  # [B, k*k]
            pool_ids.append(top_ids.flatten(1))
            pool_scores.append(cand_scores)
            pool_parent.append(frontier.repeat_interleave(k, dim=1))
            pool_depth.append(torch.full((k * k,), d + 1, device=device))
            best = cand_scores.topk(k, dim=-1).indices  # [B, k]
            row = best // k
            frontier, frontier_ids, frontier_scores = size + best, top_ids.flatten(1).gather(1, best), cand_scores.gather(1, best)
            frontier_hidden = self.model.next_hidden(out).gather(1, row[:, :, None].expand(bsz, k, out.shape[2]))
            frontier_slot = m + row
            size += k * k
        ids, parent_rows, depths = select_trees(torch.cat(pool_ids, 1), torch.cat(pool_scores, 1), torch.cat(pool_parent, 1),
                                                torch.cat(pool_depth), self.tree_tokens)
        return self.model.draft_to_target(ids), parent_rows, depths, tree_masks(parent_rows, self.steps)

    @torch.no_grad()
    def draft_tree(self, token: torch.Tensor, pos: torch.Tensor):
        """Every row's dynamic tree after the verified ``token`` [B] at ``pos`` [B] (greedy; ``pos - 1`` in the pending
        block), grown as ``Eagle3Drafter.draft_tree`` grows it. Returns tokens [B, N] (target ids), parents [B, N] (rows
        of [root, nodes], 0 = the root), depths [B, N] (1 .. steps) and the verify mask [B, N+1, N+1] (``tree_masks``).
        On a GPU these are the captured graph's output buffers: valid until the next call."""
        if not self.tree:
            raise ValueError("draft_tree on a chain drafter; give tree_topk/tree_tokens")
        return self._run(("tree",), self.tree_fn, token, pos)

    def _run(self, key: tuple, fn, *inputs):
        # the capture's warm-up runs repeat the step: step 0 rewrites the same ring positions with the same keys
        return self.graphs(key, fn, *inputs) if self.capture else fn(*inputs)

    @torch.no_grad()
    def append(self, features: torch.Tensor, start: torch.Tensor, token_ids: torch.Tensor) -> None:
        """A verify block per row: target features [B, P, k*H] and tokens [B, P] of positions ``start[b] ..
        start[b]+P-1`` (accepted or not), after a ``draft_chain`` at a position in ``start[b]+1 .. start[b]+P``."""
        self.pending_features.copy_(features)
        self.pending_ids.copy_(token_ids)
        self.pending_start.copy_(start)
        self._waiting = [None] * self.batch

    @torch.no_grad()
    def draft_chain(self, token: torch.Tensor, pos: torch.Tensor, sampling: SamplingConfig = SamplingConfig(),
                    generator: torch.Generator | list[torch.Generator] | None = None):
        """k drafts per row after the verified ``token`` [B] at ``pos`` [B] (``pos - 1`` in the pending block).

        generator: for sampling, one for all rows or one per row (each draws its row's Exp(1) noise step by step,
        as ``Eagle3Drafter`` draws it). Returns drafts [B, k] (target ids), their draft-vocabulary logits [B, k, Vd]
        (fp32) and, when sampling, their distributions over the target vocabulary [B, k, V], else None. On a GPU
        these are the captured graph's output buffers: valid until the next call.
        """
        if not sampling.greedy:
            for j in range(self.steps):
                if isinstance(generator, (list, tuple)):
                    for r, g in enumerate(generator):
                        self.noise[r, j].exponential_(1, generator=g)
                else:
                    self.noise[:, j].exponential_(1, generator=generator)
        key = dataclasses.replace(sampling, seed=0)  # the seed lives in the generator, not in the graph
        return self._run(("draft", key), functools.partial(self.draft_fn, sampling=key), token, pos)

    # --------------------------------------------------------------------------------------- batch-1 protocol

    def _position(self, value: int) -> torch.Tensor:
        if self._pos is None:
            self._pos = torch.zeros(1, dtype=torch.long, device=self.device)
        self._pos.fill_(value)
        return self._pos

    def append_context(self, features: torch.Tensor, start: int, token_ids: torch.Tensor) -> None:
        """``infer.generate``: prompt chunks, then after each draft its whole verify block (``appends_whole_block``)."""
        if self._drafted_at is None:
            self.prefill(features, start, token_ids)
            self._pending_at = self._waiting[0]
            return
        # after ``draft_at`` the draft's position lives on the device: the caller appends at the position it reads back
        if (self._drafted_at != DRAFTED_ON_DEVICE and start != self._drafted_at) or features.shape[0] != self.block_size:
            raise ValueError(f"append_context at {start} with {features.shape[0]} positions; after the draft at {self._drafted_at} "
                             f"the drafter takes that step's whole verify block ({self.block_size} positions from {self._drafted_at})")
        self.append(features[None], self._position(start), torch.as_tensor(token_ids, device=self.device)[None])
        self._pending_at, self._drafted_at = start, None

    @torch.no_grad()
    def draft(self, token: torch.Tensor, pos: int, sampling: SamplingConfig,
              generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``steps`` draft tokens [k] for positions ``pos+1 ..`` after the verified ``token`` at ``pos`` and, when
        sampling, their distributions [k, V] over the target vocabulary."""
        if self._pending_at is None or self._drafted_at is not None or not 0 <= pos - 1 - self._pending_at < self.block_size:
            raise ValueError(f"draft at position {pos}: the features of positions up to {pos - 1} must be appended first "
                             f"(and each draft's verify block before the next draft)")
        drafted = self.draft_at(token, self._position(pos), sampling, generator)
        self._drafted_at = pos
        return drafted

    @torch.no_grad()
    def draft_at(self, token: torch.Tensor, pos: torch.Tensor, sampling: SamplingConfig,
                 generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``draft`` with the position a device tensor ([] or [1]): ``infer.generate`` launches the next chain right
        after a verify, before the host has read how many drafts it accepted (the pending block, appended whole before
        the verify's result is read, holds every position the chain can start from). The next ``append_context`` takes
        that step's verify block at the position the host then knows."""
        if self._pending_at is None or self._drafted_at is not None:
            raise ValueError("draft_at: the features up to the draft's position must be appended first (and each draft's "
                             "verify block before the next draft)")
        drafts, _, probs = self.draft_chain(token.reshape(1), pos.reshape(1), sampling, generator)
        self._drafted_at = DRAFTED_ON_DEVICE
        return drafts[0].clone(), None if probs is None else probs[0].clone()
