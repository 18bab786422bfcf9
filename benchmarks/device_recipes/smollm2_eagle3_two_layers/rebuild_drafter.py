"""Rebuild a loadable drafter folder from what ``progress.sh`` returns from a lease.

``progress.sh`` sends the drafter back without the target's embedding (EAGLE-3's frozen copy: 113 MB in fp32) and in
bf16, split into pieces under a call's 16 MiB: ``drafter_noembed.safetensors.partNN`` and ``drafter_config.json``. This
joins the pieces, puts the target's input embedding back as ``embed_tokens.weight`` (EAGLE-3; a DFlash drafter's file
holds no embedding to begin with) and writes ``config.json`` and ``model.safetensors`` under ``OUT.partial``, renamed
to ``OUT`` once written: a failed rebuild never leaves a complete-looking ``OUT``.

    python benchmarks/device_recipes/smollm2_eagle3_two_layers/rebuild_drafter.py RETURNED_DIR OUT_DIR \
        --target builtin:smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load, save_file

EMBED_KEY = "embed_tokens.weight"


def rebuild(returned: Path, out: Path, target_path: str) -> Path:
    pieces = sorted(returned.glob("drafter_noembed.safetensors.part*"))
    config_file = returned / "drafter_config.json"
    if not pieces or not config_file.is_file():
        raise SystemExit(f"{returned}: expected drafter_noembed.safetensors.part* and drafter_config.json "
                         f"(what progress.sh returns after 'all done')")
    config = json.loads(config_file.read_text())
    state = load(b"".join(p.read_bytes() for p in pieces))
    if "dflash_config" in config:  # DFlash reads the target's embedding and head at run time: its file has neither
        return write_folder(state, config, out)
    if EMBED_KEY in state:
        raise SystemExit(f"{pieces[0]}: already holds {EMBED_KEY}; nothing to rebuild")

    from models.builtin_targets import resolve_target_path  # builtin: names build offline, then load as folders
    from models.target import TargetModel

    target = TargetModel.from_pretrained(resolve_target_path(target_path, "--target"), dtype="float32", what="--target")
    embedding = target.model.get_input_embeddings().weight.detach()
    # speculators' layout (pipeline.sh's time-limit fallback exports an EAGLE-3 checkpoint so) nests the model's fields
    fields = config.get("transformer_layer_config", config)
    want = (fields["vocab_size"], config.get("target_hidden_size", fields.get("target_hidden_size", fields["hidden_size"])))
    if tuple(embedding.shape) != want:
        raise SystemExit(f"{target_path}: embedding {tuple(embedding.shape)}, expected {want} from {config_file}")
    state[EMBED_KEY] = embedding.to(torch.bfloat16).contiguous()
    return write_folder(state, config, out)


def write_folder(state: dict[str, torch.Tensor], config: dict, out: Path) -> Path:
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(state, str(tmp / "model.safetensors"))
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("returned", type=Path, help="the folder holding the returned pieces and drafter_config.json")
    parser.add_argument("out", type=Path, help="the drafter folder to write")
    parser.add_argument("--target", default="builtin:smollm2-135m-instruct")
    args = parser.parse_args(argv)
    print(rebuild(args.returned, args.out, args.target))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    main()
