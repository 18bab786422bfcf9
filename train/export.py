"""Export a trained drafter for a serving engine.

    python -m train.export SOURCE OUTPUT [--format dflash|sglang|speculators] [--target PATH] [--dtype bfloat16]

SOURCE is a run folder (``output_dir`` of ``python -m train``: its ``export/``, else its newest
checkpoint), an export folder (``config.json`` + ``model.safetensors``) or a checkpoint folder
(``checkpoints/step_*``). Formats:

- ``speculators``: vLLM speculators' DFlash layout (``speculators_model_type: dflash``,
  ``transformer_layer_config`` with ``layer_types`` / ``sliding_window``, ``aux_hidden_state_layer_ids``
  = our ids + 1, ``speculators_config`` with the verifier, one ``sliding_window_non_causal`` flag:
  drafters whose layers disagree on in-block causality are refused), weights plus the target's
  ``embed_tokens`` / ``lm_head`` (needs the target), as vLLM's DFlash loader reads them.
- ``dflash`` / ``sglang``: the z-lab DFlash layout that z-lab's loader and SGLang's DFLASH
  algorithm read: ``architectures: [DFlashDraftModel]``, ``model_type: qwen3``, ``dflash_config``
  {target_layer_ids, block_size, mask_token_id}, ``block_size``, ``num_target_layers``,
  ``layer_types``, ``sliding_window``, ``use_sliding_window``, RoPE in ``rope_parameters`` and
  the legacy ``rope_theta`` / ``rope_scaling``; weights ``fc``, ``hidden_norm``, ``layers.*``,
  ``norm`` (no embedding, no LM head: the target's are used). A DFlash drafter with a draft
  vocabulary (``draft_vocab_size``: its own head, ``d2t``, ``t2d``) has no place in this layout: it
  exports as ``speculators`` (its default), and ``dflash`` / ``sglang`` are refused in one line.

EAGLE-3 drafters (config.json ``architectures: [Eagle3DraftModel]``, models/eagle3.py) export
as ``sglang`` (SGLang's ``LlamaForCausalLMEagle3`` layout: ``midlayer.*`` / ``additional_layers.*``,
``eagle_config.eagle_aux_hidden_state_layer_ids`` = our ids) or ``speculators`` (vLLM speculators'
Eagle3 layout: ``layers.*``, ``eagle_aux_hidden_state_layer_ids`` = our ids + 1); ``dflash`` is
refused. See ``export_eagle3`` and train/engines.py for the conventions and the code they come from.

The gate: every tensor the architecture needs must be present with its shape (else a one-line
error naming it, and nothing is written); the export is built in a temporary folder, reloaded with
our own loader and compared with the in-memory drafter (max |Δ logits| is printed), then renamed.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from common.atomic import atomic_dir
from common.json_file import read_json_object
from common.tensor_shapes import shape_differences
from infer import speculators_checkpoint
from infer.speculators_checkpoint import eagle3_config as speculators_eagle3_config
from models.dflash import DFlashDraftModel, sliding_block_causal
from models.target import CONFIG_ERRORS, config_error_text, layer_ids_fit

from . import engines
from .checkpoint import UnreadableCheckpoint, list_checkpoints, read_state

log = logging.getLogger(__name__)

FORMATS = ("dflash", "sglang", "speculators")
WEIGHTS = "model.safetensors"
EAGLE3_ARCH = "Eagle3DraftModel"
EAGLE3_FORMATS = ("sglang", "speculators")


class ExportError(ValueError):
    """Bad export input; the message names the file, key or tensor."""


def load_source(source: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, Any] | None]:
    """-> (drafter config dict, weights, run record or None) from a run, export or checkpoint folder."""
    source = Path(source)
    if not source.is_dir():
        raise ExportError(f"{source}: {'a file' if source.exists() else 'no such folder'}; expected a run folder, an export "
                          f"folder (config.json + {WEIGHTS}) or a checkpoint folder (state.pt)")
    run_record = None
    # a run's export/ or checkpoints/step_* given directly: the run's record one or two folders up (its target, for
    # --format speculators and the printed serve commands)
    run_dir = source.parent if source.name.startswith("export") else source.parent.parent if source.parent.name == "checkpoints" else None
    if run_dir is not None and not (source / "run.json").exists() and (run_dir / "run.json").exists():
        run_record = read_json_object(run_dir / "run.json", error=ExportError)
    if (source / "run.json").exists():
        run_record = read_json_object(source / "run.json", error=ExportError)
        if (source / "export" / WEIGHTS).exists():
            source = source / "export"
        else:
            found = list_checkpoints(source)
            if not found:
                raise ExportError(f"{source}: run folder has neither export/ nor a checkpoint")
            source = found[-1]
    if (source / "state.pt").exists():
        try:
            state = read_state(source / "state.pt")
        except UnreadableCheckpoint as e:  # not load_checkpoint: its message speaks of trainer.resume
            raise ExportError(f"{source / 'state.pt'}: not a readable checkpoint ({e}); truncated or corrupt?") from None
        if not isinstance(state, dict) or "model_config" not in state or "model" not in state:
            raise ExportError(f"{source / 'state.pt'}: checkpoint has no 'model_config' and 'model' (written by an older version?)")
        return state["model_config"], state["model"], run_record
    if not (source / "config.json").exists():
        raise ExportError(f"{source}: expected a run folder, an export folder (config.json) or a checkpoint (state.pt)")
    if not (source / WEIGHTS).exists():
        raise ExportError(f"{source}: no {WEIGHTS}")
    config = read_json_object(source / "config.json", error=ExportError)
    try:
        weights = load_file(source / WEIGHTS)
    except SafetensorError as e:
        raise ExportError(f"{source / WEIGHTS}: not a readable safetensors file ({e}); truncated or corrupt?") from None
    return config, weights, run_record


def check_config(config: dict[str, Any], source: Path) -> None:
    """The fields the export reads or writes, each with its type and range, as one ExportError naming the field: the loop's
    own check (``infer.loading.check_drafter_fields``: the sizes, ``layer_types``, ``sliding_window`` where a layer slides,
    DFlash's block and mask token, EAGLE-3's draft vocabulary and TTT length). The same checks for a run's checkpoint and
    an export folder: what the model's config class would answer with a traceback, or accept and write."""
    from infer.loading import check_drafter_fields

    if not isinstance(config, dict):
        raise ExportError(f"{source}: the drafter config is a {type(config).__name__}; expected an object")
    try:
        check_drafter_fields(config, f"{source}: config")
    except ValueError as e:
        raise ExportError(str(e)) from None


def check_against_target(config: dict[str, Any], text_config: Any, source: Path, what: str) -> None:
    """The drafter against the target the export is made with (its embedding, head and hidden states are that target's):
    the loop's own checks at load (``infer.loading.load_models``: hidden and vocabulary sizes, ``TargetModel.check_layer_ids``),
    here before anything is written. Else a wrong target exports with its tensors in the checkpoint and its shape
    nowhere in the config, and the engine fails at load or reads features of layers the target does not have."""
    field = "target_layer_ids" if is_eagle3(config) else "dflash_config.target_layer_ids"
    ids = config["target_layer_ids"] if is_eagle3(config) else config["dflash_config"]["target_layer_ids"]
    layers = text_config.num_hidden_layers
    if not layer_ids_fit(ids, layers):
        raise ExportError(f"{source}: config {field}={ids}; ids must lie in 0..{layers - 2} ({what} has {layers} layers: id i is "
                          f"the output of decoder layer i)")
    for key in ("hidden_size", "vocab_size"):
        if config[key] != getattr(text_config, key):
            raise ExportError(f"{source}: config {key}={config[key]}, but {what} has {key}={getattr(text_config, key)}; "
                              f"expected the target the drafter was trained on")


def check_not_source(output: Path, source: Path) -> None:
    """The output folder must not be the folder the drafter is read from (an export folder, or a run's ``export/``): the
    export replaces its output, so the source's fp32 drafter would be gone and the run could not be exported again."""
    output = Path(output).resolve()
    sources = {Path(source).resolve(), (Path(source) / "export").resolve()}
    if output in sources:
        raise ExportError(f"{output}: is the folder the drafter is read from ({source}); expected another output folder")


def export_target_path(target: str | None, run_record: dict | None) -> str | None:
    """The target the export checks the drafter against: ``--target`` (a ``builtin:`` name resolved to its folder, as the
    loop resolves it; it was read as a malformed hub id), else the folder the run recorded, else None."""
    if target is None:
        return (run_record or {}).get("target", {}).get("resolved_path")
    from models.builtin_targets import resolve_target_path

    return resolve_target_path(target, "--target")


def check_output(output: Path) -> None:
    """The destination must be a new folder, or a previous export (config.json and model.safetensors only) that the export
    replaces: any other folder would be deleted whole by the rename, and a file cannot become a folder."""
    output = Path(output)
    parent = next((p for p in output.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise ExportError(f"{output}: {parent} is a file; expected the output folder's place (a folder, or nothing yet)")
    if output.exists() and not output.is_dir():
        raise ExportError(f"{output}: a file; expected a new output folder (or a previous export, which is replaced)")
    from common.atomic import unwritable_reason

    reason = unwritable_reason(output)
    if reason:
        raise ExportError(f"{output}: {reason}; expected an output folder that can be written")
    if output.is_dir():
        other = sorted(p.name for p in output.iterdir() if p.name not in ("config.json", WEIGHTS))
        if other:
            raise ExportError(f"{output}: exists and is not an export (holds {other[0]!r}); expected a new output folder or a "
                              f"previous export (config.json + {WEIGHTS}), which is replaced")


def is_eagle3(config_dict: dict[str, Any]) -> bool:
    return config_dict.get("architectures") == [EAGLE3_ARCH]


def build_model(config_dict: dict[str, Any], source: Path | str = "config.json") -> torch.nn.Module:
    from transformers import LlamaConfig, Qwen3Config

    if not is_eagle3(config_dict) and (config_dict.get("architectures") != ["DFlashDraftModel"] or "dflash_config" not in config_dict):
        raise ExportError(f"{source}: architectures={config_dict.get('architectures')}; expected DFlashDraftModel or Eagle3DraftModel")
    try:
        if is_eagle3(config_dict):
            from models.eagle3 import Eagle3DraftModel

            return Eagle3DraftModel(LlamaConfig.from_dict(config_dict))
        return DFlashDraftModel(Qwen3Config.from_dict(config_dict))
    except CONFIG_ERRORS as e:  # the config classes' validation
        raise ExportError(f"{source}: the drafter's config does not build its model: {config_error_text(e)}") from None


def check_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor], where: str) -> None:
    """Refuse missing, unexpected or mis-shaped tensors, naming the first of each."""
    differences = shape_differences({k: tuple(v.shape) for k, v in weights.items()},
                                    {k: tuple(v.shape) for k, v in model.state_dict().items()})
    missing = [name for name, found, _ in differences if found is None]
    if missing:
        raise ExportError(f"{where}: missing tensor {missing[0]!r} ({len(missing)} missing in all)")
    unexpected = [name for name, _, wanted in differences if wanted is None]
    if unexpected:
        raise ExportError(f"{where}: unexpected tensor {unexpected[0]!r} ({len(unexpected)} unexpected in all)")
    if differences:  # what is left: present on both sides, shaped differently
        name, found, wanted = differences[0]
        raise ExportError(f"{where}: tensor {name!r} has shape {found}, expected {wanted}")


def with_model_rope(config: dict[str, Any], model: torch.nn.Module) -> dict[str, Any]:
    """``config`` with RoPE as the model's config class read it (``rope_parameters``): a transformers-4 config (z-lab's
    published ones: ``rope_theta`` + ``rope_scaling``, no ``rope_parameters``) built a yarn / llama3 drafter, and
    ``_legacy_rope`` then wrote default RoPE (``rope_scaling: null``) for it."""
    rope = getattr(model.config, "rope_parameters", None)
    return {**config, "rope_parameters": dict(rope)} if rope else config


def _legacy_rope(out: dict[str, Any]) -> None:
    rope = out.get("rope_parameters") or {}
    out["rope_theta"] = rope.get("rope_theta", out.get("rope_theta"))
    out["rope_scaling"] = None if rope.get("rope_type", "default") == "default" else dict(rope)


def serve_target_name(target: str | None, run_record: dict[str, Any] | None, target_path: str | None) -> str:
    """The target named in printed serving commands: --target, else the run's recorded path unless builtin."""
    recorded = (run_record or {}).get("target", {}).get("path")
    return target or (recorded if recorded and not recorded.startswith("builtin:") else target_path) or "TARGET"


def cast_weights(model: torch.nn.Module, torch_dtype: torch.dtype) -> torch.nn.Module:
    """Round what a checkpoint holds (parameters and the floating buffers in ``state_dict``) to ``torch_dtype``, in
    place; integer buffers (d2t, t2d) and buffers a checkpoint does not hold (RoPE's inv_freq, recomputed in fp32 at
    load, as ``from_pretrained(dtype=...)`` keeps it) stay as they are. Returns ``model``."""
    saved = set(model.state_dict())
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if name in saved and tensor.is_floating_point():
            tensor.data = tensor.data.to(torch_dtype)
    return model


def cast_copy(model: torch.nn.Module, torch_dtype: torch.dtype) -> torch.nn.Module:
    """The drafter as its export holds it (``cast_weights`` on a copy); ``model`` itself when it holds that dtype already."""
    if all(t.dtype == torch_dtype for t in model.state_dict().values() if t.is_floating_point()):
        return model
    return cast_weights(copy.deepcopy(model), torch_dtype)


def check_reload(max_diff: float, torch_dtype: torch.dtype, output: Path) -> None:
    """The reloaded export against the drafter cast to the export's dtype: the same weights through the same code, so
    anything but rounding noise is a broken export. (Against the fp32 drafter the gap is the dtype's rounding, which
    grows with the logits' scale: 0.50 on a trained SmolLM2 drafter in bf16, so no fixed limit there tells a broken
    export from a good one; it is reported beside, ``max_abs_logit_diff_vs_fp32``.)"""
    limit = 1e-4 if torch_dtype == torch.float32 else 1e-2
    if not max_diff <= limit:
        raise ExportError(f"{output}: reloaded export differs from the drafter cast to {str(torch_dtype).removeprefix('torch.')} "
                          f"by {max_diff:.3g} in logits (limit {limit})")


def dflash_config_json(config: dict[str, Any]) -> dict[str, Any]:
    """Our config -> the z-lab / SGLang DFlash config.json."""
    out = dict(config)
    out.pop("sliding_block_causal", None)
    out["architectures"] = ["DFlashDraftModel"]
    out["model_type"] = "qwen3"
    dflash = dict(out["dflash_config"])
    dflash["target_layer_ids"] = engines.engine_layer_ids(dflash["target_layer_ids"], "dflash")
    out["dflash_config"] = dflash
    out["block_size"] = dflash["block_size"]
    out["use_sliding_window"] = "sliding_attention" in out["layer_types"]
    if not out["use_sliding_window"]:
        out["sliding_window"] = None
    if not config.get("sliding_block_causal", True):
        out["is_causal"] = False  # z-lab: sliding layers bidirectional inside the block
    _legacy_rope(out)
    return out


def speculators_non_causal(config: dict[str, Any]) -> bool:
    """speculators' one ``sliding_window_non_causal`` flag for this drafter (``engines.speculators_dflash_non_causal``)."""
    # our key, else z-lab's is_causal (a z-lab-layout folder re-exported has only that one: models.dflash.sliding_block_causal)
    flag = engines.speculators_dflash_non_causal(config["layer_types"], sliding_block_causal(SimpleNamespace(**config)))
    if flag is None:
        raise ExportError(engines.SPECULATORS_MIXED_CAUSALITY)
    return flag


def speculators_config_json(config: dict[str, Any], target_config: Any, target_name: str) -> dict[str, Any]:
    """Our config -> vLLM speculators' DFlash config.json (``DFlashSpeculatorConfig`` schema)."""
    layer_config = dflash_config_json(config)
    for key in ("architectures", "auto_map", "block_size", "dflash_config", "num_target_layers", "is_causal", "dtype"):
        layer_config.pop(key, None)
    dflash = config["dflash_config"]
    block_size = dflash["block_size"]
    text = target_config.get_text_config()
    return {
        "architectures": ["DFlashSpeculator"],
        "speculators_model_type": "dflash",
        "transformer_layer_config": layer_config,
        "draft_vocab_size": config.get("draft_vocab_size") or config["vocab_size"],
        "block_size": block_size,
        "target_hidden_size": text.hidden_size,
        "aux_hidden_state_layer_ids": engines.engine_layer_ids(dflash["target_layer_ids"], "speculators"),
        "mask_token_id": dflash["mask_token_id"],
        "sliding_window_non_causal": speculators_non_causal(config),
        "sample_from_anchor": False,
        "speculators_config": {
            "algorithm": "dflash",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": block_size - 1}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": target_name, "architectures": list(getattr(target_config, "architectures", None) or [])},
        },
    }


@torch.no_grad()
def draft_logits(model: DFlashDraftModel, features: torch.Tensor, block_ids: torch.Tensor, embed: torch.nn.Module, head: torch.nn.Module) -> torch.Tensor:
    """One block anchored right after the context: [1, T, k*H] features, [1, B] ids -> [1, B, V]."""
    from models.dflash import LayerMaskSpec, dense_mask

    ctx_len, block = features.shape[1], block_ids.shape[1]
    anchors = torch.tensor([[ctx_len]], device=features.device)
    ctx_valid = torch.ones(1, ctx_len, dtype=torch.bool, device=features.device)
    cfg = model.config
    causal = sliding_block_causal(cfg)
    masks = {t: dense_mask(anchors, ctx_valid, block, LayerMaskSpec.for_layer(t, cfg.sliding_window, causal)) for t in set(cfg.layer_types)}
    positions = torch.arange(ctx_len, ctx_len + block, device=features.device)[None]
    dtype = next(model.parameters()).dtype
    hidden = model(embed(block_ids).to(dtype), features.to(dtype), positions, masks)
    head = model.head(head)  # a draft vocabulary's own rows: [1, B, Vd]
    return head(hidden.to(head.weight.dtype)).float()


def export(source: Path, output: Path, fmt: str | None = "dflash", target: str | None = None, dtype: str = "bfloat16",
           target_model: Any = None) -> dict[str, Any]:
    """Validate, write ``fmt`` to ``output`` atomically, reload and compare; returns a report.

    ``target_model`` (a loaded ``TargetModel``, e.g. the trainer's) saves loading the target again;
    the comparison then runs on its device.
    """
    if fmt is not None and fmt not in FORMATS:
        raise ExportError(f"--format {fmt!r}; expected one of {FORMATS}")
    check_output(output)
    check_not_source(output, source)
    config, weights, run_record = load_source(source)
    check_config(config, Path(source))
    if run_record is not None and not isinstance(run_record.get("target", {}), dict):
        raise ExportError(f"{Path(source) / 'run.json'}: target={run_record['target']!r:.80}; expected an object (the run's target settings)")
    if fmt is None:  # the CLI without --format: each drafter's first format
        fmt = EAGLE3_FORMATS[0] if is_eagle3(config) else "speculators" if config.get("draft_vocab_size") else "dflash"
    if is_eagle3(config):
        return export_eagle3(config, weights, run_record, Path(source), Path(output), fmt, target, dtype, target_model)
    model = build_model(config, source)
    check_weights(model, weights, str(source))
    if model.has_draft_vocab:  # an unbuilt or inconsistent map would send every draft to target ids 0.. (vLLM adds d2t)
        check_draft_vocab(weights["d2t"], weights["t2d"], str(source))
    model.load_state_dict(weights)
    model.eval()
    config = {**with_model_rope(config, model), "layer_types": list(model.config.layer_types)}  # z-lab's layout may leave it out: all full
    if model.has_draft_vocab and fmt in ("dflash", "sglang"):
        raise ExportError(f"--format {fmt}: z-lab's DFlash layout has no draft vocabulary (config.json draft_vocab_size="
                          f"{config['draft_vocab_size']}); use --format speculators")
    torch_dtype = getattr(torch, dtype)

    target_path = export_target_path(target, run_record)
    if fmt == "speculators" and target_path is None:
        raise ExportError("--format speculators needs the target (--target PATH): the checkpoint carries its embedding and LM head")
    if target_model is not None or target_path is not None:
        from models.target import TargetModel

        from infer.loading import check_target_folder, target_setting

        what = target_setting(target)
        if target_model is None:
            check_target_folder(target_path, what)
        tgt = target_model or TargetModel.from_pretrained(target_path, "cpu", what=what)
        check_against_target(config, tgt.config.get_text_config(), Path(source), f"the target {target_path or '(in memory)'}")
        embed, head = tgt.embed_tokens, tgt.lm_head
    else:  # no target at hand: compare through a fixed random head of the right shape
        generator = torch.Generator().manual_seed(0)
        embed = torch.nn.Embedding(config["vocab_size"], config["hidden_size"]).requires_grad_(False)
        embed.weight.copy_(torch.randn(embed.weight.shape, generator=generator))
        head = torch.nn.Linear(config["hidden_size"], config["vocab_size"], bias=False).requires_grad_(False)
        head.weight.copy_(torch.randn(head.weight.shape, generator=generator) * 0.02)

    device = head.weight.device
    generator = torch.Generator().manual_seed(1)
    features = torch.randn(1, 48, model.fc.in_features, generator=generator).to(device)
    block_ids = torch.full((1, model.block_size), model.mask_token_id, device=device)
    block_ids[0, 0] = 7
    model.to(device)
    full = draft_logits(model, features, block_ids, embed, head)
    cast = cast_copy(model, torch_dtype)
    reference = full if cast is model else draft_logits(cast, features, block_ids, embed, head)

    serve_target = serve_target_name(target, run_record, target_path)
    out_config = dflash_config_json(config)
    out_config["dtype"] = dtype
    # the weights in --dtype; a draft vocabulary's d2t / t2d keep their integer / bool types (bf16 rounds ids past 256)
    tensors = {k: (v.to("cpu", torch_dtype) if v.is_floating_point() else v.to("cpu")).contiguous() for k, v in model.state_dict().items()}
    with atomic_dir(output) as tmp:
        if fmt == "speculators":
            spec_config = speculators_config_json(config, tgt.config, serve_target)
            # The target's embedding and LM head travel with a speculators DFlash checkpoint (vLLM loads them as the
            # draft's embed_tokens / lm_head); a draft vocabulary's head is the drafter's own (lm_head [Vd, H], d2t, t2d:
            # speculators' names and meaning). Not the verifier_lm_head / verifier_norm of speculators' training class:
            # vLLM 0.32's DFlash loader has no such parameter and refuses the checkpoint ("no module or parameter named
            # 'verifier_lm_head'").
            verifier = {"embed_tokens.weight": embed.weight, **({} if model.has_draft_vocab else {"lm_head.weight": head.weight})}
            (tmp / "config.json").write_text(json.dumps(spec_config, indent=2))
            save_file({**tensors, **{k: v.detach().to("cpu", torch_dtype).contiguous().clone() for k, v in verifier.items()}}, str(tmp / WEIGHTS), metadata={"format": "pt"})
            draft_only = {k: v for k, v in load_file(tmp / WEIGHTS).items() if k not in verifier}
            # The config is checked by speculators' own classes (tests); here the weights read back into the drafter the
            # written config.json describes as our speculators reader reads it (its causality flag included)
            reloaded = build_model({**config, **speculators_checkpoint.dflash_config(spec_config, str(tmp / "config.json"))})
            check_weights(reloaded, draft_only, str(tmp))
            reloaded.load_state_dict(draft_only)
            cast_weights(reloaded, torch_dtype)
            reloaded.eval().to(device)
        else:
            (tmp / "config.json").write_text(json.dumps(out_config, indent=2))
            save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt"})
            reloaded = DFlashDraftModel.from_pretrained(tmp, dtype=torch_dtype).eval().to(device)
            check_weights(reloaded, load_file(tmp / WEIGHTS), str(tmp))
        reloaded_logits = draft_logits(reloaded, features, block_ids, embed, head)
        max_diff = float((reloaded_logits - reference).abs().max())
        vs_fp32 = float((reloaded_logits - full).abs().max())
        check_reload(max_diff, torch_dtype, output)
        if model.has_draft_vocab and not torch.equal(reloaded.draft_ids_in_target().cpu(), model.draft_ids_in_target().cpu()):
            raise ExportError(f"{output}: the reloaded d2t maps draft ids to other target ids than the drafter's")

    report = {
        "format": fmt, "output": str(output), "dtype": dtype, "max_abs_logit_diff": max_diff, "max_abs_logit_diff_vs_fp32": vs_fp32,
        "target_layer_ids": spec_config["aux_hidden_state_layer_ids"] if fmt == "speculators" else out_config["dflash_config"]["target_layer_ids"],
        "layer_types": out_config["layer_types"], "sliding_window": out_config["sliding_window"],
        "commands": {"vllm": f"vllm serve {output}"} if fmt == "speculators" else {
            "sglang": engines.sglang_dflash_command(serve_target, str(output)),
            "vllm": engines.vllm_dflash_command(serve_target, str(output), out_config["block_size"]),
        },
    }
    if fmt != "speculators" and not sliding_block_causal(SimpleNamespace(**config)) and "sliding_attention" in out_config["layer_types"]:
        # SGLang's DFLASH (python/sglang/srt/models/dflash.py, read at 003b23d) serves sliding layers as causal DECODER
        # attention and never reads is_causal; z-lab's loader and vLLM's qwen3_dflash honour it
        report["notes"] = ["SGLang's DFLASH serves sliding layers causally (it does not read is_causal); this drafter's sliding "
                           "layers were trained bidirectional inside the block: serve it with vLLM or z-lab's loader, or check "
                           "SGLang's acceptance against ours first"]
    log.info("exported %s (%s, %s): reload max |Δ logits| = %.3g (%.3g against the fp32 drafter)", output, fmt, dtype, max_diff, vs_fp32)
    return report


# ----------------------------------------------------------------------------- EAGLE-3

# SGLang's LlamaForCausalLMEagle3 parameter names (python/sglang/srt/models/llama_eagle3.py): layer 0
# is ``midlayer`` (2H-input q/k/v, ``input_layernorm`` on the embedding, ``hidden_norm`` on the
# hidden state), layers i >= 1 are ``additional_layers.{i-1}`` (BasicDecoderLayer: ``hidden_norm``
# is the pre-attention norm, ``input_layernorm = None``). Its loader maps q/k/v and gate/up onto
# fused parameters, prefixes ``model.`` where needed and silently skips any name it does not know,
# so this list is checked here, not left to the engine.
_SGLANG_LAYER_0 = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                   "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                   "input_layernorm.weight", "hidden_norm.weight", "post_attention_layernorm.weight")
_SGLANG_LAYER_N = tuple(n for n in _SGLANG_LAYER_0 if n != "input_layernorm.weight")
_SGLANG_TOP = ("fc.weight", "norm.weight", "lm_head.weight", "embed_tokens.weight", "d2t", "t2d")
EAGLE3_COMPARE_STEPS = 3
EAGLE3_COMPARE_LEN = 40


def sglang_eagle3_names(num_layers: int) -> set[str]:
    names = set(_SGLANG_TOP) | {f"midlayer.{n}" for n in _SGLANG_LAYER_0}
    return names | {f"additional_layers.{i - 1}.{n}" for i in range(1, num_layers) for n in _SGLANG_LAYER_N}


def to_sglang_name(name: str) -> str:
    """Our (= speculators') weight name -> SGLang's."""
    m = re.fullmatch(r"layers\.(\d+)\.(.+)", name)
    if m is None:
        return name
    i, rest = int(m[1]), m[2]
    if i == 0:
        return f"midlayer.{rest}"
    return f"additional_layers.{i - 1}.{'hidden_norm.weight' if rest == 'input_layernorm.weight' else rest}"


def from_sglang_name(name: str) -> str:
    if name.startswith("midlayer."):
        return "layers.0." + name[len("midlayer."):]
    m = re.fullmatch(r"additional_layers\.(\d+)\.(.+)", name)
    if m is None:
        return name
    rest = "input_layernorm.weight" if m[2] == "hidden_norm.weight" else m[2]
    return f"layers.{int(m[1]) + 1}.{rest}"


def _window(config: dict[str, Any]) -> int | None:
    return config.get("sliding_window") if "sliding_attention" in (config.get("layer_types") or []) else None


def eagle3_sglang_refusal(config: dict[str, Any]) -> str | None:
    """Why SGLang's LlamaForCausalLMEagle3 cannot run this drafter as trained, or None."""
    for flag in engines.SGLANG_EAGLE3_UNSUPPORTED_FLAGS:
        if config.get(flag):
            return (f"--format sglang: the drafter has {flag}=true (EAGLE-3.1 / speculators), which SGLang's LlamaForCausalLMEagle3 "
                    f"does not implement (models/llama_eagle3.py); export --format speculators instead")
    ids = config["target_layer_ids"]
    if len(ids) != 3:
        return (f"--format sglang: the drafter reads {len(ids)} target layers; SGLang's LlamaForCausalLMEagle3 "
                f"fc takes exactly 3 (Linear(3 * target_hidden_size, hidden_size))")
    return None


def eagle3_sglang_config_json(config: dict[str, Any]) -> dict[str, Any]:
    """Our config -> SGLang's LlamaForCausalLMEagle3 config.json (a LlamaConfig plus EAGLE-3 keys)."""
    out = {k: v for k, v in config.items() if k not in ("target_layer_ids", "auto_map")}
    out["architectures"] = ["LlamaForCausalLMEagle3"]
    out["model_type"] = "llama"
    out["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": engines.engine_layer_ids(config["target_layer_ids"], "eagle3_sglang"),
                           "use_aux_hidden_state": True}
    out["sliding_window"] = _window(config)
    out["tie_word_embeddings"] = False  # SGLang ties lm_head to embed_tokens otherwise
    _legacy_rope(out)
    return out


def eagle3_from_sglang_config(out: dict[str, Any]) -> dict[str, Any]:
    """The inverse: an exported SGLang config.json -> our config (what the reload check builds from)."""
    config = {k: v for k, v in out.items() if k not in ("eagle_config", "rope_theta", "rope_scaling", "torch_dtype")}
    config["architectures"] = [EAGLE3_ARCH]
    config["target_layer_ids"] = [i - engines.LAYER_ID_OFFSET["eagle3_sglang"] for i in out["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]
    return config


_EAGLE3_KEYS = ("draft_vocab_size", "target_hidden_size", "target_layer_ids", "fc_norm", "norm_before_fc", "norm_output", "norm_before_residual", "ttt_length")


def eagle3_speculators_config_json(config: dict[str, Any], verifier_name: str, verifier_architectures: list[str], num_steps: int) -> dict[str, Any]:
    """Our config -> vLLM speculators' Eagle3 config.json (``Eagle3SpeculatorConfig`` schema)."""
    layer = {k: v for k, v in config.items() if k not in _EAGLE3_KEYS + ("architectures", "auto_map", "dtype", "torch_dtype")}
    layer["model_type"] = "llama"  # speculators picks its Llama Eagle3 layers from this
    layer["sliding_window"] = _window(config)
    layer["tie_word_embeddings"] = False
    _legacy_rope(layer)
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": layer,
        "draft_vocab_size": config["draft_vocab_size"],
        # vLLM's speculators adapter defaults a missing norm_before_residual to True: always write it.
        "norm_before_residual": bool(config.get("norm_before_residual", False)),
        "norm_before_fc": bool(config.get("norm_before_fc", False)),
        "fc_norm": bool(config.get("fc_norm", False)),
        "norm_output": bool(config.get("norm_output", False)),
        "embed_requires_grad": False,
        "target_hidden_size": config.get("target_hidden_size") or config["hidden_size"],
        "eagle_aux_hidden_state_layer_ids": engines.engine_layer_ids(config["target_layer_ids"], "eagle3_vllm"),
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": num_steps}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier_name, "architectures": verifier_architectures},
        },
    }


def check_draft_vocab(d2t: torch.Tensor, t2d: torch.Tensor, where: str) -> None:
    """d2t and t2d must name the same target ids (engines read one or the other: SGLang d2t, speculators t2d)."""
    kept = t2d.nonzero().flatten()
    if kept.numel() != d2t.numel():
        raise ExportError(f"{where}: t2d marks {kept.numel()} target ids, expected draft_vocab_size={d2t.numel()} (draft vocabulary never built?)")
    if not torch.equal(torch.arange(d2t.numel()) + d2t.cpu(), kept.cpu()):
        raise ExportError(f"{where}: d2t and t2d disagree on the draft vocabulary")


@torch.no_grad()
def eagle3_logits(model: torch.nn.Module, features: torch.Tensor, input_ids: torch.Tensor, steps: int = EAGLE3_COMPARE_STEPS) -> torch.Tensor:
    """``steps`` TTT drafting steps over every index (train/eagle3.py ``unroll``) -> [S, B, T, Vd] logits."""
    from .eagle3 import unroll

    dtype = next(model.parameters()).dtype
    ctx_valid = torch.ones(input_ids.shape, dtype=torch.bool, device=input_ids.device)
    outputs = unroll(model, features.to(dtype), input_ids, ctx_valid, steps, backend="sdpa")
    return torch.stack([model.logits(h) for h in outputs]).float()


def export_eagle3(config: dict[str, Any], weights: dict[str, torch.Tensor], run_record: dict[str, Any] | None, source: Path,
                  output: Path, fmt: str, target: str | None, dtype: str, target_model: Any = None) -> dict[str, Any]:
    """``export`` for an EAGLE-3 drafter: same gate, temp folder, reload and logits comparison."""
    if fmt not in EAGLE3_FORMATS:
        raise ExportError(f"--format {fmt}: {source} is an EAGLE-3 drafter; its formats are {' and '.join(EAGLE3_FORMATS)} "
                          f"(dflash is the DFlash layout)")
    if fmt == "sglang" and (why := eagle3_sglang_refusal(config)):
        raise ExportError(why)
    model = build_model(config, source)
    config = with_model_rope(config, model)
    check_weights(model, weights, str(source))
    check_draft_vocab(weights["d2t"], weights["t2d"], str(source))
    model.load_state_dict(weights)
    model.eval()
    torch_dtype = getattr(torch, dtype)

    target_path = export_target_path(target, run_record)
    serve_target = serve_target_name(target, run_record, target_path)
    num_steps = int(config.get("ttt_length") or 7)
    # the target's config, checked against the drafter wherever one is at hand: given (--target, the trainer's model), or
    # the run's recorded folder still there; speculators' layout needs it (speculators_config names the verifier)
    target_config = None
    if target_model is not None:
        target_config = target_model.config
    elif target_path is not None and (target is not None or fmt == "speculators" or Path(target_path).is_dir()):
        from transformers import AutoConfig

        from infer.loading import check_target_folder, target_setting
        from models.hub import local_files_only

        what = target_setting(target)
        check_target_folder(target_path, what)
        offline = local_files_only(target_path, what)  # a hub id offline: the cache, or one line at once
        target_config = AutoConfig.from_pretrained(target_path, local_files_only=offline)
    if target_config is not None:
        check_against_target(config, target_config.get_text_config(), source, f"the target {target_path or '(in memory)'}")
    window = _window(config)

    device = target_model.embed_tokens.weight.device if target_model is not None else torch.device("cpu")
    model.to(device)
    generator = torch.Generator().manual_seed(1)
    features = torch.randn(1, EAGLE3_COMPARE_LEN, model.fc.in_features, generator=generator).to(device)
    input_ids = torch.randint(0, config["vocab_size"], (1, EAGLE3_COMPARE_LEN), generator=generator).to(device)
    full = eagle3_logits(model, features, input_ids)
    cast = cast_copy(model, torch_dtype)
    reference = full if cast is model else eagle3_logits(cast, features, input_ids)

    notes: list[str] = []
    if fmt == "sglang":
        out_config = eagle3_sglang_config_json(config)
        rename, unrename, reload_config = to_sglang_name, from_sglang_name, eagle3_from_sglang_config
        layer_ids = out_config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        commands = {"sglang": engines.sglang_eagle3_command(serve_target, str(output), num_steps, window)}
        if window is not None and "full_attention" in config["layer_types"]:
            notes.append("SGLang's --speculative-draft-window-size windows every draft layer; this drafter's "
                         f"layer_types {config['layer_types']} keep full layers too, which SGLang cannot express")
        if config["num_hidden_layers"] > 1:
            notes.append("SGLang's additional_layers (BasicDecoderLayer in models/llama_eagle3.py as read) restart the "
                         "residual from the previous layer's MLP output; check its multi-layer outputs against ours before serving")
    else:
        if target_config is None:
            raise ExportError("--format speculators needs the target (--target PATH): speculators_config names the verifier")
        verifier_architectures = list(getattr(target_config, "architectures", None) or [])
        out_config = eagle3_speculators_config_json(config, serve_target, verifier_architectures, num_steps)
        rename = unrename = lambda name: name  # noqa: E731 - our names are speculators' names
        reload_config = lambda c: speculators_eagle3_config(c, f"{output}/config.json")  # noqa: E731 - the loader's own mapping
        layer_ids = out_config["eagle_aux_hidden_state_layer_ids"]
        commands = {"vllm": engines.vllm_eagle3_command(serve_target, str(output), num_steps)}
        if len(config["target_layer_ids"]) != 3:
            notes.append(f"vLLM's Eagle3LlamaForCausalLM fc takes 3 target layers; this drafter reads {len(config['target_layer_ids'])}")
    out_config["dtype"] = dtype

    tensors = {rename(k): (v.to("cpu", torch_dtype) if v.is_floating_point() else v.to("cpu")).contiguous()
               for k, v in model.state_dict().items()}
    # a full draft vocabulary: speculators and vLLM register no d2t / t2d then (vLLM 0.32 refused the two tensors:
    # "no module or parameter named 'draft_id_to_target_id'"), and read the head's rows in target order
    full_vocab = fmt == "speculators" and config["draft_vocab_size"] == config["vocab_size"]
    if full_vocab:
        if tensors["d2t"].any() or not tensors["t2d"].all():
            raise ExportError(f"{source}: a draft vocabulary as large as the target's but not in the target's order; "
                              "speculators reads a full one as the identity")
        del tensors["d2t"], tensors["t2d"]
    with atomic_dir(output) as tmp:
        (tmp / "config.json").write_text(json.dumps(out_config, indent=2))
        save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt"})
        # Reload from the written files only: config.json back to ours, names back to ours.
        written = load_file(tmp / WEIGHTS)
        if full_vocab:  # the identity, as our speculators reader puts it back (``speculators_checkpoint.read_weights``)
            written["d2t"] = torch.zeros(config["vocab_size"], dtype=torch.long)
            written["t2d"] = torch.ones(config["vocab_size"], dtype=torch.bool)
        if fmt == "sglang":
            expected = sglang_eagle3_names(config["num_hidden_layers"])
            if set(written) != expected:
                odd = sorted(set(written) ^ expected)
                raise ExportError(f"{tmp}: tensor {odd[0]!r} does not match SGLang's LlamaForCausalLMEagle3 parameters")
        reloaded = build_model(reload_config(json.loads((tmp / "config.json").read_text())))
        ours = {unrename(k): v for k, v in written.items()}
        check_weights(reloaded, ours, str(tmp))
        reloaded.load_state_dict(ours)
        cast_weights(reloaded, torch_dtype).eval().to(device)
        reloaded_logits = eagle3_logits(reloaded, features, input_ids)
        max_diff = float((reloaded_logits - reference).abs().max())
        vs_fp32 = float((reloaded_logits - full).abs().max())
        check_reload(max_diff, torch_dtype, output)

    report = {
        "format": fmt, "output": str(output), "dtype": dtype, "max_abs_logit_diff": max_diff, "max_abs_logit_diff_vs_fp32": vs_fp32, "target_layer_ids": layer_ids,
        "layer_types": list(config["layer_types"]), "sliding_window": window, "commands": commands, "notes": notes,
    }
    log.info("exported %s (EAGLE-3, %s, %s): reload max |Δ logits| = %.3g (%.3g against the fp32 drafter)", output, fmt, dtype, max_diff, vs_fp32)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path)
    parser.add_argument("output", type=Path)
    parser.add_argument("--format", default=None, choices=FORMATS, help="default: dflash for DFlash drafters (speculators for one with a draft vocabulary, which z-lab's layout cannot hold), sglang for EAGLE-3")
    parser.add_argument("--target", help="target model folder or hub id (default: the one the run recorded)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    log.setLevel(logging.WARNING)  # its "exported ..." line is printed below, once
    try:
        report = export(args.source, args.output, args.format, args.target, args.dtype)
    except ValueError as e:  # ExportError, and a target that does not load (models/target.py)
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"exported {report['output']} ({report['format']}, {report['dtype']}); reload max |Δ logits| = {report['max_abs_logit_diff']:.3g}")
    print(f"target_layer_ids {report['target_layer_ids']}  layer_types {report['layer_types']}  sliding_window {report['sliding_window']}")
    print("serve with:")
    for engine, command in report["commands"].items():
        print(f"  [{engine}] {command}")
    for note in report.get("notes", []):
        print(f"note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
