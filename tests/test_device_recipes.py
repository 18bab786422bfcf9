"""The lease scripts of ``benchmarks/device_recipes/``: they run where nothing can be fixed mid-call (a GPU lease of
30 minutes, a call returning at most 8 files of 16 MiB, 64 MiB together), so what can be checked here is checked:
every script parses, and ``progress.sh`` returns what a lease produced within a call's limits, in the order the
next call expects (the regenerated file first, the drafter without the target's embedding after "all done")."""
import importlib.util
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

RECIPES = Path(__file__).resolve().parents[1] / "benchmarks" / "device_recipes"
PROGRESS = RECIPES / "smollm2_eagle3_two_layers" / "progress.sh"
MAX_FILES, MAX_FILE_BYTES, MAX_TOTAL_BYTES = 8, 16 * 2**20, 64 * 2**20  # what one call returns (the device README)
_spec = importlib.util.spec_from_file_location("rebuild_drafter", PROGRESS.parent / "rebuild_drafter.py")
rebuild_drafter = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rebuild_drafter)


@pytest.mark.parametrize("script", sorted(RECIPES.rglob("*.sh")), ids=lambda p: str(p.relative_to(RECIPES)))
def test_recipe_script_parses(script: Path) -> None:
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def _lease_folder(root: Path, *, all_done: bool) -> Path:
    """A pipeline folder as pipeline.sh leaves it: times, logs, the regenerated file's pieces, the exported drafter."""
    w = root / "sm"
    (w / "ret").mkdir(parents=True)
    (w / "times.txt").write_text("07:45:24 1 start\n07:59:14 2 regen file packed\n" + ("08:05:11 3 all done\n" if all_done else ""))
    for log in ("regen.log", "probe.log", "train.log", "pipeline.out"):
        (w / log).write_text(f"{log}\n")
    for i in range(3):  # three 15 MB pieces: with the logs, 45 MB of the call's 64 MiB
        (w / "ret" / f"regen.jsonl.xz.part0{i}").write_bytes(os.urandom(1000) * 15_000)
    (w / "ret" / "regen.sha256").write_text("0" * 64 + "  /tmp/swacache/data/regenerated/x.jsonl\n")
    export = w / "run" / "export"
    export.mkdir(parents=True)
    save_file({"model.embed_tokens.weight": torch.randn(256, 2048), "layers.0.weight": torch.randn(4096, 2048),
               "fc.weight": torch.randn(1024, 2048), "d2t": torch.arange(16)}, str(export / "model.safetensors"))
    (export / "config.json").write_text("{}\n")
    (w / "eval_mtbench_k16n384d16").mkdir()
    (w / "eval_mtbench_k16n384d16" / "summary.md").write_text("| τ |\n")
    return w


def _progress_call(w: Path, out: Path, shim: Path) -> list[Path]:
    out.mkdir()
    env = {**os.environ, "SM_DIR": str(w), "OUT": str(out), "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(["bash", str(PROGRESS), "0"], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    files = sorted(p for p in out.rglob("*") if p.is_file())
    assert len(files) <= MAX_FILES, files
    assert all(p.stat().st_size <= MAX_FILE_BYTES for p in files), [(p.name, p.stat().st_size) for p in files]
    assert sum(p.stat().st_size for p in files) <= MAX_TOTAL_BYTES
    assert all(len(p.relative_to(out).parts) <= 2 for p in files)  # "no more than 2 folders down"
    return files


@pytest.fixture
def python3_shim(tmp_path: Path) -> Path:
    """progress.sh runs ``python3`` (the lease image's); here that must be this interpreter, with safetensors."""
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (shim / "python3").chmod(stat.S_IRWXU)
    return shim


def test_progress_returns_the_regenerated_file_first_then_the_drafter(tmp_path: Path, python3_shim: Path) -> None:
    w = _lease_folder(tmp_path, all_done=True)
    first = {p.name for p in _progress_call(w, tmp_path / "out1", python3_shim)}
    assert first == {"logs.tgz", "regen.jsonl.xz.part00", "regen.jsonl.xz.part01", "regen.jsonl.xz.part02", "regen.sha256"}

    second_files = _progress_call(w, tmp_path / "out2", python3_shim)
    second = {p.name for p in second_files}
    assert not any(name.startswith("regen") for name in second)  # returned once, not again
    assert {"logs.tgz", "evals.tgz", "drafter_config.json"} <= second
    pieces = sorted(p for p in second_files if p.name.startswith("drafter_noembed.safetensors.part"))
    assert len(pieces) == 2  # 20 MB of bf16: over one piece's 15 MB
    whole = tmp_path / "drafter_noembed.safetensors"
    whole.write_bytes(b"".join(p.read_bytes() for p in pieces))
    drafter = load_file(str(whole))
    original = load_file(str(w / "run" / "export" / "model.safetensors"))
    assert set(drafter) == set(original) - {"model.embed_tokens.weight"}
    assert drafter["layers.0.weight"].dtype == torch.bfloat16 and drafter["d2t"].dtype == torch.int64
    torch.testing.assert_close(drafter["layers.0.weight"], original["layers.0.weight"].bfloat16(), rtol=0, atol=0)


def test_progress_before_the_end_returns_the_regenerated_file_and_no_drafter(tmp_path: Path, python3_shim: Path) -> None:
    w = _lease_folder(tmp_path, all_done=False)
    names = {p.name for p in _progress_call(w, tmp_path / "out1", python3_shim)}
    assert "regen.sha256" in names and not any(n.startswith("drafter") for n in names)
    names = {p.name for p in _progress_call(w, tmp_path / "out2", python3_shim)}
    assert names == {"logs.tgz"}  # not done: nothing more until "all done"


@pytest.mark.parametrize("layout", ["ours", "speculators"])
def test_rebuilt_drafter_is_the_exported_one_in_bf16_with_the_target_embedding(tmp_path: Path, python3_shim: Path,
                                                                               tiny_llama3_path: str, layout: str) -> None:
    """What a lease returns (progress.sh: no embedding, bf16, pieces) rebuilt by rebuild_drafter.py loads through the
    loop's own loader with every weight the export's in bf16 and the target's embedding back: the trainer's own layout,
    and vLLM speculators' (what pipeline.sh's time-limit fallback exports an EAGLE-3 checkpoint as)."""
    import json

    from infer.loading import load_drafter_model, read_drafter_config
    from models.eagle3 import Eagle3DraftModel, build_draft_vocab, make_eagle3_config
    from models.target import TargetModel

    target = TargetModel.from_pretrained(tiny_llama3_path, dtype="float32")
    config = make_eagle3_config(target.model.config, num_hidden_layers=2, target_layer_ids=[0, 1, 2],
                                layer_types=["sliding_attention", "sliding_attention"], sliding_window=64,
                                draft_vocab_size=128, ttt_length=3)
    torch.manual_seed(0)
    drafter = Eagle3DraftModel(config)
    drafter.embed_tokens.weight.data.copy_(target.model.get_input_embeddings().weight)
    drafter.set_draft_vocab(*build_draft_vocab({i: 1000 - i for i in range(300)}, config.vocab_size, 128))
    w = _lease_folder(tmp_path, all_done=True)
    export = w / "run" / "export"
    drafter.save_pretrained(export)  # the trainer's layout: config.json, model.safetensors
    if layout == "speculators":
        from train.export import main as export_main

        assert export_main([str(export), str(tmp_path / "spec"), "--format", "speculators", "--target", tiny_llama3_path]) == 0
        for f in export.iterdir():
            f.unlink()
        for f in (tmp_path / "spec").iterdir():
            f.rename(export / f.name)
    _progress_call(w, tmp_path / "out1", python3_shim)  # the regenerated file first
    returned = tmp_path / "out2"
    _progress_call(w, returned, python3_shim)
    assert "embed_tokens.weight" not in load_file(str(next(returned.glob("drafter_noembed.safetensors.part*"))))

    out = rebuild_drafter.rebuild(returned, tmp_path / "rebuilt", tiny_llama3_path)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("rebuilt")) == ["rebuilt"]  # no .partial left
    loaded = load_drafter_model(out, read_drafter_config(out), torch.float32)
    original = drafter.state_dict()
    assert set(loaded.state_dict()) == set(original)
    for name, tensor in loaded.state_dict().items():
        want = original[name].bfloat16().to(tensor.dtype) if tensor.is_floating_point() else original[name]
        torch.testing.assert_close(tensor, want, rtol=0, atol=0, msg=name)
    assert json.loads((out / "config.json").read_text()) == json.loads((export / "config.json").read_text())

    with pytest.raises(SystemExit, match="expected drafter_noembed.safetensors.part"):
        rebuild_drafter.rebuild(tmp_path / "out1", tmp_path / "again", tiny_llama3_path)  # the first call's files: no drafter
    assert not (tmp_path / "again").exists()


def test_rebuilt_dflash_drafter_is_the_exported_one_in_bf16(tmp_path: Path, python3_shim: Path, tiny_llama3_path: str) -> None:
    """A DFlash drafter's file holds no embedding: rebuilt, it is the export's weights in bf16, loaded by the loop's
    loader, and nothing of the target's is added."""
    from infer.loading import load_drafter_model, read_drafter_config
    from models.dflash import DFlashDraftModel, make_dflash_config
    from models.target import TargetModel

    target = TargetModel.from_pretrained(tiny_llama3_path, dtype="float32")
    config = make_dflash_config(target.model.config, num_hidden_layers=1, block_size=8, mask_token_id=3,
                                target_layer_ids=[1], layer_types=["sliding_attention"], sliding_window=64)
    torch.manual_seed(0)
    drafter = DFlashDraftModel(config)
    w = _lease_folder(tmp_path, all_done=True)
    drafter.save_pretrained(w / "run" / "export")
    _progress_call(w, tmp_path / "out1", python3_shim)
    _progress_call(w, tmp_path / "out2", python3_shim)

    out = rebuild_drafter.rebuild(tmp_path / "out2", tmp_path / "rebuilt", "builtin:no-such-target")  # the target is not read
    loaded = load_drafter_model(out, read_drafter_config(out), torch.float32).state_dict()
    original = drafter.state_dict()
    assert set(loaded) == set(original)
    for name, tensor in loaded.items():
        torch.testing.assert_close(tensor, original[name].bfloat16().float(), rtol=0, atol=0, msg=name)
