"""Drafters trained by vLLM speculators (0.9.0, ``speculators train --speculator-type dflash|eagle3 --save-path DIR``)
loaded into our models, so ``python -m eval`` / ``python -m infer`` run them beside ours with ``--drafter DIR``.

Loaded in place, not converted to a second folder: vLLM (``--engine vllm``, ``eval/engines.py``) serves the same
folder in speculators' own layout, so ours and the engine read one set of files, and no copy can go stale.

What speculators writes (site-packages/speculators, read for this module): its trainer saves each epoch with
``save_pretrained`` into ``DIR/<epoch>/`` (train/checkpointer.py ``SingleGPUCheckpointer.save_checkpoint``,
floats cast to bf16; ``checkpoint_best`` a symlink to the best epoch when validation ran); ``--dry-run``
saves the initialised drafter into ``DIR`` itself (train/cli.py). ``config.json`` carries
``speculators_model_type``, the decoder's ``transformer_layer_config`` and the fields mapped below;
``model.safetensors`` leaves out ``verifier_lm_head`` / ``verifier_norm`` (``_keys_to_ignore_on_save``) and,
for DFlash, ``embed_tokens`` and (full draft vocabulary) ``lm_head``: the target's are used.

Norms: speculators' ``verifier_norm`` (the target's final norm) only builds the training targets
(``verifier_lm_head(verifier_norm(last hidden state))``); drafts are ``lm_head(norm(h))`` with the drafter's own
``norm``, as ours. So ``verifier_norm`` is not needed, and is not in the checkpoint anyway.

Windows: the weights map 1:1, the training masks do not quite. speculators' sliding masks anchor the window at
the *last context position*: a DFlash block anchored at a sees context a - W .. a - 1 from every slot
(models/dflash/attention.py ``base_prefix_mod``), an EAGLE-3 step s at index t sees indices > t - W plus its
chain (models/eagle3/attention.py). Ours slide with the query's position (W keys, the query included, as
Hugging Face, vLLM and SGLang apply ``sliding_window`` at inference): slot k / step s sees k + 1 / s fewer of the
oldest context keys once the context is longer than W. ``sliding_window`` is kept as written, which is how vLLM
serves the same checkpoint; below W the two agree exactly (tests/test_speculators_checkpoint.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

# speculators' layer ids are vLLM's: id k = the *input* of decoder layer k; ours: id i = the output of layer i.
LAYER_ID_OFFSET = 1
BEST_LINK = "checkpoint_best"  # speculators' train/checkpointer.py best_path()
CONFIG = "config.json"
WEIGHTS = "model.safetensors"
TRAINING_ONLY = ("verifier_lm_head.weight", "verifier_norm.weight")  # build training targets only; 0.9.0 does not save them


def is_speculators_config(config: dict) -> bool:
    return "speculators_model_type" in config


def resolve_checkpoint(path: str | Path) -> Path:
    """A ``--save-path`` folder -> the checkpoint in it: ``checkpoint_best``, else the newest epoch folder;
    a folder with ``config.json`` (a single checkpoint, or ``--dry-run``'s output) is itself."""
    path = Path(path)
    if (path / CONFIG).is_file() or not path.is_dir():
        return path
    if (path / BEST_LINK / CONFIG).is_file():
        return (path / BEST_LINK).resolve()
    epochs = sorted((int(p.name), p) for p in path.iterdir() if p.name.isdigit() and (p / CONFIG).is_file())
    return epochs[-1][1] if epochs else path


def verifier_path(path: Path) -> str | None:
    """The target a speculators checkpoint names (``speculators_config.verifier.name_or_path``), else None."""
    try:
        config = json.loads((path / CONFIG).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not is_speculators_config(config):
        return None
    return ((config.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")


def _refuse(where: str, field: str, value: Any, why: str) -> ValueError:
    return ValueError(f"{where}: {field}={value!r}: {why}")


def _common(config: dict, where: str, kind: str, arch: str) -> dict[str, Any]:
    """transformer_layer_config -> the start of our config dict, with the checks both drafters share."""
    layer = dict(config.get("transformer_layer_config") or {})
    if not layer:
        raise ValueError(f"{where}: no transformer_layer_config")
    model_type = layer.get("model_type")
    if model_type != arch:
        raise _refuse(where, "transformer_layer_config.model_type", model_type,
                      f"our {kind} drafter has {arch} decoder layers ({'q/k RMSNorm' if arch == 'qwen3' else 'no q/k norm'})")
    if layer.get("attention_bias"):
        raise _refuse(where, "transformer_layer_config.attention_bias", True, "our drafters' projections have no bias")
    target_hidden = config.get("target_hidden_size")
    if target_hidden not in (None, layer.get("hidden_size")):  # speculators' fc takes num_aux * hidden_size either way
        raise _refuse(where, "target_hidden_size", target_hidden, f"differs from hidden_size {layer.get('hidden_size')}")
    for key in ("_attn_implementation", "_attn_implementation_autoset", "dtype", "torch_dtype", "auto_map", "transformers_version"):
        layer.pop(key, None)
    num_layers = layer["num_hidden_layers"]
    types = layer.get("layer_types") or ["full_attention"] * num_layers  # speculators: no layer_types = every layer full
    if len(types) != num_layers or set(types) - {"sliding_attention", "full_attention"}:
        raise _refuse(where, "transformer_layer_config.layer_types", types, f"expected {num_layers} of sliding_attention/full_attention")
    layer["layer_types"] = list(types)
    if "sliding_attention" in types and not layer.get("sliding_window"):
        raise _refuse(where, "transformer_layer_config.sliding_window", layer.get("sliding_window"), "sliding layers need a window")
    layer["tie_word_embeddings"] = False
    return layer


def dflash_config(config: dict, where: str) -> dict[str, Any]:
    """speculators' ``DFlashSpeculatorConfig`` -> our ``DFlashDraftModel`` config (``models/dflash.py``)."""
    out = _common(config, where, "DFlash", "qwen3")
    if config.get("sample_from_anchor"):
        raise _refuse(where, "sample_from_anchor", True, "our DFlash drafts from the mask slots only (slot 0 is the last verified token)")
    if config.get("mask_token_id") is None:
        raise _refuse(where, "mask_token_id", None, "the block's mask token is needed")
    draft_vocab = config.get("draft_vocab_size")
    if not isinstance(draft_vocab, int) or not 2 <= draft_vocab <= out["vocab_size"]:
        raise _refuse(where, "draft_vocab_size", draft_vocab, f"expected 2 .. the target's vocabulary ({out['vocab_size']})")
    if draft_vocab < out["vocab_size"]:
        out["draft_vocab_size"] = draft_vocab  # the checkpoint's lm_head [Vd, H], d2t, t2d (models/dflash.py)
    ids = config.get("aux_hidden_state_layer_ids")
    if not ids or min(ids) < LAYER_ID_OFFSET:
        raise _refuse(where, "aux_hidden_state_layer_ids", ids, "expected ids >= 1 (speculators' id k = the input of layer k)")
    check_flags(config, where, ("sliding_window_non_causal",))
    block_size = int(config["block_size"])
    ours = [i - LAYER_ID_OFFSET for i in ids]
    out.update(architectures=["DFlashDraftModel"], block_size=block_size,
               dflash_config={"target_layer_ids": ours, "block_size": block_size, "mask_token_id": int(config["mask_token_id"])},
               # speculators: sliding layers causal in the block unless sliding_window_non_causal; full layers bidirectional
               sliding_block_causal=not config.get("sliding_window_non_causal", False),
               use_sliding_window="sliding_attention" in out["layer_types"])
    return out


def check_flags(config: dict, where: str, fields: tuple[str, ...]) -> None:
    """Boolean fields true, false or absent: mapped with bool() below, the string "false" was read as true."""
    for field in fields:
        if config.get(field) is not None and not isinstance(config[field], bool):
            raise _refuse(where, field, config[field], "expected true, false or absent")


def eagle3_config(config: dict, where: str) -> dict[str, Any]:
    """speculators' ``Eagle3SpeculatorConfig`` -> our ``Eagle3DraftModel`` config (``models/eagle3.py``)."""
    out = _common(config, where, "EAGLE-3", "llama")
    ids = config.get("eagle_aux_hidden_state_layer_ids")
    if not ids or min(ids) < LAYER_ID_OFFSET:  # None: speculators resolves defaults from the verifier at load time
        raise _refuse(where, "eagle_aux_hidden_state_layer_ids", ids, "expected the ids written out (>= 1)")
    if not isinstance(config.get("norm_before_residual"), bool):  # the engines read a missing one two ways: no guess
        raise _refuse(where, "norm_before_residual", config.get("norm_before_residual"),
                      "expected true or false written out (speculators' own config reads a missing one as false, "
                      "vLLM's as true: the drafts differ)")
    check_flags(config, where, ("fc_norm", "norm_before_fc", "norm_output"))
    proposals = (config.get("speculators_config") or {}).get("proposal_methods") or [{}]
    out.update(architectures=["Eagle3DraftModel"], draft_vocab_size=int(config["draft_vocab_size"]),
               target_hidden_size=out["hidden_size"], target_layer_ids=[i - LAYER_ID_OFFSET for i in ids],
               fc_norm=bool(config.get("fc_norm", False)), norm_before_fc=bool(config.get("norm_before_fc", False)),
               norm_output=bool(config.get("norm_output", False)),
               norm_before_residual=config["norm_before_residual"],
               ttt_length=int(proposals[0].get("speculative_tokens") or 7))
    if "sliding_attention" not in out["layer_types"]:
        out["sliding_window"] = None
    return out


def read_config(path: str | Path) -> dict[str, Any]:
    """A speculators checkpoint's config.json -> our drafter config (a one-line ValueError naming what cannot map)."""
    where = str(Path(path) / CONFIG)
    config = json.loads((Path(path) / CONFIG).read_text())
    kind = config.get("speculators_model_type")
    if kind == "dflash":
        return dflash_config(config, where)
    if kind == "eagle3":
        return eagle3_config(config, where)
    raise _refuse(where, "speculators_model_type", kind, "expected dflash or eagle3")


def read_weights(path: str | Path, ours: dict[str, Any], vocab_size: int) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under our names (they are the same names), the training-only ones dropped and,
    for a full-vocabulary EAGLE-3 drafter (speculators saves no d2t / t2d then), the identity draft vocabulary."""
    from safetensors.torch import load_file

    file = Path(path) / WEIGHTS
    if not file.is_file():
        raise ValueError(f"{path}: no {WEIGHTS}")
    weights = {k: v for k, v in load_file(file).items() if k not in TRAINING_ONLY}
    if ours["architectures"] == ["DFlashDraftModel"]:
        weights.pop("embed_tokens.weight", None)  # our DFlash embeds with the target's own
        if "draft_vocab_size" not in ours:  # and decodes with it, unless the drafter has a draft vocabulary
            weights.pop("lm_head.weight", None)
    elif ours["draft_vocab_size"] == vocab_size and "d2t" not in weights:
        weights["d2t"] = torch.zeros(vocab_size, dtype=torch.long)
        weights["t2d"] = torch.ones(vocab_size, dtype=torch.bool)
    return weights


def load_model(path: str | Path, ours: dict[str, Any], dtype: torch.dtype | None = None) -> torch.nn.Module:
    """Our ``DFlashDraftModel`` / ``Eagle3DraftModel`` with a speculators checkpoint's weights (``ours``: ``read_config``)."""
    if ours["architectures"] == ["Eagle3DraftModel"]:
        from transformers import LlamaConfig

        from models.eagle3 import Eagle3DraftModel

        model = Eagle3DraftModel(LlamaConfig.from_dict(ours))
    else:
        from transformers import Qwen3Config

        from models.dflash import DFlashDraftModel

        model = DFlashDraftModel(Qwen3Config.from_dict(ours))
    weights = read_weights(path, ours, ours["vocab_size"])
    expected = model.state_dict()
    for name in sorted(set(expected) | set(weights)):
        if name not in weights:
            raise ValueError(f"{Path(path) / WEIGHTS}: missing tensor {name!r}")
        if name not in expected:
            raise ValueError(f"{Path(path) / WEIGHTS}: tensor {name!r} has no place in our drafter")
        if weights[name].shape != expected[name].shape:
            raise ValueError(f"{Path(path) / WEIGHTS}: tensor {name!r} has shape {tuple(weights[name].shape)}, "
                             f"expected {tuple(expected[name].shape)}")
    model.load_state_dict(weights)
    if dtype is not None:
        model.to(dtype)
    return model.eval()
