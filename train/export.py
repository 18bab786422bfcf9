"""Export a trained drafter for a serving engine.

    python -m train.export SOURCE OUTPUT [--format dflash|sglang] [--target PATH] [--dtype bfloat16]

SOURCE is a run folder (``output_dir`` of ``python -m train``: its ``export/``, else its newest
checkpoint), an export folder (``config.json`` + ``model.safetensors``) or a checkpoint folder
(``checkpoints/step_*``). Formats:

- ``speculators``: vLLM speculators' DFlash layout (``speculators_model_type: dflash``,
  ``transformer_layer_config`` with ``layer_types`` / ``sliding_window``, ``aux_hidden_state_layer_ids``
  = our ids + 1, ``speculators_config`` with the verifier), weights plus the verifier's
  ``embed_tokens`` / ``lm_head`` / ``verifier_lm_head`` / ``verifier_norm`` (needs the target).
- ``dflash`` / ``sglang``: the z-lab DFlash layout that z-lab's loader and SGLang's DFLASH
  algorithm read: ``architectures: [DFlashDraftModel]``, ``model_type: qwen3``, ``dflash_config``
  {target_layer_ids, block_size, mask_token_id}, ``block_size``, ``num_target_layers``,
  ``layer_types``, ``sliding_window``, ``use_sliding_window``, RoPE in ``rope_parameters`` and
  the legacy ``rope_theta`` / ``rope_scaling``; weights ``fc``, ``hidden_norm``, ``layers.*``,
  ``norm`` (no embedding, no LM head: the target's are used).

The gate: every tensor the architecture needs must be present with its shape (else a one-line
error naming it, and nothing is written); the export is built in a temporary folder, reloaded with
our own loader and compared with the in-memory drafter (max |Δ logits| is printed), then renamed.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from . import engines
from .atomic import atomic_dir
from .checkpoint import list_checkpoints, load_checkpoint
from .models.dflash import DFlashDraftModel, sliding_block_causal

log = logging.getLogger(__name__)

FORMATS = ("dflash", "sglang", "speculators")
# speculators' DFlash model carries the verifier's embedding, LM head and final norm too.
SPECULATORS_VERIFIER_TENSORS = ("embed_tokens.weight", "lm_head.weight", "verifier_lm_head.weight", "verifier_norm.weight")
WEIGHTS = "model.safetensors"


class ExportError(ValueError):
    """Bad export input; the message names the file, key or tensor."""


def load_source(source: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, Any] | None]:
    """-> (drafter config dict, weights, run record or None) from a run, export or checkpoint folder."""
    source = Path(source)
    run_record = None
    if (source / "run.json").exists():
        run_record = json.loads((source / "run.json").read_text())
        if (source / "export" / WEIGHTS).exists():
            source = source / "export"
        else:
            found = list_checkpoints(source)
            if not found:
                raise ExportError(f"{source}: run folder has neither export/ nor a checkpoint")
            source = found[-1]
    if (source / "state.pt").exists():
        state = load_checkpoint(source)
        if "model_config" not in state:
            raise ExportError(f"{source / 'state.pt'}: checkpoint has no 'model_config' (written by an older version)")
        return state["model_config"], state["model"], run_record
    if not (source / "config.json").exists():
        raise ExportError(f"{source}: expected a run folder, an export folder (config.json) or a checkpoint (state.pt)")
    if not (source / WEIGHTS).exists():
        raise ExportError(f"{source}: no {WEIGHTS}")
    config = json.loads((source / "config.json").read_text())
    return config, load_file(source / WEIGHTS), run_record


def build_model(config_dict: dict[str, Any]) -> DFlashDraftModel:
    from transformers import Qwen3Config

    if config_dict.get("architectures") != ["DFlashDraftModel"] or "dflash_config" not in config_dict:
        raise ExportError(f"config.json: architectures={config_dict.get('architectures')}; only DFlash drafters export yet")
    return DFlashDraftModel(Qwen3Config.from_dict(config_dict))


def check_weights(model: DFlashDraftModel, weights: dict[str, torch.Tensor], where: str) -> None:
    """Refuse missing, unexpected or mis-shaped tensors, naming the first of each."""
    expected = {k: v.shape for k, v in model.state_dict().items()}
    missing = sorted(set(expected) - set(weights))
    if missing:
        raise ExportError(f"{where}: missing tensor {missing[0]!r} ({len(missing)} missing in all)")
    unexpected = sorted(set(weights) - set(expected))
    if unexpected:
        raise ExportError(f"{where}: unexpected tensor {unexpected[0]!r} ({len(unexpected)} unexpected in all)")
    for name, shape in expected.items():
        if tuple(weights[name].shape) != tuple(shape):
            raise ExportError(f"{where}: tensor {name!r} has shape {tuple(weights[name].shape)}, expected {tuple(shape)}")


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
    rope = out.get("rope_parameters") or {}
    out["rope_theta"] = rope.get("rope_theta", out.get("rope_theta"))
    out["rope_scaling"] = None if rope.get("rope_type", "default") == "default" else dict(rope)
    return out


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
        "draft_vocab_size": config["vocab_size"],
        "block_size": block_size,
        "target_hidden_size": text.hidden_size,
        "aux_hidden_state_layer_ids": engines.engine_layer_ids(dflash["target_layer_ids"], "speculators"),
        "mask_token_id": dflash["mask_token_id"],
        "sliding_window_non_causal": not config.get("sliding_block_causal", True),
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
    from .masks import LayerMaskSpec, dense_mask

    ctx_len, block = features.shape[1], block_ids.shape[1]
    anchors = torch.tensor([[ctx_len]], device=features.device)
    ctx_valid = torch.ones(1, ctx_len, dtype=torch.bool, device=features.device)
    cfg = model.config
    causal = sliding_block_causal(cfg)
    masks = {t: dense_mask(anchors, ctx_valid, block, LayerMaskSpec.for_layer(t, cfg.sliding_window, causal)) for t in set(cfg.layer_types)}
    positions = torch.arange(ctx_len, ctx_len + block, device=features.device)[None]
    dtype = next(model.parameters()).dtype
    hidden = model(embed(block_ids).to(dtype), features.to(dtype), positions, masks)
    return head(hidden.to(head.weight.dtype)).float()


def export(source: Path, output: Path, fmt: str = "dflash", target: str | None = None, dtype: str = "bfloat16",
           target_model: Any = None) -> dict[str, Any]:
    """Validate, write ``fmt`` to ``output`` atomically, reload and compare; returns a report.

    ``target_model`` (a loaded ``TargetModel``, e.g. the trainer's) saves loading the target again;
    the comparison then runs on its device.
    """
    if fmt not in FORMATS:
        raise ExportError(f"--format {fmt!r}; expected one of {FORMATS}")
    config, weights, run_record = load_source(source)
    model = build_model(config)
    check_weights(model, weights, str(source))
    model.load_state_dict(weights)
    model.eval()
    torch_dtype = getattr(torch, dtype)

    target_path = target or (run_record or {}).get("target", {}).get("resolved_path")
    if fmt == "speculators" and target_path is None:
        raise ExportError("--format speculators needs the target (--target PATH): the checkpoint carries its embedding and LM head")
    if target_model is not None or target_path is not None:
        from .target import TargetModel

        tgt = target_model or TargetModel.from_pretrained(target_path, "cpu")
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
    reference = draft_logits(model, features, block_ids, embed, head)

    recorded = (run_record or {}).get("target", {}).get("path")
    serve_target = target or (recorded if recorded and not recorded.startswith("builtin:") else target_path) or "TARGET"
    out_config = dflash_config_json(config)
    out_config["dtype"] = dtype
    tensors = {k: v.to("cpu", torch_dtype).contiguous() for k, v in model.state_dict().items()}
    with atomic_dir(output) as tmp:
        if fmt == "speculators":
            spec_config = speculators_config_json(config, tgt.config, serve_target)
            final_norm = tgt.model.get_decoder().norm.weight if hasattr(tgt.model, "get_decoder") else tgt.model.model.norm.weight
            verifier = {"embed_tokens.weight": embed.weight, "lm_head.weight": head.weight,
                        "verifier_lm_head.weight": head.weight, "verifier_norm.weight": final_norm}
            (tmp / "config.json").write_text(json.dumps(spec_config, indent=2))
            save_file({**tensors, **{k: v.detach().to("cpu", torch_dtype).contiguous().clone() for k, v in verifier.items()}}, str(tmp / WEIGHTS), metadata={"format": "pt"})
            draft_only = {k: v for k, v in load_file(tmp / WEIGHTS).items() if k not in SPECULATORS_VERIFIER_TENSORS}
            # The config is checked by speculators' own classes (tests); here the weights read back.
            reloaded = build_model(config).to(torch_dtype)
            check_weights(reloaded, draft_only, str(tmp))
            reloaded.load_state_dict(draft_only)
            reloaded.eval().to(device)
        else:
            (tmp / "config.json").write_text(json.dumps(out_config, indent=2))
            save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt"})
            reloaded = DFlashDraftModel.from_pretrained(tmp, dtype=torch_dtype).eval().to(device)
            check_weights(reloaded, load_file(tmp / WEIGHTS), str(tmp))
        max_diff = float((draft_logits(reloaded, features, block_ids, embed, head) - reference).abs().max())
        # bf16 weights move logits by ~1e-2; anything large means a broken export.
        limit = 1e-4 if torch_dtype == torch.float32 else 0.5
        if not max_diff <= limit:
            raise ExportError(f"{output}: reloaded export differs from the drafter by {max_diff:.3g} in logits (limit {limit})")

    report = {
        "format": fmt, "output": str(output), "dtype": dtype, "max_abs_logit_diff": max_diff,
        "target_layer_ids": spec_config["aux_hidden_state_layer_ids"] if fmt == "speculators" else out_config["dflash_config"]["target_layer_ids"],
        "layer_types": out_config["layer_types"], "sliding_window": out_config["sliding_window"],
        "commands": {"vllm": f"vllm serve {output}"} if fmt == "speculators" else {
            "sglang": engines.sglang_dflash_command(serve_target, str(output)),
            "vllm": engines.vllm_dflash_command(serve_target, str(output), out_config["block_size"]),
        },
    }
    log.info("exported %s (%s, %s): reload max |Δ logits| = %.3g", output, fmt, dtype, max_diff)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path)
    parser.add_argument("output", type=Path)
    parser.add_argument("--format", default="dflash", choices=FORMATS)
    parser.add_argument("--target", help="target model folder or hub id (default: the one the run recorded)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        report = export(args.source, args.output, args.format, args.target, args.dtype)
    except ExportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"exported {report['output']} ({report['format']}, {report['dtype']}); reload max |Δ logits| = {report['max_abs_logit_diff']:.3g}")
    print(f"target_layer_ids {report['target_layer_ids']}  layer_types {report['layer_types']}  sliding_window {report['sliding_window']}")
    print("serve with:")
    for engine, command in report["commands"].items():
        print(f"  [{engine}] {command}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
