"""Which engine decodes ``python -m eval``'s prompts: ours (``infer.generate``), vLLM in its own environment,
a running server (``--server URL``) or z-lab's reference DFlash loop (``infer/zlab_engine.py``). The clients live in
``infer/serving.py``; here: what each engine can be asked, and which drafter folder it loads.

Another engine decodes greedily with the window the export was trained with (the engine reads it from the
export): τ and per-position acceptance come from the engine's own counters, tokens are checked against our
target alone (``--baseline``), and no speedup is reported (another engine's speed over our baseline's is no
speed result).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def engine_drafter(drafter_dir: str, kind: str, engine: str = "vllm") -> str:
    """The folder another engine loads for a drafter: an engine export (``python -m train.export --format ...``), or
    the one a training run wrote beside its own export (``export_speculators`` for EAGLE-3, ``export_dflash``). A DFlash
    engine export is z-lab's layout (vLLM and z-lab's loop read it): ``dflash_config`` without our layout's
    ``sliding_block_causal``."""
    path = Path(drafter_dir)
    config = json.loads((path / "config.json").read_text()) if (path / "config.json").exists() else {}
    draft_vocab = kind == "dflash" and config.get("draft_vocab_size") and "dflash_config" in config
    if draft_vocab and engine == "zlab":
        raise ValueError(f"--engine zlab: {path} is a DFlash drafter with a draft vocabulary (draft_vocab_size="
                         f"{config['draft_vocab_size']}); z-lab's loop decodes with the target's whole head; use --engine ours or vllm")
    fmt = "speculators" if kind == "eagle3" or draft_vocab else "dflash"  # a DFlash draft vocabulary: speculators' layout only
    zlab_layout = "dflash_config" in config and "sliding_block_causal" not in config
    if "speculators_model_type" in config or (kind == "dflash" and ("auto_map" in config or zlab_layout)):
        return str(path)
    sibling = path.parent / f"export_{fmt}"
    if (sibling / "config.json").exists():
        return str(sibling)
    what = "an EAGLE-3 export in speculators' layout" if kind == "eagle3" else (
        "a DFlash export in speculators' layout" if draft_vocab else "a DFlash export in z-lab's layout")
    raise ValueError(f"--engine {engine}: {path} is not {what} and no {sibling} exists; export it first: "
                     f"python -m train.export {path} {sibling} --format {fmt} --target TARGET")


def check_engine_args(args, windows) -> None:
    """What another engine cannot do, refused before anything loads."""
    if args.server and args.engine not in ("ours", "server"):
        raise ValueError(f"--server {args.server} with --engine {args.engine}: the server is the engine (drop --engine)")
    if args.server:
        from urllib.parse import urlparse

        url = urlparse(args.server)
        if url.scheme not in ("http", "https") or not url.netloc:  # was "unknown url type: 'notaurl/v1/models'"
            raise ValueError(f"--server {args.server!r}; expected the server's base URL, http(s)://HOST:PORT")
        args.engine = "server"
    if args.engine == "ours":
        return
    if args.engine == "server" and not args.server:
        raise ValueError("--engine server needs --server URL (an OpenAI-compatible vLLM server's base URL)")
    if args.command == "sweep" or windows != ["trained"]:
        raise ValueError(f"--engine {args.engine} runs the window the export was trained with (the engine reads it from the export): "
                         "no --window override or sweep")
    if args.temperature != 0:
        raise ValueError(f"--engine {args.engine}: greedy only (--temperature 0), so its tokens can be checked against the target alone")
    if args.tree_topk is not None or args.tree_tokens is not None or args.tree_lookup:
        raise ValueError(f"--engine {args.engine}: tree drafting (--tree-topk/--tree-tokens/--tree-lookup) is our loop's; the engine "
                         "drafts the export's chain or block")
    if getattr(args, "drafter_weights", "model") != "model":
        raise ValueError(f"--engine {args.engine}: --drafter-weights {args.drafter_weights} is our loop's; the engine loads the "
                         "export's weights as they are")
    if args.engine == "vllm":  # vLLM's interpreter before the target loads, not after
        from infer.serving import vllm_python

        vllm_python(args.vllm_python)


def start_engine(args, source: dict, target, drafter, tokenizer):
    """vLLM with the drafter's engine export in its own process, the client of a running server, or z-lab's loop."""
    from eval.runner import max_positions
    from infer.loading import eos_ids
    from infer.prompt_lookup import PromptLookupDrafter
    from infer.serving import ServerEngine, VllmEngine
    from models.builtin_targets import resolve_target_path
    from models.eagle3 import Eagle3Drafter, StaticEagle3Drafter

    if drafter is None or isinstance(drafter, PromptLookupDrafter):
        raise ValueError(f"--engine {args.engine} needs a trained drafter (--drafter RUN or EXPORT; with --server, the one it serves)")
    eos = eos_ids(tokenizer, target.model)
    if args.engine == "zlab":
        from infer.zlab_engine import ZlabEngine
        from models.dflash import DFlashDrafter, StaticDFlashDrafter

        if not isinstance(drafter, (DFlashDrafter, StaticDFlashDrafter)):
            raise ValueError(f"--engine zlab runs z-lab's DFlash loop; {source['drafter']} is a {type(drafter).__name__}")
        return ZlabEngine(target.model, engine_drafter(source["drafter"], "dflash", "zlab"), eos)
    if args.engine == "server":
        engine = ServerEngine(args.server, eos)
        if engine.metrics() is None:
            raise ValueError(f"server {args.server}: /metrics has no vllm:spec_decode_* counters (no speculative decoding, or not "
                             "vLLM's metric names): τ cannot be read")
        return engine
    kind = "eagle3" if isinstance(drafter, (Eagle3Drafter, StaticEagle3Drafter)) else "dflash"
    if kind == "dflash" and len(set(drafter.model.config.layer_types)) > 1:
        print("note: vLLM runs a DFlash drafter mixing sliding and full layers only on its V2 model runner (GPU, Triton)", file=sys.stderr)
    # the precision our target loaded with (--dtype): vLLM ran float32 whatever the run recorded, and its tokens were checked
    # against a target of another precision
    dtype = str(target.model.dtype).removeprefix("torch.")
    return VllmEngine(args.vllm_python, resolve_target_path(source["target"]), engine_drafter(source["drafter"], kind), kind,
                      drafter.block_size - 1, eos, max_positions(target), dtype=dtype)
