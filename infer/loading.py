"""Load a Hugging Face target and an exported drafter for the inference loop, checking that they belong
together: a DFlash drafter (``python -m train.export --format dflash`` or a training run's ``export/``)
or an EAGLE-3 drafter (our own layout, ``Eagle3DraftModel.save_pretrained``: config.json with
``architectures == ["Eagle3DraftModel"]``), or either trained by vLLM speculators (``speculators_model_type``
in config.json, or its trainer's ``--save-path`` folder: ``infer/speculators_checkpoint.py``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from swa_kernels.int8_weights import DRAFTER_WEIGHTS
from models.dflash import DFlashDrafter, StaticDFlashDrafter
from models.eagle3 import Eagle3Drafter, StaticEagle3Drafter
from infer.prompt_lookup import PromptLookupDrafter
from models.static_target import StaticTarget
from models.target import CONFIG_ERRORS, CachedTarget, config_error_text, eager_reason
from models.dflash import DFlashDraftModel
from models.eagle3 import Eagle3DraftModel
from models.target import TargetModel
from models.builtin_targets import BUILTIN_PREFIX, resolve_target_path
from models import hub
from models.hub import check_target_folder
from common.cli_help import named_by_flag
from common.json_file import read_json_object
from common.tensor_shapes import shape_differences
from infer import speculators_checkpoint

EAGLE3_ARCHITECTURES = ["Eagle3DraftModel"]
PROMPT_LOOKUP = "pld"  # --drafter pld: prompt-lookup (n-gram) drafting, no trained model


def read_drafter_config(path: str | Path) -> dict:
    """The drafter folder's config.json, checked; a speculators checkpoint's mapped to ours, and a z-lab DFlash checkpoint's
    fields read where z-lab's loader finds them (``zlab_dflash_fields``)."""
    config_file = Path(path) / "config.json"
    if not config_file.exists():
        what = "a file, not a folder" if Path(path).is_file() else "no config.json there"
        raise ValueError(f"drafter {path}: {what}; expected an exported DFlash or EAGLE-3 drafter folder")
    config = read_json_object(config_file, "an object (the drafter's config)")
    if speculators_checkpoint.is_speculators_config(config):  # mapped to our config; the weights by load_drafter_model
        mapped = speculators_checkpoint.read_config(path)
        check_drafter_fields(mapped, f"{config_file} (a speculators checkpoint, read as ours):")
        return mapped
    if config.get("architectures") == ["LlamaForCausalLMEagle3"]:  # our SGLang export: SGLang's layout, not the loop's
        raise ValueError(f"{config_file}: an EAGLE-3 export in SGLang's layout (--format sglang), which SGLang serves; this loop "
                         "reads the run's own export (RUN/export) or its speculators export (RUN/export_speculators)")
    if not is_eagle3(config) and "dflash_config" not in config:
        raise ValueError(f"{config_file}: no 'dflash_config' field and architectures {config.get('architectures')!r}; expected a DFlash "
                         f"drafter (our 'dflash' export format) or an EAGLE-3 drafter (architectures {EAGLE3_ARCHITECTURES})")
    if not is_eagle3(config):
        config = zlab_dflash_fields(config, config_file)
    check_drafter_fields(config, f"{config_file}:")
    return config


# DFlash variants of z-lab's loader (PyPI dflash 0.1.0: selector heads, convolutions, other projectors, MLA, logit transforms)
# that DFlashDraftModel does not implement; each key (in dflash_config or at the top level) with a value other than its
# neutral one is refused in one line rather than loaded as a plain DFlash drafter that drafts noise
ZLAB_VARIANT_FIELDS = {"selector_rank": None, "selector_top_k": None, "conv_kernel_size": None, "conv_group_size": None,
                       "projector_type": None, "attention_mode": None, "input_embedding_scale": 1.0, "output_multiplier": 1.0,
                       "final_logit_softcapping": None}


def zlab_dflash_fields(config: dict, config_file: Path) -> dict:
    """A DFlash config with ``dflash_config.block_size`` and ``mask_token_id`` where z-lab's loader reads them: from
    ``dflash_config``, else the top level, ``block_size`` else 16 (z-lab's ``_draft_value``). z-lab's published checkpoints
    (Qwen3-4B/8B-DFlash-b16 before mid-2026) keep ``block_size`` at the top level only; ours write both. Architectures
    other than DFlashDraftModel, and z-lab's variant fields, are refused in one line."""
    dflash = config.get("dflash_config")
    if not isinstance(dflash, dict):
        return config  # check_drafter_fields names it
    architectures = config.get("architectures")
    if architectures not in (None, ["DFlashDraftModel"]):
        raise ValueError(f"{config_file}: architectures {architectures!r}; this loop builds DFlash (DFlashDraftModel) and EAGLE-3 "
                         f"({EAGLE3_ARCHITECTURES}) drafters; z-lab's other variants run with --engine zlab")
    for field, neutral in ZLAB_VARIANT_FIELDS.items():
        value = dflash.get(field, config.get(field, neutral))
        if value != neutral:
            raise ValueError(f"{config_file}: {field}={value!r}, a z-lab DFlash variant this loop does not implement (plain "
                             f"DFlashDraftModel only); run it with --engine zlab")
    filled = dict(dflash)
    for field, default in (("block_size", 16), ("mask_token_id", None)):
        if field not in filled and config.get(field, default) is not None:
            filled[field] = config.get(field, default)
    return config if filled == dflash else {**config, "dflash_config": filled, "block_size": filled["block_size"]}


LAYER_TYPES = ("sliding_attention", "full_attention")  # layer_types[i], one a drafter layer (train/config.py: the same)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_drafter_fields(config: dict, where: str) -> None:
    """The fields a DFlash or EAGLE-3 drafter is built from, each with its type and range, as one ValueError starting with
    ``where`` and naming the field: the sizes; the target layer ids; ``layer_types`` (one of LAYER_TYPES a layer: the
    model's config class accepts others, which the loop ran as full attention and training refuses); ``sliding_window``
    (a positive integer where a layer slides: 0 drafted NaN, and a sliding layer without a window ran unwindowed);
    DFlash's ``use_sliding_window`` (Qwen3Config drops the window unless it is true), block size (>= 2) and mask token (a
    token id); EAGLE-3's draft vocabulary and TTT length. Read by the loop (``read_drafter_config``) and by the export
    (``train.export.check_config``). Configs of neither kind pass (their loaders say so)."""
    def refuse(field: str, value, expected: str) -> ValueError:
        return ValueError(f"{where} {field}={value!r:.80}; expected {expected}")

    eagle3 = is_eagle3(config)
    if eagle3:
        field, ids = "target_layer_ids", config.get("target_layer_ids")
    elif "dflash_config" in config:
        dflash = config["dflash_config"]
        if not isinstance(dflash, dict) or not all(_is_int(dflash.get(k)) for k in ("block_size", "mask_token_id")):
            raise ValueError(f"{where} dflash_config={dflash!r:.80}; expected an object with integer block_size and mask_token_id "
                             f"and a list target_layer_ids")
        field, ids = "dflash_config.target_layer_ids", dflash.get("target_layer_ids")
    else:
        return
    if not isinstance(ids, list) or not ids or not all(_is_int(i) for i in ids):
        raise ValueError(f"{where} {field}={ids!r}; expected a non-empty list of target layer ids (integers)")
    if len(set(ids)) != len(ids):  # the target captures each layer once: the drafter's input width would not match
        raise ValueError(f"{where} {field}={ids!r}; expected distinct target layer ids")
    for field in ("num_hidden_layers", "hidden_size", "vocab_size"):
        if not _is_int(config.get(field)) or config[field] < 1:
            raise refuse(field, config.get(field), "a positive integer")
    n, vocab = config["num_hidden_layers"], config["vocab_size"]
    # flags the models read with bool(): "yes" or "false" (a string) was taken as true, or blamed on the weights
    flags = ("fc_norm", "norm_before_fc", "norm_output", "norm_before_residual") if eagle3 else ("sliding_block_causal", "is_causal")
    for field in flags:
        if config.get(field) is not None and not isinstance(config[field], bool):
            raise refuse(field, config[field], "true, false or absent")
    types = config.get("layer_types")
    if types is None and not eagle3:
        pass  # z-lab's layout without it: every layer full (Qwen3Config fills it so; dflash_config_json writes it)
    elif not isinstance(types, list) or len(types) != n or not all(t in LAYER_TYPES for t in types):
        raise refuse("layer_types", types, f"a list of num_hidden_layers={n} entries, each one of {', '.join(LAYER_TYPES)}")
    sliding = "sliding_attention" in (types or [])
    if sliding and (not _is_int(config.get("sliding_window")) or config["sliding_window"] < 1):
        raise refuse("sliding_window", config.get("sliding_window"), "a positive integer (the window W in tokens): layer_types has sliding layers")
    if eagle3:
        draft_vocab = config.get("draft_vocab_size")
        if not _is_int(draft_vocab) or not 1 <= draft_vocab <= vocab:
            raise refuse("draft_vocab_size", draft_vocab, f"an integer in 1..vocab_size={vocab}")
        if config.get("ttt_length") is not None and (not _is_int(config["ttt_length"]) or config["ttt_length"] < 1):
            raise refuse("ttt_length", config["ttt_length"], "a positive integer (the drafting steps trained)")
        return
    if sliding and config.get("use_sliding_window") is not True:
        raise refuse("use_sliding_window", config.get("use_sliding_window"),
                     "true where layer_types has sliding layers (Qwen3Config drops sliding_window unless it is)")
    if dflash["block_size"] < 2:
        raise refuse("dflash_config.block_size", dflash["block_size"], "an integer >= 2 (the context token and at least one draft)")
    if not 0 <= dflash["mask_token_id"] < vocab:
        raise refuse("dflash_config.mask_token_id", dflash["mask_token_id"], f"a token id in 0..{vocab - 1} (vocab_size={vocab})")
    draft_vocab = config.get("draft_vocab_size")
    if draft_vocab is not None and (not _is_int(draft_vocab) or not 1 <= draft_vocab <= vocab):
        raise refuse("draft_vocab_size", draft_vocab, f"an integer in 1..vocab_size={vocab}, or absent (the target's vocabulary)")


def is_eagle3(config: dict) -> bool:
    return config.get("architectures") == EAGLE3_ARCHITECTURES


def load_drafter_model(path: str | Path, config: dict, dtype: torch.dtype) -> DFlashDraftModel | Eagle3DraftModel:
    """The drafter's model in ``dtype`` (on the CPU), from our layout or a speculators checkpoint."""
    if speculators_checkpoint.is_speculators_config(json.loads((Path(path) / "config.json").read_text())):
        file = Path(path) / "model.safetensors"
        if file.is_file():  # a missing file: load_model says so in one line; a cut-off one was safetensors' traceback
            safetensors_shapes(file)
        return speculators_checkpoint.load_model(path, config, dtype)
    model_class = Eagle3DraftModel if is_eagle3(config) else DFlashDraftModel
    check_drafter_weights(path, config, model_class)
    # built from the config read_drafter_config checked (z-lab's placements filled in), not from the file once more
    return model_class.from_pretrained(path, config=model_class.config_class.from_dict(config), dtype=dtype)


def safetensors_shapes(file: Path) -> dict[str, tuple[int, ...]]:
    """``file``'s tensor shapes from its header; a truncated or corrupt file as one ValueError naming it."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(file, framework="pt") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{file}: not a readable safetensors file ({e}); truncated or corrupt?") from None


def check_drafter_weights(path: str | Path, config: dict, model_class: type) -> None:
    """Refuse a missing, unreadable (truncated, corrupt) or mismatched ``model.safetensors`` in one line: ``from_pretrained``
    answers those with a traceback, and a missing tensor it starts from random values (a drafter that drafts noise)."""
    file = Path(path) / "model.safetensors"
    if not file.is_file():
        raise ValueError(f"drafter {path}: no model.safetensors there; expected an exported drafter folder (config.json + model.safetensors)")
    shapes = safetensors_shapes(file)
    try:
        with torch.device("meta"):  # the tensors the architecture needs, and their shapes, without allocating them
            expected = {name: tuple(t.shape) for name, t in model_class(model_class.config_class.from_dict(config)).state_dict().items()}
    except CONFIG_ERRORS as e:  # e.g. an unknown rope_type, a string size: was the config class's traceback
        raise ValueError(f"{path}/config.json: the drafter's config does not build its model: {config_error_text(e)}") from None
    for name, found, wanted in shape_differences(shapes, expected)[:1]:
        if found is None:
            raise ValueError(f"{file}: missing tensor {name!r}")
        if wanted is None:
            raise ValueError(f"{file}: unexpected tensor {name!r}; the drafter its config.json describes has no such parameter")
        raise ValueError(f"{file}: tensor {name!r} has shape {found}, expected {wanted} from its config.json")


def check_backend(backend: str, device: str) -> None:
    """``--backend flashinfer`` where it can run, checked by the CLIs before anything loads: the package installed, and a
    GPU (FlashInfer has no CPU kernels). Was a ModuleNotFoundError at the first draft, after the target loaded (and eval's
    settings.json written)."""
    if backend != "flashinfer":
        return
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        raise ValueError("--backend flashinfer: the flashinfer package is not installed; install it, or use --backend sdpa") from None
    if not str(device).startswith("cuda"):
        raise ValueError(f"--backend flashinfer runs on a GPU; the device is {device} (use --backend sdpa)")


def load_models(target_path: str, drafter_path: str | None = None, device: str = "cpu", dtype: str = "auto", window="trained",
                attention_backend: str = "sdpa", draft_steps: int | None = None, tree_topk: int | None = None,
                tree_tokens: int | None = None, tree_lookup: int = 0, tree_redraft: int = 0,
                drafter_weights: str = "model", target_what: str = "--target") -> tuple[StaticTarget | CachedTarget, StaticDFlashDrafter | DFlashDrafter | StaticEagle3Drafter | Eagle3Drafter | None, object]:
    """(cached target, drafter or None, tokenizer); the target captures the layers the drafter reads.

    drafter_path ``"pld"``: prompt lookup (``infer/prompt_lookup.py``), ``draft_steps`` tokens per step (default 15).
    draft_steps: EAGLE-3: chain length / tree depth; DFlash chains: the first N drafts of the trained block verified
        (``StaticDFlashDrafter(draft_tokens=N)``: a shorter verify, and a shorter block pass where the block is causal).
    tree_topk, tree_tokens: tree drafting when either is given (EAGLE-3: EAGLE-2's dynamic tree; DFlash: the same over
        its block's marginals, as deep as the block).
    tree_lookup: trees only: prompt lookup's chain of up to this many drafts joins each tree (0: none).
    tree_redraft: DFlash trees only: the depths whose nodes are drafted again with their path in place (0: none).
    drafter_weights: ``model`` (the drafter's matrices as loaded) or ``int8`` (weight-only int8 copies of the drafter's
        matrices, a DFlash drafter's of the LM head it drafts with too, ``swa_kernels/int8_weights.py``; the target untouched;
        DFlash on its static drafter).
    The drafter is the static one (``StaticEagle3Drafter``, ``StaticDFlashDrafter``: any batch size, captured on a GPU),
    except under FlashInfer attention: the eager one (``Eagle3Drafter``, ``DFlashDrafter``: batch 1).
    target_what: what a bad target's one-line error names (the flag it came from, or the run that recorded it).
    """
    if drafter_path in (None, PROMPT_LOOKUP) and drafter_weights != "model":  # was ignored: rc 0, no int8 anywhere
        raise ValueError(f"--drafter-weights {drafter_weights} quantizes a trained drafter's matrices; "
                         f"{'prompt lookup has none' if drafter_path else 'no --drafter was given'}")
    tree_flags = [flag for flag, given in (("--tree-topk", tree_topk is not None), ("--tree-tokens", tree_tokens is not None),
                                           ("--tree-lookup", bool(tree_lookup)), ("--tree-redraft", bool(tree_redraft))) if given]
    if drafter_path is None and (draft_steps is not None or window != "trained" or tree_flags):  # was ignored: plain decoding, rc 0
        flag = "--draft-steps" if draft_steps is not None else "--window" if window != "trained" else "/".join(tree_flags)
        raise ValueError(f"{flag} sets a drafter's drafting; no --drafter was given")
    check_target_folder(target_path, target_what)
    target = TargetModel.from_pretrained(resolve_target_path(target_path, target_what), device=device, dtype=dtype, what=target_what)
    eager_why = eager_reason(target.model, attention_backend)  # None: the static target and drafters
    drafter = None
    layer_ids: list[int] = []
    if drafter_path == PROMPT_LOOKUP:
        if draft_steps is not None and draft_steps < 1:  # else ``draft_steps or 15`` takes 0 for the default
            raise ValueError(f"--draft-steps {draft_steps}; expected >= 1 (prompt lookup's drafts per step)")
        if tree_topk is not None or tree_tokens is not None or tree_lookup or tree_redraft:
            raise ValueError("--drafter pld drafts chains only: leave out --tree-topk/--tree-tokens/--tree-lookup/--tree-redraft")
        drafter = PromptLookupDrafter(num_draft_tokens=draft_steps or 15, vocab_size=target.vocab_size)
    elif drafter_path is not None:
        try:
            drafter, layer_ids = load_trained_drafter(drafter_path, target, eager_why, window, attention_backend, draft_steps,
                                                      tree_topk, tree_tokens, tree_lookup, tree_redraft, drafter_weights)
        except ValueError as e:
            raise named_by_flag(e, DRAFTER_FLAGS) from None
    return decoding_target(target.model, layer_ids, attention_backend), drafter, target.tokenizer


# the drafters' own checks name their parameters (``tree topk=0``); the user of the CLIs typed the flags (``--tree-topk 0``)
DRAFTER_FLAGS = (("draft_tokens=", "--draft-steps "), ("draft steps=", "--draft-steps "), ("tree topk=", "--tree-topk "),
                 ("tree tokens=", "--tree-tokens "), ("tree_lookup=", "--tree-lookup "), ("tree_redraft=", "--tree-redraft "))


def load_trained_drafter(drafter_path: str, target, eager_why, window, attention_backend, draft_steps, tree_topk, tree_tokens,
                         tree_lookup, tree_redraft, drafter_weights):
    """``load_models``' DFlash or EAGLE-3 drafter for ``target`` and the target layers it reads."""
    config = read_drafter_config(drafter_path)
    eagle3 = is_eagle3(config)
    if eagle3 and tree_redraft:
        raise ValueError(f"drafter {drafter_path} is an EAGLE-3 drafter: --tree-redraft is a DFlash option (EAGLE-3's trees draft "
                         f"every node from its parent already)")
    if not eagle3 and draft_steps is not None and (tree_topk is not None or tree_tokens is not None or tree_lookup):
        raise ValueError(f"drafter {drafter_path} is a DFlash drafter: --draft-steps (the first N drafts of its block verified) "
                         f"is for chains; a tree's size is --tree-tokens")
    layer_ids = list(config["target_layer_ids"] if eagle3 else config["dflash_config"]["target_layer_ids"])
    where = "target_layer_ids" if eagle3 else "dflash_config.target_layer_ids"
    target.check_layer_ids(layer_ids, where=f"{drafter_path}/config.json {where}")
    if config.get("hidden_size") != target.hidden_size:
        raise ValueError(f"{drafter_path}/config.json: hidden_size={config.get('hidden_size')}, the target's is {target.hidden_size}")
    target_vocab = target.model.config.get_text_config().vocab_size
    if eagle3 and config.get("vocab_size") != target_vocab:
        raise ValueError(f"{drafter_path}/config.json: vocab_size={config.get('vocab_size')}, the target's is {target_vocab}")
    if not eagle3 and not config["dflash_config"]["mask_token_id"] < target_vocab:  # DFlash embeds it with the target's table
        raise ValueError(f"{drafter_path}/config.json: dflash_config.mask_token_id={config['dflash_config']['mask_token_id']}; "
                         f"expected a token id of the target's vocabulary (0..{target_vocab - 1})")
    if drafter_weights not in DRAFTER_WEIGHTS:
        raise ValueError(f"--drafter-weights {drafter_weights}: expected one of {', '.join(DRAFTER_WEIGHTS)}")
    model = load_drafter_model(drafter_path, config, target.model.dtype).to(target.device)
    trees = dict(tree_topk=tree_topk, tree_tokens=tree_tokens, tree_lookup=tree_lookup)
    # chains, blocks and trees at any batch size: the static drafters (fixed-shape caches, the whole draft captured on a
    # GPU, beside the static target; batch-1 trees run the batched tree step on one row, ``generate_tree_row``);
    # FlashInfer attention or a target only the eager CachedTarget runs: the eager ones (both refuse tree_lookup without a tree)
    static = eager_why is None
    if eagle3:
        drafter = (StaticEagle3Drafter(model, window=window, steps=draft_steps, weights=drafter_weights, **trees) if static else
                   Eagle3Drafter(model, window=window, steps=draft_steps, attention_backend=attention_backend,
                                 weights=drafter_weights, **trees))
    else:
        trees["tree_redraft"] = tree_redraft
        if drafter_weights != "model" and not static:
            raise ValueError(f"--drafter-weights {drafter_weights} runs on the static DFlash drafter: {eager_why} drafts with "
                             f"the eager one{'; use --backend sdpa' if attention_backend == 'flashinfer' else ''}")
        if draft_steps is not None and not static:
            raise ValueError(f"--draft-steps with a DFlash drafter runs on the static drafter: {eager_why} drafts with the "
                             f"eager one, which verifies whole blocks{'; use --backend sdpa' if attention_backend == 'flashinfer' else ''}")
        drafter = (StaticDFlashDrafter(model, target.embed_tokens, target.lm_head, window=window, draft_tokens=draft_steps,
                                       weights=drafter_weights, **trees)
                   if static else
                   DFlashDrafter(model, target.embed_tokens, target.lm_head, window=window, attention_backend=attention_backend, **trees))
    return drafter, layer_ids


RECORDED_TARGET = "target (recorded with the drafter)"  # what an error names for a target no flag gave (a run.json, a checkpoint)


def target_setting(given: str | None) -> str:
    """What a bad target's one-line error names: ``--target`` when the flag gave it, else the drafter's record."""
    return "--target" if given else RECORDED_TARGET


def drafting_label(drafter) -> str:
    """How a loaded drafter drafts, in words for tables (eval's summary title, ``benchmarks/batch_throughput.py``'s rows):
    e.g. ``DFlash tree top-16, 384 nodes, depth 15, depths 1-2 re-drafted``."""
    if drafter is None:
        return "target alone"
    if isinstance(drafter, PromptLookupDrafter):
        return f"prompt lookup, up to {drafter.num_draft_tokens} drafts"
    eagle3 = isinstance(drafter, (StaticEagle3Drafter, Eagle3Drafter))
    depth = drafter.steps if eagle3 else drafter.block_size - 1
    int8 = ", int8 weights" if getattr(drafter, "weights", "model") == "int8" else ""
    if not drafter.tree:
        if eagle3:
            return f"EAGLE-3 chain of {depth}" + int8
        block = getattr(drafter, "block", drafter.block_size)
        return f"DFlash block of {block}" + (f", its first {depth} drafts verified" if depth < block - 1 else "") + int8
    label = f"{'EAGLE-3' if eagle3 else 'DFlash'} tree top-{drafter.tree_topk}, {drafter.tree_tokens} nodes, depth {depth}"
    if drafter.tree_lookup:
        label += f", + prompt lookup's chain of {drafter.tree_lookup}"
    if getattr(drafter, "tree_redraft", 0):
        label += f", depths 1-{drafter.tree_redraft} re-drafted"
    return label + int8


def decoding_target(model, layer_ids: list[int], attention_backend: str = "sdpa") -> StaticTarget | CachedTarget:
    """The loop's target: static caches and captured steps (``models/static_target.py``; on a GPU the layers'
    small ops compiled too: 93 -> 139 tokens/s at Qwen3-8B's shape); with FlashInfer attention, or for a target the
    static one does not run (gpt-oss, Mistral's window: ``static_unsupported``, said once on stderr), the eager
    ``CachedTarget`` at batch 1."""
    why = eager_reason(model, attention_backend)
    if why is not None:
        if attention_backend != "flashinfer":  # a flag the user gave needs no note
            print(f"note: {why}: decoding on the eager cached target (batch 1, no captured steps; slower than a "
                  "Llama/Qwen-style target's static one)", file=sys.stderr)
        return CachedTarget(model, layer_ids, attention_backend=attention_backend)
    return StaticTarget(model, layer_ids, compile_layers=next(model.parameters()).is_cuda)


DRAFTER_FOLDERS = ("a training run folder (run.json), an exported DFlash or EAGLE-3 drafter (config.json), a speculators "
                   "--save-path folder, a hub id, or pld (prompt lookup)")


def resolve_run(target: str | None, drafter: str | None) -> tuple[str | None, str | None, str | None]:
    """(target, drafter, run folder). ``drafter`` may be a training run's folder (``python -m train``'s
    ``output_dir``, holding ``run.json``): its export is the drafter and, unless ``target`` is given, the
    target it was trained on is the target. A speculators ``--save-path`` folder resolves to its best (else newest)
    checkpoint, so every engine (ours, vLLM) reads the same one. A hub id (``owner/name``, no such local folder) is the
    downloaded snapshot's folder (``models.hub.download``; offline, the cached one)."""
    if drafter is None or drafter == PROMPT_LOOKUP:
        return target, drafter, None
    if hub.is_hub_id(drafter):  # a published drafter (z-lab's DFlash, a speculators checkpoint): its downloaded folder
        drafter = hub.download(drafter, "--drafter")
    folder = Path(drafter)
    if not folder.is_dir():  # before anything loads (the target took seconds, then the error blamed a missing config.json)
        raise ValueError(f"--drafter={drafter!r}: {'a file, not a folder' if folder.exists() else 'no such folder'}; expected {DRAFTER_FOLDERS}")
    if not (folder / "run.json").is_file():
        checkpoint = speculators_checkpoint.resolve_checkpoint(drafter)
        if not (checkpoint / "config.json").is_file():  # else eval said "--drafter given without --target" for an empty folder
            raise ValueError(f"--drafter={drafter!r}: no run.json or config.json there, and no speculators checkpoint in it; "
                             f"expected {DRAFTER_FOLDERS}")
        return target or speculators_checkpoint.verifier_path(checkpoint), drafter if checkpoint == folder else str(checkpoint), None
    record_file = Path(drafter) / "run.json"
    try:
        record = json.loads(record_file.read_text())
        export, run_target = record.get("export"), record["target"]["path"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{record_file}: not a training run record ({e})") from None
    export = run_export_path(folder, export)
    if export is None or not (export / "config.json").is_file():
        shown = None if export is None else str(export)
        raise ValueError(f"{record_file}: the run has no export (export={shown!r}; interrupted, or trainer.export=false); "
                         f"pass an exported drafter folder instead")
    return target or run_target, str(export), drafter


def run_export_path(run_dir: str | Path, recorded: str | None) -> Path | None:
    """A training run's drafter folder from run.json's ``export`` (None: not exported): inside the run folder, where the
    trainer writes it (output_dir/export), never at the recorded path, which is where the run was written (relative to the
    directory it ran in): a copy or move of the folder read the other run's drafter whenever that one still existed, and a
    copy with a broken or missing export decoded without a word."""
    return Path(run_dir) / Path(recorded).name if recorded else None


def recorded_target_warning(given: str | None, run_dir: str | None) -> str | None:
    """One line when ``--target`` names another target than the one the training run recorded: the drafter reads that
    target's hidden states, so another model of the same shape loads (every shape check passes) and drafts for features
    it never saw; τ falls with no error. The same folder (as a path, or a copy: same config.json, same files and sizes)
    or the recorded name passes quietly."""
    if not given or not run_dir:
        return None
    record = json.loads((Path(run_dir) / "run.json").read_text()).get("target", {})
    recorded = record.get("path")
    if given == recorded:
        return None
    builtin = lambda path: resolve_target_path(path, "--target") if path and path.startswith(BUILTIN_PREFIX) else path  # noqa: E731
    if same_target_folder(builtin(given), record.get("resolved_path") or builtin(recorded)):
        return None
    return (f"warning: --target {given} is not the target the run {run_dir} was trained on ({recorded}); the drafter reads "
            "its hidden states, so τ measures a drafter on features it was not trained with")


def same_target_folder(given: str, recorded: str | None) -> bool:
    """Both local folders and the same model: one path, or a copy (equal config.json, the same file names and sizes)."""
    if recorded is None:
        return False
    a, b = Path(given), Path(recorded)
    if not (a.is_dir() and b.is_dir()):
        return False
    if a.resolve() == b.resolve():
        return True

    def files(folder: Path) -> set[tuple[str, int]]:
        return {(f.name, f.stat().st_size) for f in folder.iterdir() if f.is_file() and not f.name.startswith(".")}

    config_a, config_b = a / "config.json", b / "config.json"
    return (config_a.is_file() and config_b.is_file() and config_a.read_bytes() == config_b.read_bytes()
            and files(a) == files(b))


def window_warning(drafter, window) -> str | None:
    """One line when the inference window differs from the trained one in a way training never saw."""
    model = getattr(drafter, "model", None)
    trained = getattr(getattr(model, "config", None), "sliding_window", None)
    layer_types = getattr(getattr(model, "config", None), "layer_types", None) or []
    if model is not None and isinstance(window, int) and layer_types and "sliding_attention" not in layer_types:
        # a window applies to sliding layers only: a sweep over windows of this drafter decodes the same cell again and again
        return (f"warning: --window {window} changes nothing: every layer of this drafter attends fully "
                f"(layer_types: {len(layer_types)} x full_attention)")
    if model is None or trained is None or window == "trained" or "sliding_attention" not in layer_types:
        return None
    if window is None:
        return (f"warning: --window none runs a drafter trained with W={trained} with full attention; its τ measures "
                "attention it was not trained with")
    if window > trained:
        return (f"warning: --window {window} is beyond the W={trained} this drafter was trained with; its τ measures "
                "a window it never saw")
    return None


def resolve_device(name: str) -> str:
    """``auto``: the GPU when there is one."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device {name!r}; expected auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ValueError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA GPU(s); expected auto, cpu or a GPU it has")
    return name


def eos_ids(tokenizer, model) -> list[int]:
    """End-of-sequence ids: the generation config's (may be a list), else the tokenizer's."""
    ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if ids is None:
        ids = tokenizer.eos_token_id
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    return ids


def parse_window(value: str):
    """CLI window: ``trained`` | ``none`` | a positive int."""
    if value == "trained":
        return "trained"
    if value.lower() == "none":
        return None
    try:
        window = int(value)
    except ValueError:
        window = 0
    if window < 1:
        raise ValueError(f"--window {value!r}; expected 'trained', 'none' or a positive integer")
    return window


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


DEFAULT_THREADS = torch.get_num_threads()  # torch's default (one per core): the CLIs import this module before setting any


# At batch 1 on the CPU, targets of fewer parameters run on one thread (see ``set_threads``)
ONE_THREAD_BELOW_PARAMS = 10_000_000


def set_threads(device: str, threads: int | None, batch_size: int = 1, target_model: torch.nn.Module | None = None) -> None:
    """CPU intra-op threads. Default on CPU: one per core when batched, where a verify's rows x tokens make matmuls large
    enough to split (the reference target at batch 8 on 2 cores: 2 threads 1.6-1.8x one; BENCHMARKS.md, issue 24). At
    batch size 1, one per core for a target of at least ``ONE_THREAD_BELOW_PARAMS`` parameters (the 27M reference
    target, 16 MT-Bench conversations, 2-core AVX-512 machine, 2 threads against 1: the target alone 100.2 / 77.4
    tokens/s, prompt lookup 231.7 / 218.2, the recipe's DFlash drafter 104.4 / 89.0; the AVX2 kind's benchmarks ran
    batch 1 on 2 threads for the same reason), and 1 for a smaller one or before the target is loaded
    (``target_model`` None): decoding a tiny model is a chain of tiny matmuls and each OpenMP parallel region cost ~16
    ms of wake-up on 2-core machines (the tiny target's MT-Bench run: 150 tok/s on 1 thread, 32 on 2). The CLIs call it
    before loading and again with the loaded target. Threads change speed only: batched rows on 2 threads give batch
    1's tokens (tests/test_batch.py)."""
    if threads is not None and threads < 1:
        print(f"error: --threads {threads}; expected >= 1", file=sys.stderr)
        raise SystemExit(2)  # the CLIs' exit status for bad input
    if threads is not None or str(device).startswith("cpu"):
        large = target_model is not None and sum(p.numel() for p in target_model.parameters()) >= ONE_THREAD_BELOW_PARAMS
        torch.set_num_threads(threads or (DEFAULT_THREADS if batch_size > 1 or large else 1))
