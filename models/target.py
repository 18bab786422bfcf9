"""The target model, for training and for decoding: one wrapper file.

``TargetModel`` (training): the frozen Hugging Face model and the features a drafter reads from it.

Layer-id convention (used everywhere in this project, and by DFlash and SpecForge):
    layer id ``i`` = the output of decoder layer ``i`` (0-based) = HF ``hidden_states[i + 1]``
    (``hidden_states[0]`` is the embedding output). Valid ids are ``0 .. num_layers - 2``: HF
    reports the *normed* output of the last layer as ``hidden_states[-1]``, and no drafter reads it.

Features are captured with forward hooks on the chosen decoder layers only, and unless logits are
asked for the decoder stack runs only as deep as the deepest one (its layer list cut there, its
final norm an identity, no LM head): the other layers, the final norm and the LM head (150K wide
for Qwen3) are never computed or kept. ``benchmarks/feature_capture_memory.py`` measures the
peak-memory difference against ``output_hidden_states=True``, ``benchmarks/target_forward.py``
the speed. ``compile_layers`` puts each decoder layer's forward under ``torch.compile`` (hooks
stay eager).

``CachedTarget`` (decoding): the target's forward over a preallocated KV cache (after gpt-fast's
``KVCache``), on the HF model's own weights.

Why not Hugging Face's ``StaticCache``: its layers keep their own write offset, so a forward at a
position the cache has already passed (what rejecting drafts needs) writes in the wrong place.
Here the caller names the first position of every forward; a forward at ``start`` writes
keys/values ``start .. start+n-1`` and reads keys ``0 .. start+n-1`` under a causal mask, so
rejected positions need no rollback: the next forward writes over them before anything reads them.

Supported: decoder-only models whose layers are ``input_layernorm -> self_attn(q/k/v/o_proj, optional
q_norm/k_norm) -> post_attention_layernorm -> mlp`` with full attention (Llama 3.x, Qwen2/2.5,
Qwen3, Mistral without a window). Anything else is refused at load time with the reason; HF's own
model stays the reference in tests.

Its features follow the same layer-id convention.

``ContextKV``: a drafter layer's cache of context keys/values (DFlash and EAGLE-3 drafting), kept here
beside the target's own KV cache.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from swa_kernels.attention import cached_attention

log = logging.getLogger(__name__)

try:  # transformers' config classes validate through huggingface_hub's strict dataclasses, whose error is no ValueError
    from huggingface_hub.errors import StrictDataclassError

    STRICT_CONFIG_ERRORS: tuple[type[BaseException], ...] = (StrictDataclassError,)
except ImportError:  # an older huggingface_hub: the config classes raise ValueError, caught beside it
    STRICT_CONFIG_ERRORS = ()

CONFIG_ERRORS = (ValueError, TypeError, KeyError, AttributeError, *STRICT_CONFIG_ERRORS)  # what building a model from a bad config raises


def config_error_text(e: BaseException) -> str:
    """A config class's error on one line: the strict dataclasses' spans lines (its cause on the second), a KeyError is
    only the key (e.g. an unknown ``rope_type``)."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__} {text}" if isinstance(e, KeyError) or not text else text


@dataclass
class TargetFeatures:
    # features: [B, T, k * H], the k selected layers concatenated in the order of layer_ids
    features: torch.Tensor
    # logits: [B, T, V] when asked for, else None
    logits: torch.Tensor | None = None
    # final_hidden: [B, T, H] the last layer's normed output (logits = lm_head(final_hidden)) when asked for
    final_hidden: torch.Tensor | None = None


# An attention implementation registered with transformers' public AttentionInterface / AttentionMaskInterface: SDPA's
# own forward, and SDPA's mask except inside ``whole_causal_pass()`` (the compiled capture: no padding mask, no cache,
# no position ids of ours, as many queries as keys, no window), where the mask is None and SDPA runs with is_causal.
# transformers (5.17) never skips the mask under torch.compile: while tracing it cannot rule out packed sequences in
# the position ids it made itself, so a compiled capture materialised a [B, 1, T, T] mask and cuDNN ran its masked
# kernel: 0.52 ms a layer against 0.19 ms causal for 16 x 2048 tokens at head_dim 64 on the H100 (BENCHMARKS.md,
# issue 25). Outside that scope (eager captures, padding masks, caches, windows) the mask is SDPA's, as before.
CAUSAL_SDPA = "swa_causal_sdpa"
_WHOLE_CAUSAL_PASS = {"on": False}


@contextmanager
def whole_causal_pass():
    """While on, ``CAUSAL_SDPA`` drops the mask of a full causal pass: only for forwards with no padding mask, cache or
    position ids (one sequence per row from position 0), which its caller guarantees."""
    _WHOLE_CAUSAL_PASS["on"] = True
    try:
        yield
    finally:
        _WHOLE_CAUSAL_PASS["on"] = False


SDPA_MASK_ARGS_READ = ("q_length", "kv_length", "q_offset", "kv_offset", "attention_mask", "local_size")


def register_causal_sdpa() -> bool:
    """Register ``CAUSAL_SDPA`` (idempotent); False, with a warning, where this transformers lacks the interfaces."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        sdpa_forward, sdpa_mask = ALL_ATTENTION_FUNCTIONS["sdpa"], ALL_MASK_ATTENTION_FUNCTIONS["sdpa"]
    except (ImportError, KeyError) as e:
        log.warning("transformers has no AttentionInterface/AttentionMaskInterface with sdpa (%s): the compiled capture keeps "
                    "SDPA's materialised causal mask (slower)", e)
        return False

    import inspect

    import transformers

    # causal_sdpa_mask reads these of sdpa_mask's arguments by name: a transformers without one of them (4.x passes
    # cache_position instead of q_length/q_offset) would never take the fast path, or take it wrongly; told, not guessed
    missing = [n for n in SDPA_MASK_ARGS_READ if n not in inspect.signature(sdpa_mask).parameters]
    if missing:
        log.warning("transformers %s: masking_utils.sdpa_mask has no %s (CAUSAL_SDPA checked with 5.17-5.25): the compiled "
                    "capture keeps SDPA's materialised causal mask (slower)", transformers.__version__, missing)
        return False

    def causal_sdpa_mask(*args, **kwargs):
        q_offset, kv_offset = kwargs.get("q_offset", 0), kwargs.get("kv_offset", 0)
        plain_causal = (_WHOLE_CAUSAL_PASS["on"] and not args and kwargs.get("attention_mask") is None and kwargs.get("local_size") is None
                        and isinstance(q_offset, int) and q_offset == 0 and isinstance(kv_offset, int) and kv_offset == 0
                        and kwargs.get("q_length") == kwargs.get("kv_length"))
        return None if plain_causal else sdpa_mask(*args, **kwargs)  # None: the attention runs SDPA with is_causal

    AttentionInterface.register(CAUSAL_SDPA, sdpa_forward)
    AttentionMaskInterface.register(CAUSAL_SDPA, causal_sdpa_mask)
    return True


def check_rope_taken(config, rope: dict, rotary_cls: type) -> None:
    """Raise ``ValueError`` naming transformers' version unless ``rotary_cls(config)`` (the RoPE the drafter runs) has the
    target's theta: the drafters' configs pass ``rope_parameters=`` (transformers 5's spelling); a transformers that keeps
    it as an unread attribute (4.x does) would train and export a drafter on its default theta, silently."""
    import transformers

    rope_type = rope.get("rope_type", "default")
    rotary = rotary_cls(config)
    # a scaled RoPE (llama3, yarn: Llama 3.1, the builtin SmolLM2) dropped falls back to the default type: said, as theta is
    taken = getattr(rotary, "rope_type", None)  # None: a rotary class that does not say (the theta check below still runs)
    if taken is not None and taken != rope_type:
        raise ValueError(f"transformers {transformers.__version__}: {type(config).__name__}(rope_parameters=...) did not take the "
                         f"target's RoPE (type {rope_type!r}, got {taken!r}); the drafter would train on another (tested with 5.17-5.25)")
    if rope_type != "default" or "rope_theta" not in rope:
        return  # scaled RoPEs rescale inv_freq by their own rules
    inv_freq = rotary.inv_freq.float()
    dim = 2 * inv_freq.numel()
    want = 1.0 / rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    if not torch.allclose(inv_freq, want, rtol=1e-4):
        raise ValueError(f"transformers {transformers.__version__}: {type(config).__name__}(rope_parameters=...) did not take the "
                         f"target's RoPE (theta {rope['rope_theta']:g}); the drafter would train on another (tested with 5.17-5.25)")


def layer_ids_fit(layer_ids: list[int], num_layers: int) -> bool:
    """Feature layer ids a target of ``num_layers`` decoder layers has: at least one, each in 0 .. L-2 (id i = output of
    decoder layer i; the last layer's output is the final hidden state, not a feature)."""
    return bool(layer_ids) and all(0 <= i <= num_layers - 2 for i in layer_ids)


def default_layer_ids(drafter: str, num_layers: int, num_features: int | None = None) -> list[int]:
    """The layers a drafter reads when the config names none.

    EAGLE-3: low / mid / high = ``[1, L//2 - 1, L - 4]`` (the EAGLE-3 paper's layers 2, L/2, L-3
    counted in ``hidden_states``, as SpecForge and SGLang use them).
    DFlash: ``num_features`` layers spaced evenly from layer 1 to layer L-3 (z-lab's
    ``build_target_layer_ids``; one feature -> the middle layer).
    """
    if num_layers < 4:
        raise ValueError(f"target has {num_layers} layers; at least 4 are needed to pick draft features")
    if drafter == "eagle3":
        ids = [1, num_layers // 2 - 1, num_layers - 4]
        if len(set(ids)) < 3:  # L < 7: low, mid and high fall on the same layers (trained, then refused at export)
            raise ValueError(f"target has {num_layers} layers: EAGLE-3's default low/mid/high layers {ids} repeat (at least 7 "
                             "are needed); set drafter.target_layer_ids")
        return ids
    if drafter == "dflash":
        k = num_features or 1
        if k == 1:
            return [num_layers // 2]
        start, end = 1, num_layers - 3
        if k > end - start + 1:  # even spacing would repeat layers (trained, then refused at export)
            raise ValueError(f"the drafter reads {k} target layers (drafter.num_target_features, else drafter.num_hidden_layers); "
                             f"a target of {num_layers} layers spaces at most {end - start + 1} distinct ones ({start}..{end}): "
                             "set drafter.num_target_features lower, or drafter.target_layer_ids")
        return [int(round(start + i * (end - start) / (k - 1))) for i in range(k)]
    raise ValueError(f"drafter={drafter!r}; expected 'dflash' or 'eagle3'")


def document_starts(segments: list[list[int]], length: int) -> torch.Tensor:
    """[B, length] long: for each position of a packed row, the index where its document (conversation) starts;
    positions past a row's documents (its padding) start their own, one token long. ``segments``: each row's
    documents' lengths, in order from index 0 (``collate_padded``'s ``segments``). The drafter's masks and labels for
    ``data.pack_documents`` read it: a query sees keys at or after its own start."""
    starts = torch.arange(length).repeat(len(segments), 1)
    for b, lengths in enumerate(segments):
        at = 0
        for n in lengths:
            if at + n > length:
                raise ValueError(f"row {b}: documents {lengths} cover {at + n} tokens; the row holds {length}")
            starts[b, at:at + n] = at
            at += n
    return starts


def document_mask(doc_start: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """[B, 1, T, T] bool (True = attend): query q sees key k when k <= q, k is in q's document (k >= ``doc_start``[b, q])
    and, with ``window``, q - k < W (W keys counting q itself). A document-causal mask for SDPA, as transformers takes a
    prepared 4D mask (its ``create_causal_mask`` returns one as it is)."""
    t = doc_start.shape[1]
    q = torch.arange(t, device=doc_start.device)[:, None]
    k = torch.arange(t, device=doc_start.device)[None, :]
    visible = (k <= q) & (k >= doc_start[:, :, None])
    if window is not None:
        visible = visible & (q - k < window)
    return visible[:, None]


# capture_segments reads packed rows in one document-masked forward while its [B, 1, T, T] masks stay this small (16 rows
# of 2,048 tokens: 64 MiB of bool); longer rows (32K packed rows: 1 GiB a row) are read piece by piece
DOCUMENT_MASK_BYTES = 256 << 20


@functools.cache
def takes_prebuilt_masks(stack_type: type) -> bool:
    """Whether this transformers' decoder stack (``Qwen3Model``, ...) takes masks built beforehand: ``attention_mask`` as a
    dict from layer type to mask, passed to the layers as they are (``if not isinstance(causal_mask_mapping :=
    attention_mask, dict)`` in its forward; transformers 5.x for Qwen3, not for Llama). Read off its source once, so a
    transformers that changes it falls back to building the mask, said once."""
    import inspect

    try:
        source = inspect.getsource(stack_type.forward)
    except (OSError, TypeError) as e:
        log.warning("%s.forward: its source is unreadable (%s); captures let transformers build the causal mask (on a GPU "
                    "one host synchronisation per target forward)", stack_type.__name__, e)
        return False
    takes = "attention_mask, dict)" in source
    if not takes:  # Llama's stack, for one: the normal path, said once
        log.info("%s.forward builds its causal mask itself: a capture with no padding mask checks the position ids for "
                 "packed sequences on the host (on a GPU one synchronisation per target forward; target.compile_capture=true "
                 "avoids it)", stack_type.__name__)
    return takes


def decoder_stack(model: nn.Module) -> nn.Module:
    """The module that owns the decoder layers of an HF causal LM (``model.model`` for Llama/Qwen/gpt-oss)."""
    base = getattr(model, "model", None) or getattr(model, getattr(model, "base_model_prefix", ""), None)
    for owner in (base, getattr(base, "decoder", None), getattr(base, "language_model", None)):
        if isinstance(getattr(owner, "layers", None), nn.ModuleList):
            return owner
    raise ValueError(f"{type(model).__name__}: cannot find its decoder layers (expected model.layers)")


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder-layer list of an HF causal LM (``model.model.layers`` for Llama/Qwen/gpt-oss)."""
    return decoder_stack(model).layers


def output_recorder(store: dict[int, torch.Tensor], layer_id: int, state: dict | None = None):
    """A forward hook keeping a decoder layer's output hidden states in ``store[layer_id]``; with ``state``, only while
    ``state["on"]`` (``compile_capture``'s hooks stay registered and record only during its calls)."""

    def hook(module: nn.Module, args: Any, output: Any) -> None:
        if state is None or state["on"]:
            store[layer_id] = output[0] if isinstance(output, tuple) else output

    return hook


def dequantizing(path: str, local_only: bool, what: str) -> dict[str, Any]:
    """``from_pretrained``'s extra arguments for a checkpoint stored quantized. MXFP4 (gpt-oss's experts, as published):
    dequantized at load to the loading dtype. Left to itself, transformers runs MXFP4 experts on Triton kernels it fetches
    from the hub (``kernels-community/gpt-oss-triton-kernels``) wherever the ``kernels`` package is installed: a download
    at run time (refused offline), and kernels this toolkit's loops were never checked on. Other quantization methods go
    to transformers as the checkpoint says."""
    from transformers import AutoConfig

    quantization = getattr(AutoConfig.from_pretrained(path, local_files_only=local_only), "quantization_config", None)
    method = quantization.get("quant_method") if isinstance(quantization, dict) else getattr(quantization, "quant_method", None)
    if str(getattr(method, "value", method)).lower() != "mxfp4":
        return {}
    from transformers import Mxfp4Config

    log.warning("%s=%r: MXFP4 experts dequantized at load (gpt-oss-20b: ~13 GB as stored, ~42 GB in bf16)", what, path)
    return {"quantization_config": Mxfp4Config(dequantize=True)}


class TargetModel:
    """A frozen Hugging Face causal LM that returns hidden states at chosen layers.

    Args:
        model: the loaded ``AutoModelForCausalLM`` (put in eval mode, gradients off).
        tokenizer: its tokenizer.
        path: where it was loaded from (recorded in run metadata).
    """

    def __init__(self, model: nn.Module, tokenizer: Any, path: str):
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.path = path
        self.load_settings: dict[str, str] | None = None  # from_pretrained's arguments, where it loaded this target
        self.stack = decoder_stack(model)
        self.layers = self.stack.layers

    @classmethod
    def from_pretrained(cls, path: str, device: str | torch.device = "cpu", dtype: str = "auto", attn_implementation: str = "auto",
                        what: str = "target.path") -> "TargetModel":
        """Load from a local folder or a hub id (offline: from the local hub cache, or a one-line error at once:
        ``models.hub``); bf16 on GPU and fp32 on CPU unless ``dtype`` says. ``attn_implementation``: Hugging Face's;
        ``auto`` lets it choose (SDPA where the architecture has it; gpt-oss, whose sinks SDPA lacks, runs eager).
        ``what``: the setting a one-line error names (``target.path`` in train, ``--target`` in infer, eval and export)."""
        from safetensors import SafetensorError
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from models.hub import local_files_only

        local_only = local_files_only(path, what)
        device = torch.device(device)
        if dtype == "auto":
            torch_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        else:
            torch_dtype = getattr(torch, dtype)
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local_only)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype,
                                                         attn_implementation=None if attn_implementation == "auto" else attn_implementation,
                                                         local_files_only=local_only, **dequantizing(path, local_only, what))
        except (OSError, ValueError, RuntimeError, TypeError, SafetensorError, *STRICT_CONFIG_ERRORS) as e:
            # transformers raises ValueError for a folder it cannot read (no model_type, no tokenizer); a truncated shard
            # SafetensorError, a config.json short of a size a RuntimeError, a field of the wrong type a strict-dataclass error
            raise ValueError(f"{what}={path!r}: cannot load a causal LM and tokenizer there ({' '.join(str(e).split())})") from None
        target = cls(model.to(device), tokenizer, path)
        # how it was loaded, for another process to load the same target (data.regenerate.processes)
        target.load_settings = {"path": path, "device": str(device), "dtype": str(torch_dtype).removeprefix("torch."),
                                "attn_implementation": attn_implementation}
        return target

    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def num_layers(self) -> int:
        return self.model.config.get_text_config().num_hidden_layers

    @property
    def hidden_size(self) -> int:
        return self.model.config.get_text_config().hidden_size

    @property
    def vocab_size(self) -> int:
        return self.model.get_input_embeddings().num_embeddings

    @property
    def pad_id(self) -> int:
        """The id batches are padded with: the tokenizer's pad token, else its end-of-sequence token."""
        t = self.tokenizer
        return t.pad_token_id if t.pad_token_id is not None else t.eos_token_id

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Module:
        return self.model.get_output_embeddings()

    def check_layer_ids(self, layer_ids: list[int], where: str = "drafter.target_layer_ids") -> None:
        if not layer_ids_fit(layer_ids, self.num_layers):
            raise ValueError(
                f"{where}={layer_ids}: ids must lie in 0..{self.num_layers - 2} "
                f"(id i = output of decoder layer i; the target has {self.num_layers} layers)"
            )

    def compile_layers(self) -> None:
        """Run each decoder layer's forward under ``torch.compile`` (fuses norms, RoPE and the MLP's
        elementwise ops; the capture hooks stay outside the compiled code)."""
        for layer in self.layers:
            if "forward" not in vars(layer):
                layer.forward = torch.compile(layer.forward)

    def compile_capture(self, layer_ids: list[int]) -> None:
        """``capture(layer_ids)`` (features only, or with ``with_final_hidden``: every layer and the final norm, EAGLE-3's
        capture) as one compiled graph: the embedding, the stack's mask building, the
        layers up to the deepest one read and the concatenation, one call where ``compile_layers`` makes one per layer
        with the stack's eager glue between them (on a 27M target each call costs more host time than its GPU work).
        The layers' hooks are registered once here and record only during that call, so the graph sees no hook
        being added or removed (either breaks it); the shortened stack is one fixed ModuleList, so the graph's guards
        hold from call to call. On SDPA the model switches to ``CAUSAL_SDPA``: called with no padding mask (the trainer's
        right-padded batches) its graph runs SDPA's causal kernels instead of a materialised mask."""
        from swa_kernels.attention import raise_recompile_limit

        self.check_layer_ids(layer_ids)
        if getattr(self, "_compiled_capture", None) is not None:
            raise RuntimeError(f"compile_capture: already compiled for layers {self._compiled_capture[0]} (its hooks stay registered)")
        raise_recompile_limit()  # one graph per shape: trainer.pad_multiple's few and the evaluation's
        if self.config._attn_implementation == "sdpa" and register_causal_sdpa():
            self.model.set_attn_implementation(CAUSAL_SDPA)  # an unpadded causal pass without a mask (CAUSAL_SDPA)
        ids, state = list(layer_ids), {"on": False}
        recorded: dict[int, torch.Tensor] = {}
        for i in set(ids):
            self.layers[i].register_forward_hook(output_recorder(recorded, i, state))

        def features(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
            self.stack(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
            out = torch.cat([recorded[i] for i in ids], dim=-1)
            recorded.clear()
            return out

        def features_and_final(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
            # EAGLE-3's capture (with_final_hidden): the whole stack and its final norm in the graph
            final = self.stack(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
            out = torch.cat([recorded[i] for i in ids], dim=-1)
            recorded.clear()
            return out, final

        self._compiled_capture = (ids, state, torch.compile(features, dynamic=False), torch.compile(features_and_final, dynamic=False))

    def release_layers(self) -> None:
        """Free the decoder layers (a run reading a feature store needs only the embedding, the LM
        head and the config); ``capture`` refuses afterwards."""
        self.stack.layers = self.layers = nn.ModuleList()
        self.__dict__.pop("_cut_stacks", None)
        self.__dict__.pop("_compiled_capture", None)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def uncompile_layers(self) -> None:
        for layer in self.layers:
            vars(layer).pop("forward", None)

    @contextmanager
    def _stack_cut_after(self, depth: int):
        """The decoder stack with only its first ``depth`` layers and no final norm, for the duration."""
        layers, norm = self.stack.layers, getattr(self.stack, "norm", None)
        # the same shortened ModuleList and Identity every time: a compiled capture guards on them
        cut = self.__dict__.setdefault("_cut_stacks", {})
        if depth not in cut:
            cut[depth] = (nn.ModuleList(list(layers)[:depth]), nn.Identity())
        self.stack.layers = cut[depth][0]
        if norm is not None:
            self.stack.norm = cut[depth][1]
        try:
            yield self.stack
        finally:
            self.stack.layers = layers
            if norm is not None:
                self.stack.norm = norm

    def stack_mask(self, attention_mask: torch.Tensor | None):
        """The ``attention_mask`` to hand the decoder stack. With no padding mask (the trainer's right-padded rows: one
        causal pass each), on SDPA with full-attention layers only and a stack that takes prebuilt masks: ``{"full_attention":
        None}``, so transformers builds no mask and SDPA runs its causal kernel. Built by transformers (5.17-5.24), that
        mask first checks the position ids for packed sequences with a Python branch on a device tensor
        (``masking_utils.find_packed_sequence_indices``): a host synchronisation per forward, so one per training step
        (BENCHMARKS.md, "EAGLE-3's training step compiled whole"). Anything else: ``attention_mask`` as given."""
        if attention_mask is not None or self.config._attn_implementation not in ("sdpa", CAUSAL_SDPA):
            return attention_mask
        types = set(getattr(self.config, "layer_types", None) or ["full_attention"])
        if types != {"full_attention"} or not takes_prebuilt_masks(type(self.stack)):
            return attention_mask
        return {"full_attention": None}

    def document_mask_refusal(self) -> str | None:
        """Why this target cannot read packed documents through a prepared mask (``document_masks``), or None."""
        impl = self.config._attn_implementation
        if impl not in ("sdpa", CAUSAL_SDPA, "eager"):
            return f"the target's attention {impl!r} does not take a prepared document mask; use target.attn_implementation=sdpa"
        other = set(getattr(self.config, "layer_types", None) or []) - {"full_attention", "sliding_attention"}
        if other:  # linear attention, SSM or chunked layers ignore a 4D mask: read piece by piece instead
            return f"layer types {sorted(other)} do not read a prepared attention mask"
        try:
            windows = sorted(w for w in set(layer_windows(self.config)) if w is not None)
        except ValueError as e:
            return str(e)
        if windows and not takes_prebuilt_masks(type(self.stack)):
            return (f"{type(self.stack).__name__} builds its own sliding-window masks (windows {windows}), which a prepared mask "
                    "would skip")
        return None

    def document_mask_bytes_per_pair(self) -> int:
        """Bytes ``document_masks`` holds per (query, key) pair: one bool (SDPA) or one float (eager) per mask, two masks
        where sliding layers need their own."""
        element = self.model.dtype.itemsize if self.config._attn_implementation == "eager" else 1
        windows = {w for w in layer_windows(self.config) if w is not None}
        return element * (1 + len(windows))

    def document_masks(self, doc_start: torch.Tensor):
        """The ``attention_mask`` to hand the decoder stack for packed documents (``document_mask``): one 4D mask, or a
        dict by layer type for a stack that takes prebuilt masks (a sliding layer's mask with its window too); additive
        floats for the eager attention. A ValueError for what a 4D mask cannot express here (sliding layers in a stack
        that builds its own masks, attention implementations other than SDPA and eager)."""
        refusal = self.document_mask_refusal()
        if refusal is not None:
            raise ValueError(f"packed documents: {refusal}")
        impl = self.config._attn_implementation
        windows = set(layer_windows(self.config))
        prebuilt = takes_prebuilt_masks(type(self.stack))

        def as_impl(mask: torch.Tensor) -> torch.Tensor:
            if impl != "eager":
                return mask
            return torch.zeros(mask.shape, dtype=self.model.dtype, device=mask.device).masked_fill(~mask, torch.finfo(self.model.dtype).min)

        full = as_impl(document_mask(doc_start))
        if not prebuilt:
            return full
        masks = {"full_attention": full}
        for window in windows - {None}:
            masks["sliding_attention"] = as_impl(document_mask(doc_start, window))
        return masks

    @torch.no_grad()
    def capture(self, input_ids: torch.Tensor, layer_ids: list[int], attention_mask: torch.Tensor | None = None, with_logits: bool = False,
                with_final_hidden: bool = False, compiled: bool = True, doc_start: torch.Tensor | None = None) -> TargetFeatures:
        """Run the target and return the hidden states of ``layer_ids``.

        Args:
            input_ids: [B, T] token ids.
            layer_ids: decoder-layer ids (see the module docstring), any order, no repeats.
            attention_mask: [B, T], 1 on real tokens (right padding), or None.
            with_logits: also run the remaining layers and the LM head and return ``logits``.
            with_final_hidden: also run the remaining layers and the final norm, not the LM head, and
                return ``final_hidden``: the caller applies ``lm_head`` a chunk of rows at a time (at 32K
                tokens Qwen3's logits alone are 9.3 GiB in bf16).
            compiled: through ``compile_capture``'s graph where there is one (its shapes are static: a batch of a shape
                it has not seen compiles again); False runs eagerly, for callers whose shapes change every call.
            doc_start: [B, T] packed rows of documents (``document_starts``): each token reads only its own document,
                from position 0 (``document_mask`` and positions restarting at every start), as if read alone; with it
                ``attention_mask`` is ignored and the run is eager (``compile_capture``'s graph takes no positions).

        Returns:
            ``TargetFeatures`` with ``features [B, T, len(layer_ids) * H]`` in the model's dtype,
            and ``logits [B, T, V]`` or None.
        """
        if not len(self.layers):
            raise RuntimeError("the target's decoder layers were released (this run reads a feature store)")
        self.check_layer_ids(layer_ids)
        deepest = max(layer_ids)
        graph = getattr(self, "_compiled_capture", None) if compiled and doc_start is None else None
        if graph is not None and graph[0] == list(layer_ids) and not with_logits:
            ids, state, features, features_and_final = graph
            # no padding mask: one causal pass per row (the trainer's right-padded rows; CAUSAL_SDPA drops the mask)
            causal = whole_causal_pass() if attention_mask is None else contextlib.nullcontext()
            stack = contextlib.nullcontext() if with_final_hidden else self._stack_cut_after(deepest + 1)
            with stack, causal:
                state["on"] = True
                try:
                    if with_final_hidden:
                        out, final = features_and_final(input_ids, attention_mask)
                        return TargetFeatures(features=out, logits=None, final_hidden=final)
                    return TargetFeatures(features=features(input_ids, attention_mask), logits=None, final_hidden=None)
                finally:
                    state["on"] = False
        captured: dict[int, torch.Tensor] = {}
        handles = [self.layers[i].register_forward_hook(output_recorder(captured, i)) for i in set(layer_ids)]
        logits = final_hidden = None
        extra = {}
        if doc_start is None:
            mask = self.stack_mask(attention_mask)
        else:
            mask = self.document_masks(doc_start)
            extra["position_ids"] = torch.arange(input_ids.shape[1], device=input_ids.device) - doc_start
        try:
            if with_logits:
                logits = self.model(input_ids=input_ids, attention_mask=mask, use_cache=False, logits_to_keep=0, **extra).logits
            elif with_final_hidden:
                final_hidden = self.stack(input_ids=input_ids, attention_mask=mask, use_cache=False, **extra).last_hidden_state
            else:
                with self._stack_cut_after(deepest + 1) as stack:
                    stack(input_ids=input_ids, attention_mask=mask, use_cache=False, **extra)
        finally:
            for h in handles:
                h.remove()
        features = torch.cat([captured[i] for i in layer_ids], dim=-1)
        return TargetFeatures(features=features, logits=logits, final_hidden=final_hidden)


    @torch.no_grad()
    def capture_segments(self, input_ids: torch.Tensor, layer_ids: list[int], attention_mask: torch.Tensor | None,
                         segments: list[list[int]], with_final_hidden: bool = False) -> TargetFeatures:
        """``capture`` where row ``b`` is read as the pieces ``segments[b]`` (lengths, consecutive from position 0), each
        from position 0 with no earlier piece as context: packed rows whose conversations the target reads one at a time
        (``data.pack_fresh_fraction``). A row of one segment is read whole, as ``capture`` reads it. Every piece of the
        batch runs in one forward at the rows' shape, every piece (and every whole row) a document of its own
        (``document_mask``, positions restarting at each piece), while that mask stays within ``DOCUMENT_MASK_BYTES``;
        past it (long packed rows) the pieces run as rows of their own, right-padded to the longest. Positions past a
        row's pieces (its padding) hold what the pass left there (zeros, or a row read whole: its padding's features);
        nothing reads them. Returns ``capture``'s ``features`` (and ``final_hidden``) at the rows' shape. Eager, past
        ``compile_capture``'s graph: it takes no positions, and the pieces' shapes change from batch to batch (each new
        shape compiled the graph again)."""
        b, t = input_ids.shape
        split = [r for r, lengths in enumerate(segments) if len(lengths) > 1]
        if not split:
            return self.capture(input_ids, layer_ids, attention_mask=attention_mask, with_final_hidden=with_final_hidden)
        pieces = []  # (row, start, length)
        for r in split:
            start = 0
            for n in segments[r]:
                pieces.append((r, start, int(n)))
                start += int(n)
            if start > t:
                raise ValueError(f"row {r}: segments {segments[r]} cover {start} tokens; the row holds {t}")
        if self.document_mask_refusal() is None and b * t * t * self.document_mask_bytes_per_pair() <= DOCUMENT_MASK_BYTES:
            # one forward at the rows' shape, each piece (and each whole row) a document; padding zeroed as below
            real = [list(lengths) if r in split else [int(sum(lengths))] for r, lengths in enumerate(segments)]
            read = self.capture(input_ids, layer_ids, with_final_hidden=with_final_hidden, doc_start=document_starts(real, t).to(input_ids.device))
            covered = (torch.arange(t, device=input_ids.device)[None, :] < torch.tensor([sum(x) for x in real], device=input_ids.device)[:, None])
            covered = covered[..., None]
            final = None if read.final_hidden is None else read.final_hidden * covered
            return TargetFeatures(features=read.features * covered, final_hidden=final)
        longest = max(n for _, _, n in pieces)
        ids = input_ids.new_zeros(len(pieces), longest)
        mask = input_ids.new_zeros(len(pieces), longest)
        for j, (r, start, n) in enumerate(pieces):
            ids[j, :n] = input_ids[r, start:start + n]
            mask[j, :n] = 1
        read = self.capture(ids, layer_ids, attention_mask=mask, with_final_hidden=with_final_hidden, compiled=False)
        features = read.features.new_zeros(b, t, read.features.shape[-1])
        final = None if read.final_hidden is None else read.final_hidden.new_zeros(b, t, read.final_hidden.shape[-1])
        for j, (r, start, n) in enumerate(pieces):
            features[r, start:start + n] = read.features[j, :n]
            if final is not None:
                final[r, start:start + n] = read.final_hidden[j, :n]
        plain = [r for r in range(b) if r not in split]
        if plain:
            whole = self.capture(input_ids[plain], layer_ids, attention_mask=None if attention_mask is None else attention_mask[plain],
                                 with_final_hidden=with_final_hidden, compiled=False)
            features[plain] = whole.features
            if final is not None:
                final[plain] = whole.final_hidden
        return TargetFeatures(features=features, final_hidden=final)


# ----------------------------------------------------------------------------- decoding: the cached forward

# Legend: n tokens in this forward, V vocab, L layers, C cache capacity (positions), Hkv kv heads, D head dim.


# The architectures the cached forwards (``CachedTarget``, ``StaticTarget``) run, each checked against Hugging Face's own
# forward (tests/test_gpt_oss_target.py), and where each one's attention windows come from: "types" = ``layer_types``
# (a sliding layer has ``sliding_window``), "every" = ``sliding_window`` on every layer (the attention reads the config's
# field whatever ``layer_types`` says), "none" = full attention. Others (GLM's partial rotary, Gemma's scaled embeddings
# and extra norms, Granite's multipliers, OLMo's post-norms, SmolLM3's layers without RoPE, Cohere's parallel blocks)
# would run the wrong computation through these layers' loop: refused by name.
WINDOW_RULE = {"llama": "none", "mistral": "every", "mixtral": "every", "qwen3_moe": "every", "qwen2": "types",
               "qwen2_moe": "types", "qwen3": "types", "gpt_oss": "types"}


def layer_windows(config) -> list[int | None]:
    """Each decoder layer's attention window in Hugging Face's ``sliding_window`` meaning (W keys, the query's own
    included), None for full attention, by the architecture's rule (``WINDOW_RULE``): ``layer_types`` (gpt-oss,
    Qwen2/3; Qwen2's ``use_sliding_window=False`` leaves every type full), or ``sliding_window`` on every layer (Mistral,
    Mixtral, Qwen3-MoE: their attention reads it with no per-layer types, ``layer_types`` in a config.json or not)."""
    n = config.num_hidden_layers
    rule = WINDOW_RULE.get(config.model_type, "types")
    window = getattr(config, "sliding_window", None)
    if rule == "none":
        return [None] * n
    if rule == "every":
        return [window or None] * n
    types = getattr(config, "layer_types", None)
    if types is None:
        return [window if window and getattr(config, "use_sliding_window", True) else None] * n
    unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
    if unknown or len(types) != n:
        raise ValueError(f"target {config.model_type!r}: layer_types {unknown or len(types)}; expected {n} of "
                         f"full_attention / sliding_attention")
    if "sliding_attention" in types and not window:
        raise ValueError(f"target {config.model_type!r}: sliding_attention layers with sliding_window={window!r}")
    return [window if t == "sliding_attention" else None for t in types]


def check_supported(model: nn.Module) -> None:
    """Raise ValueError naming what the cached forwards (``CachedTarget``, ``StaticTarget``) cannot run: an architecture
    outside ``WINDOW_RULE``, layer types other than full / sliding, a layer without the Llama/Qwen parts."""
    config = model.config.get_text_config()
    name = f"target {config.model_type!r}"
    if config.model_type not in WINDOW_RULE:
        raise ValueError(f"{name}: the inference loop runs {', '.join(sorted(WINDOW_RULE))} targets (each checked against "
                         f"Hugging Face's forward), not {config.model_type}")
    layer_windows(config)
    for layer in decoder_layers(model):
        attn = getattr(layer, "self_attn", None)
        needed = ["q_proj", "k_proj", "v_proj", "o_proj"]
        if attn is None or not all(hasattr(attn, n) for n in needed) or not hasattr(layer, "mlp"):
            raise ValueError(f"{name}: decoder layer {type(layer).__name__} lacks self_attn.{{q,k,v,o}}_proj / mlp; expected a Llama/Qwen-style layer")


def static_unsupported(model: nn.Module) -> str | None:
    """Why the fast loop's ``StaticTarget`` (fused matrices, captured steps, split-KV decode attention) cannot run this
    target, or None: it runs Llama/Qwen-style layers with full attention and a gated MLP. The others (gpt-oss's
    sliding layers, attention sinks and experts; Mistral's window) decode on the eager ``CachedTarget``, at batch 1."""
    config = model.config.get_text_config()
    reasons = []
    if any(w is not None for w in layer_windows(config)):
        reasons.append("sliding-window layers")
    layers = decoder_layers(model)
    if any(getattr(layer.self_attn, "sinks", None) is not None for layer in layers):
        reasons.append("attention sinks")
    # every layer: an MoE may keep its first layers dense (Qwen3-MoE's mlp_only_layers)
    other = next((layer.mlp for layer in layers if not all(hasattr(layer.mlp, n) for n in ("gate_proj", "up_proj", "down_proj"))), None)
    if other is not None:
        reasons.append(f"a {type(other).__name__} MLP (not gate/up/down)")
    return f"target {config.model_type!r}: {', '.join(reasons)}" if reasons else None


def eager_reason(model: nn.Module, attention_backend: str = "sdpa") -> str | None:
    """Why the loop decodes ``model`` on the eager ``CachedTarget`` (batch 1) rather than the static target, in words for
    one-line messages, or None when the static target runs it: FlashInfer attention, or ``static_unsupported``."""
    return f"--backend {attention_backend}" if attention_backend == "flashinfer" else static_unsupported(model)


class CachedTarget:
    """The target LM with a static KV cache; returns logits and the drafter's feature layers. Eager, batch 1, the HF
    modules called in place: the loop's target under FlashInfer attention, and for the architectures the captured
    ``StaticTarget`` does not run (``static_unsupported``: gpt-oss's sliding layers, sinks and experts; Mistral's window).

    Args:
        model: a loaded HF causal LM (its modules are used in place, nothing is copied).
        feature_layer_ids: layer ids whose outputs are returned as features (may be empty).
        attention_backend: ``sdpa`` or ``flashinfer`` (see ``swa_kernels/attention.py``).
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
        self.windows = layer_windows(config)
        self.half_rotary_tables = config.model_type == "gpt_oss"
        self.sinks = [getattr(layer.self_attn, "sinks", None) for layer in self.layers]  # gpt-oss: [Hq] logits a layer
        if attention_backend != "sdpa" and any(s is not None for s in self.sinks):
            raise ValueError(f"target {config.model_type!r}: attention sinks run on --backend sdpa, not {attention_backend}")
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
        return 0 if self.k_cache is None else self.k_cache.shape[1] - self.sink_slots

    @property
    def sink_slots(self) -> int:
        """One spare slot past the positions where a target with attention sinks has them: zeroed each forward just past
        its last key, it is the sink's key and value (``cached_attention``'s ``sink_slot``; a copy of the cache with a
        zero row appended, per layer per step, was what it cost before)."""
        return int(any(s is not None for s in self.sinks))

    def allocate(self, capacity: int) -> None:
        """Make room for positions ``0 .. capacity-1`` (reuses the buffers when they are big enough)."""
        if self.capacity >= capacity:
            return
        shape = (len(self.layers), capacity + self.sink_slots, self.num_kv_heads, self.head_dim)
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
        if self.half_rotary_tables:  # gpt-oss's tables cover half the head: its rotation pairs x[i] with x[i + D/2],
            cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)  # as rotate_half does with full ones
        if cos.shape[-1] != self.head_dim:
            raise ValueError(f"target {self.model.config.model_type!r}: RoPE tables of {cos.shape[-1]} for heads of {self.head_dim}")
        masks: dict[int | None, torch.Tensor | None] = {None: None}  # by window; None: causal (and windowed) by slot
        if mask is not None:
            masks[None] = torch.cat([torch.ones(n, start, dtype=torch.bool, device=self.device), mask.to(self.device)], dim=1)  # [n, end]
            # a sliding layer's tree queries see the keys of the last W positions, by RoPE position, not slot
            key_positions = torch.cat([torch.arange(start, device=self.device), positions])
            for w in set(self.windows) - {None}:
                masks[w] = masks[None] & (key_positions[None] > positions[:, None] - w)
        features: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            x = x + self._attention(i, layer, layer.input_layernorm(x), cos, sin, start, end, masks.get(self.windows[i], masks[None]))
            mlp = layer.mlp(layer.post_attention_layernorm(x))
            x = x + (mlp[0] if isinstance(mlp, tuple) else mlp)  # experts return (output, router scores)
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
        sink_slot = self.sinks[i] is not None
        if sink_slot:  # the spare slot past the keys: the sink's zero key and value (written over by the next forward's keys)
            self.k_cache[i, end] = 0
            self.v_cache[i, end] = 0
        out = cached_attention(q[0].transpose(0, 1), self.k_cache[i, :end + sink_slot], self.v_cache[i, :end + sink_slot], causal=True,
                               window=self.windows[i], scale=self.scale, backend=self.attention_backend, mask=mask, sinks=self.sinks[i],
                               sink_slot=sink_slot)  # [n, Hq, D]
        return attn.o_proj(out.reshape(1, n, self.num_heads * self.head_dim))


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
