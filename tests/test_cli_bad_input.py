"""Bad input found by trying the CLIs as a user would (2026-12-05): each was a traceback, a silent wrong run, or an
error naming the wrong thing; each is now one line naming the flag, file or field, before anything heavy runs."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from models.dflash import DFlashDraftModel, make_dflash_config

pytestmark = pytest.mark.usefixtures("single_cpu_thread")

UNWRITABLE = "/proc/swa-drafters-test/out"  # no one, root included, can make a folder or file under /proc


def last_line(capsys) -> str:
    """stderr's last line (progress bars end theirs with carriage returns before it): the one-line error."""
    return capsys.readouterr().err.strip().splitlines()[-1].split("\r")[-1]


def dflash_export(target_path: str, folder: Path, **config_edits) -> Path:
    config = make_dflash_config(AutoConfig.from_pretrained(target_path), num_hidden_layers=1, block_size=4, mask_token_id=3,
                                target_layer_ids=[1, 3], layer_types=["sliding_attention"], sliding_window=16)
    torch.manual_seed(0)
    DFlashDraftModel(config).save_pretrained(folder)
    if config_edits:
        raw = json.loads((folder / "config.json").read_text())
        for key, value in config_edits.items():
            (raw["dflash_config"] if key.startswith("dflash_config.") else raw)[key.removeprefix("dflash_config.")] = value
        (folder / "config.json").write_text(json.dumps(raw))
    return folder


def test_a_corrupt_target_folder_is_one_line(tiny_qwen3_path, tmp_path, capsys) -> None:
    """A truncated weights file, a config.json short of a size or with a size of the wrong type: a safetensors error, a
    RuntimeError about ignore_mismatched_sizes, a strict-dataclass traceback; now one line naming --target."""
    from infer.__main__ import main

    cases = {}
    for name in ("truncated", "no_hidden", "str_hidden"):
        cases[name] = tmp_path / name
        shutil.copytree(tiny_qwen3_path, cases[name])
    weights = cases["truncated"] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:4000])
    for name, edit in (("no_hidden", lambda c: c.pop("hidden_size")), ("str_hidden", lambda c: c.update(hidden_size="512"))):
        config = json.loads((cases[name] / "config.json").read_text())
        edit(config)
        (cases[name] / "config.json").write_text(json.dumps(config))
    for folder in cases.values():
        assert main(["--target", str(folder), "--drafter", "pld", "--prompt", "hi", "--max-new-tokens", "2"]) == 2
        err = last_line(capsys)
        assert err.startswith(f"error: --target={str(folder)!r}: cannot load a causal LM and tokenizer there")


def test_drafter_configs_the_target_cannot_feed_are_one_line(tiny_qwen3_path, tmp_path) -> None:
    """Repeated target layer ids (a shape error after the prefill) and a DFlash mask token outside the target's vocabulary
    (an index error at the first draft) are refused at load."""
    from infer.loading import load_models, read_drafter_config

    repeated = dflash_export(tiny_qwen3_path, tmp_path / "repeated", **{"dflash_config.target_layer_ids": [1, 1]})
    with pytest.raises(ValueError, match=r"dflash_config\.target_layer_ids=\[1, 1\]; expected distinct target layer ids"):
        read_drafter_config(repeated)
    vocab = AutoConfig.from_pretrained(tiny_qwen3_path).vocab_size
    wide = dflash_export(tiny_qwen3_path, tmp_path / "wide", vocab_size=vocab * 2, **{"dflash_config.mask_token_id": vocab + 5})
    with pytest.raises(ValueError, match=rf"dflash_config\.mask_token_id={vocab + 5}; expected a token id of the target's vocabulary "
                                         rf"\(0\.\.{vocab - 1}\)"):
        load_models(tiny_qwen3_path, str(wide))


def test_a_drafter_config_its_model_cannot_be_built_from_is_one_line(tiny_qwen3_path, tmp_path, capsys) -> None:
    """Found by review (2026-12-06's sixth session): an unknown rope_type or a size given as a string in an exported
    drafter's config.json was transformers' traceback (KeyError, a strict-dataclass error over two lines) in infer and
    eval; ``python -m train.export`` named it. Now one line naming the file, as the export does."""
    from infer.__main__ import main

    bad_rope = dflash_export(tiny_qwen3_path, tmp_path / "rope", rope_parameters={"rope_type": "bogus", "rope_theta": 1e6})
    bad_size = dflash_export(tiny_qwen3_path, tmp_path / "size", intermediate_size="big")
    for folder, why in ((bad_rope, "KeyError 'bogus'"), (bad_size, "Validation error for field 'intermediate_size': TypeError")):
        assert main(["--target", tiny_qwen3_path, "--drafter", str(folder), "--prompt", "hi", "--max-new-tokens", "2"]) == 2
        assert last_line(capsys).startswith(f"error: {folder}/config.json: the drafter's config does not build its model: {why}")


@pytest.mark.parametrize("flags,message", [
    (["--draft-steps", "0"], "--draft-steps 0: a DFlash chain verifies 1 .. 3 drafts"),
    (["--tree-topk", "0"], "--tree-topk 0; expected an int in 1 .."),
    (["--tree-lookup", "2"], "--tree-lookup 2: prompt lookup's branch joins a tree; give --tree-topk/--tree-tokens too"),
    (["--tree-redraft", "1"], "--tree-redraft 1: re-drafting grows a tree; give --tree-topk/--tree-tokens too"),
])
def test_drafting_options_are_refused_by_their_flags(tiny_qwen3_path, tmp_path, capsys, flags, message) -> None:
    """Found by review (2026-12-06's sixth session): the drafters' checks named their parameters (``draft_tokens=0``,
    ``tree topk=0``, ``tree_lookup=2``), not the flag the user typed."""
    from infer.__main__ import main

    drafter = dflash_export(tiny_qwen3_path, tmp_path / "drafter")
    assert main(["--target", tiny_qwen3_path, "--drafter", str(drafter), "--prompt", "hi", "--max-new-tokens", "2", *flags]) == 2
    assert last_line(capsys).startswith(f"error: {message}")


def test_flags_that_would_be_ignored_or_fail_late_are_refused_before_loading(tiny_qwen3_path, tmp_path) -> None:
    """--drafter-weights int8 with prompt lookup or no drafter, --draft-steps or --window with no drafter: ignored (rc 0,
    plain decoding); --backend flashinfer without the package or on the CPU: ModuleNotFoundError after the target loaded."""
    from infer.loading import load_models

    with pytest.raises(ValueError, match=r"--drafter-weights int8 quantizes a trained drafter's matrices; prompt lookup has none"):
        load_models("never-loaded", "pld", drafter_weights="int8")
    with pytest.raises(ValueError, match=r"--drafter-weights int8 .*no --drafter was given"):
        load_models("never-loaded", None, drafter_weights="int8")
    with pytest.raises(ValueError, match=r"--draft-steps sets a drafter's drafting; no --drafter was given"):
        load_models("never-loaded", None, draft_steps=3)
    with pytest.raises(ValueError, match=r"--window sets a drafter's drafting; no --drafter was given"):
        load_models("never-loaded", None, window=5)
    from infer.loading import check_backend

    with pytest.raises(ValueError, match=r"--backend flashinfer"):  # not installed here, or installed and the device a CPU
        check_backend("flashinfer", "cpu")
    check_backend("sdpa", "cpu")


def test_unwritable_outputs_are_refused_before_the_work(tiny_qwen3_path, tmp_path, capsys) -> None:
    """An output that cannot be made: infer decoded, then failed writing --json; eval loaded the models, then failed
    making --out; the export built and checked the drafter, then failed in the rename. Each with a traceback."""
    from eval.__main__ import main as eval_main
    from infer.__main__ import main as infer_main
    from train.export import main as export_main

    assert infer_main(["--target", tiny_qwen3_path, "--drafter", "pld", "--prompt", "hi", "--max-new-tokens", "2",
                       "--json", UNWRITABLE + ".json"]) == 2
    assert last_line(capsys).startswith(f"error: --json {UNWRITABLE}.json: nothing can be written in /proc")
    assert eval_main(["mtbench", "--target", tiny_qwen3_path, "--drafter", "pld", "--num-questions", "1", "--max-new-tokens", "2",
                      "--out", UNWRITABLE]) == 2
    assert last_line(capsys).startswith(f"error: --out {UNWRITABLE}: nothing can be written in /proc")
    export = dflash_export(tiny_qwen3_path, tmp_path / "export")
    assert export_main([str(export), UNWRITABLE]) == 2
    assert last_line(capsys).startswith(f"error: {UNWRITABLE}: nothing can be written in /proc")
    out = tmp_path / "fi"  # --backend flashinfer on this CPU: refused before eval writes its settings.json
    assert eval_main(["mtbench", "--target", tiny_qwen3_path, "--drafter", "pld", "--backend", "flashinfer", "--out", str(out)]) == 2
    assert "--backend flashinfer" in last_line(capsys) and not out.exists()


def test_eval_reads_one_drafter_however_its_path_is_spelled(tmp_path, monkeypatch) -> None:
    """``run_df``, ``run_df/``, ``./run_df`` and its absolute path: one results folder (four before), so a rerun resumes."""
    from eval.__main__ import default_out, with_local_paths_resolved

    (tmp_path / "run_df").mkdir()
    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(command="mtbench", num_questions=1, window="trained")
    spellings = ["run_df", "run_df/", "./run_df", str(tmp_path / "run_df")]
    outs = {default_out(args, with_local_paths_resolved({"target": "builtin:tiny-qwen3", "drafter": d})) for d in spellings}
    assert len(outs) == 1 and next(iter(outs)).name.startswith("run_df-")
    assert with_local_paths_resolved({"drafter": "pld", "target": "owner/name"}) == {"drafter": "pld", "target": "owner/name"}


def test_eval_refuses_more_questions_than_there_are(tmp_path) -> None:
    """--num-questions 500 ran MT-Bench's 80 and recorded 500; a prompts file of 2 records ran 2 for 50."""
    from eval.__main__ import conversations_for

    with pytest.raises(ValueError, match=r"--num-questions 500; MT-Bench has 80 questions"):
        conversations_for(argparse.Namespace(num_questions=500, prompts=None))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    with pytest.raises(ValueError, match=rf"--num-questions 50; {prompts} has 2 records"):
        conversations_for(argparse.Namespace(num_questions=50, prompts=str(prompts)))
    assert len(conversations_for(argparse.Namespace(num_questions=80, prompts=None))) == 80
    assert len(conversations_for(argparse.Namespace(num_questions=None, prompts=str(prompts)))) == 2


def test_a_moved_run_folder_finds_its_own_export(tmp_path) -> None:
    """A run copied or moved elsewhere: run.json's absolute export path points at the old place; its own export/ is read
    (was: "the run has no export")."""
    from infer.loading import resolve_run

    run = tmp_path / "moved"
    (run / "export").mkdir(parents=True)
    (run / "export" / "config.json").write_text("{}")
    (run / "run.json").write_text(json.dumps({"target": {"path": "builtin:tiny-qwen3"}, "export": str(tmp_path / "gone" / "export")}))
    assert resolve_run(None, str(run)) == ("builtin:tiny-qwen3", str(run / "export"), str(run))
    (run / "run.json").write_text(json.dumps({"target": {"path": "builtin:tiny-qwen3"}, "export": None}))
    with pytest.raises(ValueError, match="the run has no export"):  # trainer.export=false: its export/ is not read
        resolve_run(None, str(run))


def test_a_copied_run_folder_never_reads_the_originals_export(tmp_path) -> None:
    """Found by review (2026-12-06's sixth session): a copy of a run folder whose original still exists read the
    original's drafter (run.json records the export's path where the run was written), so a copy with a broken or
    missing export decoded with exit 0 and eval recorded the other drafter. The copy's own export is read, or refused."""
    from infer.loading import resolve_run

    original, copy = tmp_path / "original", tmp_path / "copy"
    for run in (original, copy):
        (run / "export").mkdir(parents=True)
        (run / "export" / "config.json").write_text("{}")
        (run / "run.json").write_text(json.dumps({"target": {"path": "builtin:tiny-qwen3"}, "export": str(original / "export")}))
    assert resolve_run(None, str(copy))[1] == str(copy / "export")
    (copy / "export" / "config.json").unlink()  # an interrupted copy: refused, not decoded with the original's drafter
    with pytest.raises(ValueError, match=rf"{copy}/run.json: the run has no export \(export='{copy}/export'"):
        resolve_run(None, str(copy))
    relative = tmp_path / "relative"  # the default output_dir is relative to the directory the run started in
    (relative / "export").mkdir(parents=True)
    (relative / "export" / "config.json").write_text("{}")
    (relative / "run.json").write_text(json.dumps({"target": {"path": "T"}, "export": "outputs/dflash_swa_tiny/x/export"}))
    assert resolve_run(None, str(relative)) == ("T", str(relative / "export"), str(relative))
    from eval.__main__ import latest_run  # eval with no --drafter: the newest run under --runs-dir, its own export too

    (copy / "export" / "config.json").write_text("{}")
    __import__("os").utime(copy / "run.json", (2e9, 2e9))  # the newest
    assert latest_run(tmp_path) == {"target": "builtin:tiny-qwen3", "drafter": str(copy / "export"), "run": str(copy)}


def test_a_target_other_than_the_runs_is_named(tmp_path) -> None:
    """--target naming another model than the one the run was trained on loaded without a word when the shapes matched
    (the drafter then reads features it never saw). The recorded folder, a copy of it, or the recorded name pass."""
    from infer.loading import recorded_target_warning

    trained, copy, other = tmp_path / "trained", tmp_path / "copy", tmp_path / "other"
    for folder, config, weights in ((trained, '{"hidden_size": 64}', b"x" * 10), (copy, '{"hidden_size": 64}', b"y" * 10),
                                    (other, '{"hidden_size": 64}', b"x" * 12)):
        folder.mkdir()
        (folder / "config.json").write_text(config)
        (folder / "model.safetensors").write_bytes(weights)
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"target": {"path": "targets/trained", "resolved_path": str(trained)}}))
    assert recorded_target_warning(None, str(run)) is None  # the recorded target is used
    assert recorded_target_warning("targets/trained", str(run)) is None  # the recorded name
    assert recorded_target_warning(str(trained), str(run)) is None
    assert recorded_target_warning(str(tmp_path / "." / "trained"), str(run)) is None  # another spelling of the path
    assert recorded_target_warning(str(copy), str(run)) is None  # a copy: same config, same files and sizes
    assert recorded_target_warning(str(other), str(run)) == (
        f"warning: --target {other} is not the target the run {run} was trained on (targets/trained); the drafter reads its "
        "hidden states, so τ measures a drafter on features it was not trained with")
    (other / "model.safetensors").write_bytes(b"x" * 10)
    (other / "config.json").write_text('{"hidden_size": 64, "num_hidden_layers": 3}')  # same files and sizes, another config
    assert recorded_target_warning(str(other), str(run)) is not None
    assert recorded_target_warning("builtin:tiny-llama3", str(run)) is not None
    assert recorded_target_warning(str(other), None) is None  # an export folder records no target
    (run / "run.json").write_text(json.dumps({"target": {"path": "builtin:tiny-qwen3"}}))  # a builtin recorded by name only
    from models.builtin_targets import resolve_target_path

    assert recorded_target_warning(resolve_target_path("builtin:tiny-qwen3"), str(run)) is None
    assert recorded_target_warning("builtin:tiny-llama3", str(run)) is not None


def test_other_one_liners(tmp_path) -> None:
    """A builtin target given to the export (read as a malformed hub id), a tokenizer without a chat template
    (transformers' message named neither), a --server that is no URL ("unknown url type")."""
    from eval.engines import check_engine_args
    from infer.prompts import chat_ids
    from train.export import export_target_path

    with pytest.raises(ValueError, match=r"--target='builtin:nosuch': unknown builtin target"):
        export_target_path("builtin:nosuch", None)
    assert export_target_path(None, {"target": {"resolved_path": "/x"}}) == "/x"

    class NoTemplate:
        chat_template = None
        name_or_path = "/targets/base-model"

    with pytest.raises(ValueError, match=r"the target's tokenizer \(/targets/base-model\) has no chat template"):
        chat_ids(NoTemplate(), [{"role": "user", "content": "hi"}])
    args = argparse.Namespace(server="notaurl", engine="ours", command="mtbench", temperature=0.0)
    with pytest.raises(ValueError, match=r"--server 'notaurl'; expected the server's base URL, http\(s\)://HOST:PORT"):
        check_engine_args(args, ["trained"])
