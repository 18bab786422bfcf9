"""Resume's edges: a checkpoint at or past a lowered ``trainer.max_steps`` (it exported or kept the run as if finished,
exit 0), the learning-rate schedule's settings changed at a resume (the rate jumped to another curve mid-run, silently),
and checkpoints fsynced before their rename (a crash of the machine could leave a renamed ``step_*`` folder with an empty
``state.pt``)."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from compose import compose_train

from train.checkpoint import Checkpointer, save_checkpoint, save_deepspeed_checkpoint
from train.trainer import train

REPO = Path(__file__).resolve().parents[1]
# a few steps of a second on the tiny target: no regeneration, no loop, no eval, no engine export
TINY = ["experiment=dflash_swa_tiny", "trainer.progress=false", "trainer.log_every=1", "trainer.eval_every=0",
        "trainer.loop_eval_prompts=0", "data.regenerate.enabled=false", "data.max_records=40", "data.max_length=256",
        "data.num_eval=0", "trainer.checkpoint_every=1", "trainer.export_formats=[]"]


def files(run: Path) -> dict[Path, bytes]:
    """What a run folder holds (Hydra's own .hydra and job log aside), byte for byte."""
    return {p: p.read_bytes() for p in sorted(run.rglob("*"))
            if p.is_file() and ".hydra" not in p.parts and p.name != "__main__.log"}


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run to 4 steps stopped after step 3 (checkpoints step_2 and step_3, run.json marked interrupted)."""
    run = tmp_path_factory.mktemp("stopped") / "run"
    metrics = train(compose_train(TINY + ["trainer.max_steps=4", "trainer.interrupt_after=3", f"output_dir={run}"]))
    assert metrics["interrupted"] and metrics["steps"] == 3
    return run


@pytest.fixture
def run_copy(stopped_run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(stopped_run, copy)
    return copy


# ----------------------------------------------------------------------------- 1. max_steps at or below the checkpoint

@pytest.mark.parametrize("lowered", [2, 3])
def test_a_resume_at_or_past_a_lowered_max_steps_is_refused_in_one_line(run_copy: Path, lowered: int) -> None:
    """Stopped at step 3 of 4, resumed with max_steps=2 (past it) or 3 (at it): the loop trained nothing and the run
    exported step 3's weights as finished. Refused in one line naming the checkpoint, its step, this max_steps and what
    to do; nothing in the folder changes."""
    before = files(run_copy)
    with pytest.raises(ValueError) as err:
        train(compose_train(TINY + [f"trainer.max_steps={lowered}", f"output_dir={run_copy}"]))
    message = str(err.value)
    checkpoint = run_copy / "checkpoints" / "step_00000003"
    assert message == (f"trainer.resume: {checkpoint} is at step 3 of a run to 4 steps, and this run's trainer.max_steps={lowered} "
                       "leaves nothing to train from it (it would be exported or kept as it is, as if finished); expected "
                       "trainer.max_steps above 3 steps to train on from it, or a new run in another output_dir")
    assert files(run_copy) == before
    assert not (run_copy / "export").exists()


def test_a_deepspeed_checkpoint_is_named_as_such_before_its_step_count(run_copy: Path) -> None:
    """A checkpoint written under DeepSpeed, resumed without it and with a lowered max_steps: the refusal names the cause
    (DeepSpeed), not the step count that follows from it (a num_epochs run on another world size has other step counts)."""
    state_path = run_copy / "checkpoints" / "step_00000003" / "state.pt"
    state = torch.load(state_path, weights_only=False)
    torch.save({**state, "deepspeed": True}, state_path)
    with pytest.raises(ValueError, match="was written under DeepSpeed; resume it with trainer.deepspeed set"):
        train(compose_train(TINY + ["trainer.max_steps=2", f"output_dir={run_copy}"]))


def test_the_cli_refuses_a_lowered_max_steps_with_a_nonzero_exit(run_copy: Path) -> None:
    before = files(run_copy)
    proc = subprocess.run([sys.executable, "-m", "train", *TINY, "trainer.max_steps=2", f"output_dir={run_copy}"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr + proc.stdout, proc.stderr + proc.stdout
    errors = [line for line in proc.stdout.splitlines() if "[ERROR]" in line]  # Hydra's job log (stdout)
    assert len(errors) == 1, proc.stdout
    assert errors[0].endswith(f"trainer.resume: {run_copy / 'checkpoints' / 'step_00000003'} is at step 3 of a run to 4 steps, "
                              "and this run's trainer.max_steps=2 leaves nothing to train from it (it would be exported or kept "
                              "as it is, as if finished); expected trainer.max_steps above 3 steps to train on from it, or a new "
                              "run in another output_dir"), errors[0]
    assert files(run_copy) == before and not (run_copy / "export").exists()


def test_a_raised_max_steps_extends_the_run_and_a_finished_run_rerun_is_kept(run_copy: Path, caplog) -> None:
    """Raising max_steps still resumes (how a run is extended), with a warning that the schedule is stretched; the same
    command again on the finished run (step == max_steps it was saved under) trains nothing and keeps its record."""
    with caplog.at_level(logging.WARNING, logger="train.checkpoint"):
        extended = train(compose_train(TINY + ["trainer.max_steps=5", f"output_dir={run_copy}"]))
    assert extended["steps"] == 5 and not extended["interrupted"] and (run_copy / "export").is_dir()
    assert "was trained towards 4 steps, this run's trainer.max_steps=5" in caplog.text
    before = files(run_copy)
    again = train(compose_train(TINY + ["trainer.max_steps=5", f"output_dir={run_copy}"]))
    assert again == extended and files(run_copy) == before


def test_a_checkpoint_without_a_recorded_max_steps_is_checked_by_its_step(tmp_path: Path) -> None:
    """Checkpoints saved before max_steps was recorded: at max_steps, the finished run's rerun (kept); past it, refused."""
    checkpointer = Checkpointer(tmp_path, None, None, None, None, max_steps=3)
    checkpointer.check_steps_left(tmp_path / "step_00000003", {"train_state": {"step": 3}})
    with pytest.raises(ValueError, match=r"step_00000004 is at step 4, and this run's trainer.max_steps=3 leaves nothing"):
        checkpointer.check_steps_left(tmp_path / "step_00000004", {"train_state": {"step": 4}})
    epochs = Checkpointer(tmp_path, None, None, None, None, max_steps=3, max_steps_setting="trainer.num_epochs=1.5 (3 steps)")
    with pytest.raises(ValueError, match=r"this run's trainer.num_epochs=1.5 \(3 steps\) leaves nothing .* expected "
                                         r"trainer.num_epochs \(and trainer.max_steps, if set\) above 4 steps"):
        epochs.check_steps_left(tmp_path / "step_00000004", {"train_state": {"step": 4}, "max_steps": 6})


# ----------------------------------------------------------------------------- 2. the schedule's settings at resume

@pytest.mark.parametrize("changed,named", [
    ("trainer.warmup_ratio=0.5", "trainer.warmup_ratio 0.04 there, 0.5 here"),
    ("trainer.min_lr_ratio=0.1", "trainer.min_lr_ratio 0.0 there, 0.1 here"),
])
def test_a_resume_with_another_learning_rate_schedule_is_one_line(run_copy: Path, changed: str, named: str) -> None:
    """The schedule is this run's LambdaLR over the checkpoint's step: another warmup or floor moved the rate to another
    curve mid-run, silently. Refused like the other resume settings, naming the setting and both values."""
    before = files(run_copy)
    with pytest.raises(ValueError, match="was trained with other settings") as err:
        train(compose_train(TINY + ["trainer.max_steps=4", changed, f"output_dir={run_copy}"]))
    assert named in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert str(run_copy / "checkpoints" / "step_00000003") in str(err.value)
    assert files(run_copy) == before and not (run_copy / "export").exists()


# ----------------------------------------------------------------------------- 3. fsync before the rename

def record_fsyncs_and_renames(monkeypatch) -> list[tuple]:
    """os.fsync (as the (device, inode) fsynced), os.replace and os.rename (source, target) in the order they ran; each
    still does its work."""
    events: list[tuple] = []
    real_fsync, real_replace, real_rename = os.fsync, os.replace, os.rename

    def fsync(fd):
        st = os.fstat(fd)
        events.append(("fsync", (st.st_dev, st.st_ino)))
        return real_fsync(fd)

    def replace(src, dst, *args, **kwargs):
        events.append(("rename", Path(src), Path(dst)))
        return real_replace(src, dst, *args, **kwargs)

    def rename(src, dst, *args, **kwargs):
        events.append(("rename", Path(src), Path(dst)))
        return real_rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "rename", rename)
    return events


def inode(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def assert_synced_around_the_rename(events: list[tuple], final: Path, inner: list[Path]) -> None:
    renames = [i for i, e in enumerate(events) if e[0] == "rename" and e[2] == final]
    assert len(renames) == 1, events
    at = renames[0]
    synced_before = {e[1] for e in events[:at] if e[0] == "fsync"}
    synced_after = {e[1] for e in events[at + 1:] if e[0] == "fsync"}
    for path in [*inner, final]:  # the renamed folder's files and the folder itself keep their inodes through the rename
        assert inode(path) in synced_before, f"{path} not fsynced before the rename: {events}"
    assert inode(final.parent) in synced_after, f"{final.parent} not fsynced after the rename: {events}"


def test_a_checkpoint_is_fsynced_before_its_rename(tmp_path: Path, monkeypatch) -> None:
    events = record_fsyncs_and_renames(monkeypatch)
    final = save_checkpoint(tmp_path, 3, {"train_state": {"step": 3}, "model": {"w": torch.ones(4)}}, keep=2)
    assert final == tmp_path / "checkpoints" / "step_00000003"
    assert_synced_around_the_rename(events, final, [final / "state.pt"])
    assert torch.load(final / "state.pt", weights_only=True)["train_state"] == {"step": 3}


def test_a_deepspeed_checkpoint_is_fsynced_before_its_rename(tmp_path: Path, monkeypatch) -> None:
    """Under DeepSpeed the engine writes its shards into the hidden folder, rank 0 adds state.pt and renames it: every file
    in it is fsynced first (one process here; the barriers are no-ops)."""
    import torch.distributed as dist

    monkeypatch.setattr(dist, "barrier", lambda *a, **k: None)

    class Engine:
        def save_checkpoint(self, root, tag, save_latest):
            (Path(root) / tag).mkdir(parents=True)
            torch.save({"module": {"w": torch.ones(2)}}, Path(root) / tag / "mp_rank_00_model_states.pt")
            torch.save({"optimizer": {}}, Path(root) / tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt")

    events = record_fsyncs_and_renames(monkeypatch)
    final = save_deepspeed_checkpoint(tmp_path, 2, Engine(), {"train_state": {"step": 2}}, keep=2, is_main=True)
    assert final == tmp_path / "checkpoints" / "step_00000002"
    assert_synced_around_the_rename(events, final, [final / "state.pt", final / "mp_rank_00_model_states.pt",
                                                    final / "zero_pp_rank_0_mp_rank_00_optim_states.pt"])


# ----------------------------------------------------------------------------- 4. the training rows at resume

def test_a_resume_on_other_rows_of_the_same_count_is_one_line(run_copy: Path, tmp_path: Path) -> None:
    """The data position (epoch, micro-batch) counts over the training rows in a seeded order: resumed on other rows of
    the same count (another data file; replies regenerated otherwise) it skipped or repeated conversations, silently, as
    only the count was compared. The rows' hash is compared too; the same rows still resume."""
    from train.data.dataset import resolve_source

    source = Path(resolve_source("builtin:sharegpt-sample")).read_text().splitlines()
    edited = tmp_path / "edited.jsonl"
    edited.write_text("\n".join([source[0].replace("Homogeneity", "Sameness")] + source[1:]) + "\n")  # one reply reworded
    before = files(run_copy)
    with pytest.raises(ValueError, match="was trained with other settings") as err:
        train(compose_train(TINY + ["trainer.max_steps=4", f"data.path={edited}", f"output_dir={run_copy}"]))
    assert "training rows' hash" in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert files(run_copy) == before
    metrics = train(compose_train(TINY + ["trainer.max_steps=4", f"output_dir={run_copy}"]))  # the same rows: resumed
    assert metrics["steps"] == 4 and not metrics["interrupted"]


# ----------------------------------------------------------------------------- 5. data settings, before the target loads

@pytest.mark.parametrize("changed,named", [
    ("data.max_records=30", "data.max_records 40 there, 30 here"),
    ("data.regenerate.enabled=true", "data.regenerate.enabled False there, True here"),
])
def test_a_resume_with_other_data_settings_is_refused_before_the_target_loads(run_copy: Path, monkeypatch, changed: str,
                                                                              named: str) -> None:
    """Another data.max_records or a regeneration at a resume: the rows' count or hash refused it only after the data was
    prepared again (a regeneration: minutes to hours with a real target). Refused now before the target loads, naming
    the setting; the folder unchanged."""
    import models.target

    def no_target(*args, **kwargs):
        raise AssertionError("the target was loaded before the resume's settings were compared")

    monkeypatch.setattr(models.target.TargetModel, "from_pretrained", no_target)
    before = files(run_copy)
    with pytest.raises(ValueError, match="was trained with other settings") as err:
        train(compose_train(TINY + ["trainer.max_steps=4", changed, f"output_dir={run_copy}"]))
    assert named in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert str(run_copy / "checkpoints" / "step_00000003") in str(err.value)
    assert files(run_copy) == before


def test_the_early_check_names_the_regeneration_field_and_leaves_greedy_sampling_settings_alone(tmp_path: Path) -> None:
    """The regeneration's settings are compared one field each (the message names the field, not the whole dict), and
    the sampling ones (seed, top_p, top_k) only when it samples: greedy replies do not depend on them."""
    from train.checkpoint import check_resume_early, resume_settings, save_checkpoint
    from train.config import to_train_config

    def config(*overrides):
        return to_train_config(compose_train(TINY[:5] + ["data.regenerate.enabled=true", *overrides, f"output_dir={tmp_path}"]))

    saved = config()
    state = {"train_state": {"step": 1}, "dataloader": {}, "rng": {}, "model": {}, "optimizer": {}, "lr_scheduler": {},
             "settings": resume_settings(saved.trainer, data_cfg=saved.data)}
    save_checkpoint(tmp_path, 1, state, keep=0)
    check_resume_early(config("data.regenerate.seed=7", "data.regenerate.top_k=5"))  # greedy: the same replies
    with pytest.raises(ValueError, match=r"other settings \(data.regenerate.max_new_tokens 128 there, 64 here\)"):
        check_resume_early(config("data.regenerate.max_new_tokens=64"))
    with pytest.raises(ValueError, match=r"data.regenerate.seed 0 there, 7 here"):  # sampled replies depend on the seed
        sampled = config("data.regenerate.temperature=0.7")
        state["settings"] = resume_settings(sampled.trainer, data_cfg=sampled.data)
        save_checkpoint(tmp_path, 2, state, keep=0)
        check_resume_early(config("data.regenerate.temperature=0.7", "data.regenerate.seed=7"))
    # a checkpoint torch cannot map (its legacy format) is read plainly, not refused
    torch.save(state, tmp_path / "checkpoints" / "step_00000002" / "state.pt", _use_new_zipfile_serialization=False)
    check_resume_early(config("data.regenerate.temperature=0.7"))
