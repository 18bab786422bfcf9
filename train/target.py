"""The frozen target model and the features a drafter reads from it.

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
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)


@dataclass
class TargetFeatures:
    # features: [B, T, k * H], the k selected layers concatenated in the order of layer_ids
    features: torch.Tensor
    # logits: [B, T, V] when asked for, else None
    logits: torch.Tensor | None = None
    # final_hidden: [B, T, H] the last layer's normed output (logits = lm_head(final_hidden)) when asked for
    final_hidden: torch.Tensor | None = None


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
        return [1, num_layers // 2 - 1, num_layers - 4]
    if drafter == "dflash":
        k = num_features or 1
        if k == 1:
            return [num_layers // 2]
        start, end = 1, num_layers - 3
        return [int(round(start + i * (end - start) / (k - 1))) for i in range(k)]
    raise ValueError(f"drafter={drafter!r}; expected 'dflash' or 'eagle3'")


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
        self.stack = decoder_stack(model)
        self.layers = self.stack.layers

    @classmethod
    def from_pretrained(cls, path: str, device: str | torch.device = "cpu", dtype: str = "auto", attn_implementation: str = "sdpa") -> "TargetModel":
        """Load from a local folder or a hub id; bf16 on GPU and fp32 on CPU unless ``dtype`` says."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        device = torch.device(device)
        if dtype == "auto":
            torch_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        else:
            torch_dtype = getattr(torch, dtype)
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, attn_implementation=attn_implementation)
        except OSError as e:
            raise ValueError(f"target.path={path!r}: cannot load a causal LM and tokenizer there ({e})") from None
        return cls(model.to(device), tokenizer, path)

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
        bad = [i for i in layer_ids if not 0 <= i <= self.num_layers - 2]
        if bad or not layer_ids:
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

    def release_layers(self) -> None:
        """Free the decoder layers (a run reading a feature store needs only the embedding, the LM
        head and the config); ``capture`` refuses afterwards."""
        self.stack.layers = self.layers = nn.ModuleList()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def uncompile_layers(self) -> None:
        for layer in self.layers:
            vars(layer).pop("forward", None)

    @contextmanager
    def _stack_cut_after(self, depth: int):
        """The decoder stack with only its first ``depth`` layers and no final norm, for the duration."""
        layers, norm = self.stack.layers, getattr(self.stack, "norm", None)
        self.stack.layers = nn.ModuleList(list(layers)[:depth])
        if norm is not None:
            self.stack.norm = nn.Identity()
        try:
            yield self.stack
        finally:
            self.stack.layers = layers
            if norm is not None:
                self.stack.norm = norm

    @torch.no_grad()
    def capture(self, input_ids: torch.Tensor, layer_ids: list[int], attention_mask: torch.Tensor | None = None, with_logits: bool = False,
                with_final_hidden: bool = False) -> TargetFeatures:
        """Run the target and return the hidden states of ``layer_ids``.

        Args:
            input_ids: [B, T] token ids.
            layer_ids: decoder-layer ids (see the module docstring), any order, no repeats.
            attention_mask: [B, T], 1 on real tokens (right padding), or None.
            with_logits: also run the remaining layers and the LM head and return ``logits``.
            with_final_hidden: also run the remaining layers and the final norm, not the LM head, and
                return ``final_hidden``: the caller applies ``lm_head`` a chunk of rows at a time (at 32K
                tokens Qwen3's logits alone are 9.3 GiB in bf16).

        Returns:
            ``TargetFeatures`` with ``features [B, T, len(layer_ids) * H]`` in the model's dtype,
            and ``logits [B, T, V]`` or None.
        """
        if not len(self.layers):
            raise RuntimeError("the target's decoder layers were released (this run reads a feature store)")
        self.check_layer_ids(layer_ids)
        captured: dict[int, torch.Tensor] = {}
        deepest = max(layer_ids)

        def hook_for(layer_id: int):
            def hook(module: nn.Module, args: Any, output: Any) -> None:
                captured[layer_id] = output[0] if isinstance(output, tuple) else output

            return hook

        handles = [self.layers[i].register_forward_hook(hook_for(i)) for i in set(layer_ids)]
        logits = final_hidden = None
        try:
            if with_logits:
                logits = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, logits_to_keep=0).logits
            elif with_final_hidden:
                final_hidden = self.stack(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
            else:
                with self._stack_cut_after(deepest + 1) as stack:
                    stack(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        finally:
            for h in handles:
                h.remove()
        features = torch.cat([captured[i] for i in layer_ids], dim=-1)
        return TargetFeatures(features=features, logits=logits, final_hidden=final_hidden)
