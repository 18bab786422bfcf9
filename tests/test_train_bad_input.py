"""Bad input to ``python -m train`` and its helpers: one line naming what is wrong, a non-zero exit, nothing written that
looks complete (a run folder that is empty, cannot be made or already holds a run; an export folder that is a file)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from compose import compose_train

from train.trainer import train

REPO = Path(__file__).resolve().parents[1]
# a few steps on the tiny target, no regeneration, no loop: seconds
TINY = ["experiment=dflash_swa_tiny", "trainer.progress=false", "trainer.log_every=1", "trainer.eval_every=0",
        "trainer.loop_eval_prompts=0", "data.regenerate.enabled=false", "data.max_records=40", "data.num_eval=0",
        "trainer.checkpoint_every=1", "trainer.export_formats=[]"]


def cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "train", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_resume_never_into_a_folder_that_holds_a_run_is_refused(tmp_path: Path) -> None:
    """``trainer.resume=never`` into a finished run's folder trained afresh there: keep=2 pruned the new run's early
    checkpoints while the old run's newer ones stayed (the next resume continued the old run), the old export and
    run.json looked complete meanwhile and metrics.jsonl took both runs' steps. Now one line naming the folder, before
    anything is written (and before Hydra rewrites its .hydra); an empty folder still starts fresh."""
    run = tmp_path / "run"
    run.mkdir()
    common = TINY + ["trainer.max_steps=3", "trainer.resume=never", f"output_dir={run}"]
    assert train(compose_train(common))["steps"] == 3  # a new, empty folder: the fresh start it asks for
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and ".hydra" not in p.parts}
    assert {"run.json", "metrics.jsonl"} <= {p.name for p in before}
    with pytest.raises(ValueError) as err:
        train(compose_train(common))
    assert str(err.value) == (f"trainer.resume=never: output_dir={str(run)!r} already holds a run (checkpoints/, export/, run.json); "
                              "choose another output_dir to start over, or remove that folder first")
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and ".hydra" not in p.parts} == before
    (run / ".hydra").mkdir(exist_ok=True)
    (run / ".hydra" / "config.yaml").write_text("the run's own\n")
    proc = cli(TINY + ["trainer.resume=never", f"output_dir={run}"], tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == f"error: {err.value}"
    assert (run / ".hydra" / "config.yaml").read_text() == "the run's own\n"
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and ".hydra" not in p.parts} == before


@pytest.mark.parametrize("value", ["", "''"])
def test_an_empty_output_dir_is_refused_in_one_line(tmp_path: Path, value: str) -> None:
    """``output_dir=`` trained into the current folder (checkpoints/, export/, metrics.jsonl, .hydra there; exit 0)."""
    proc = cli(TINY + ["trainer.max_steps=1", f"output_dir={value}"], tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == f"output_dir={value!r}: empty; expected a folder for the run (new, or a run's to resume)"
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match=r"^output_dir='': empty; expected a folder"):  # train(cfg) too
        train(compose_train(TINY + ["trainer.max_steps=1", "output_dir="]))


@pytest.mark.parametrize("out", ["/proc/swa-train-run", "/proc/swa-train-run/inner"])
def test_an_output_dir_that_cannot_be_made_is_refused_in_one_line(tmp_path: Path, out: str) -> None:
    """Hydra makes the run folder before the config is checked: under /proc (or a read-only folder) its
    FileNotFoundError / PermissionError traceback. /proc refuses new files to root too."""
    proc = cli(TINY + ["trainer.max_steps=1", f"output_dir={out}"], tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().startswith(f"output_dir={out!r}: nothing can be written in /proc (")
    assert proc.stderr.strip().endswith("; expected a folder the run can be written to") and "\n" not in proc.stderr.strip()


@pytest.mark.parametrize("where", ["file", "under_file", "proc"])
def test_speculators_export_out_that_cannot_be_a_folder_is_one_line(tmp_path: Path, where: str, monkeypatch, capsys) -> None:
    """``python -m train.data.speculators_export rows OUT``: OUT a file (or under one, or under /proc) was a FileExistsError
    traceback at the first write, after the target loaded and the data was tokenised. Now one line first."""
    import models.target as target_module
    from train.data.speculators_export import main

    def no_load(*a, **k):
        raise AssertionError("the target was loaded before OUT was checked")

    monkeypatch.setattr(target_module.TargetModel, "from_pretrained", no_load)
    file = tmp_path / "rows.txt"
    file.write_text("x")
    out = {"file": file, "under_file": file / "export", "proc": Path("/proc/swa-export")}[where]
    assert main(["rows", str(out), "experiment=dflash_swa_tiny", "data.regenerate.enabled=false"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    if where == "proc":
        assert err.startswith(f"error: OUT {out}: nothing can be written in /proc (") and err.endswith("expected an export folder that can be written")
    else:
        assert err == f"error: OUT {out}: {file} is a file; expected an export folder (new, or the one `rows` wrote)"
    assert file.read_text() == "x"
    assert main(["hidden-states", str(file), "experiment=dflash_swa_tiny"]) == 2
    assert capsys.readouterr().err.strip() == f"error: OUT {file}: {file} is a file; expected an export folder (new, or the one `rows` wrote)"


def test_a_resume_after_a_kill_logs_each_step_once(tmp_path: Path) -> None:
    """A kill after step 3 was logged but before it was saved: the resume from step 2 logged steps 3.. again after the
    killed run's, so metrics.jsonl read 1, 2, 3, 3, 4, 5 (and W&B refused the steps that went back). The resume drops
    the records after its checkpoint first."""
    common = TINY + ["trainer.max_steps=5", "trainer.checkpoint_every=2", "trainer.keep_checkpoints=0", f"output_dir={tmp_path}"]
    train(compose_train(common + ["trainer.interrupt_after=3"]))
    steps = lambda: [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    assert steps() == [1, 2, 3]
    shutil.rmtree(tmp_path / "checkpoints" / "step_00000003")  # killed before step 3's save: the newest is step 2's
    assert train(compose_train(common))["steps"] == 5
    assert steps() == [1, 2, 3, 4, 5]
    record = json.loads((tmp_path / "run.json").read_text())
    assert [h["step"] for h in record["history"]] == [1, 2, 3, 4, 5]


def test_a_data_cache_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    """A cache folder nothing can be written in (a read-only mount; here a path under a file, as root writes anywhere) was
    OSError's traceback from the first lock or cache file; now one line naming the setting, exit 2, no run folder left."""
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    run = tmp_path / "run"
    out = cli(TINY + ["trainer.max_steps=1", f"data.cache_dir={blocker}/data", f"output_dir={run}"], REPO)
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [line for line in (out.stdout + out.stderr).splitlines() if "ERROR" in line]
    assert len(errors) == 1 and "data.cache_dir=" in errors[0] and "SWA_DRAFTERS_CACHE" in errors[0], out.stderr[-2000:]
    assert "Traceback" not in out.stderr and "Loading weights" not in out.stderr and not run.exists()  # before the target


def test_token_ids_that_do_not_spell_their_turns_are_warned_about(tmp_path: Path, caplog) -> None:
    """A messages file whose assistant turns carry ids of another tokenizer: those turns are tokenized from their text (the
    README's rule) and the run says so in a warning, not only in the tokenize summary's counts."""
    import logging

    path = tmp_path / "mine.jsonl"
    rows = [{"id": str(i), "messages": [{"role": "user", "content": f"question {i}"},
                                        {"role": "assistant", "content": f"answer {i}", "token_ids": [7, 8, 9]}]} for i in range(6)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with caplog.at_level(logging.WARNING, logger="train.data.dataset"):
        train(compose_train(TINY + ["trainer.max_steps=1", f"data.path={path}", f"output_dir={tmp_path / 'run'}",
                                    f"data.cache_dir={tmp_path / 'cache'}"]))
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "token_ids" in r.getMessage()]
    assert len(warned) == 1 and "6 of 6 assistant turns' token_ids do not spell their text" in warned[0], warned
