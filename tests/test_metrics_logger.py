"""The metrics sink: W&B offline runs of one run folder share an id (a resume continues the run it started), and `auto`
with a key but no network logs offline instead of ending the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.metrics_logger import MetricsLogger
from train.config import LoggerConfig

wandb = pytest.importorskip("wandb")


@pytest.mark.slow  # W&B offline starts (~5 s each)
def test_a_resumed_run_logs_into_the_wandb_run_it_started(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = LoggerConfig(wandb=True, mode="offline")
    ids = []
    for step in (1, 2):  # the first start, then a resume in the same folder
        logger = MetricsLogger(cfg, {"lr": 1e-3}, tmp_path)
        logger.log({"train/loss": 1.0 / step}, step)
        ids.append(logger.run.id)
        logger.finish()
    assert ids[0] == ids[1] == (tmp_path / "wandb_run_id").read_text().strip()
    runs = sorted(p.name for p in (tmp_path / "wandb").glob("offline-run-*"))
    assert runs and all(f"-{ids[0]}" in name for name in runs), runs  # two starts in one second: "...-ID-1"
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]


@pytest.mark.slow
def test_auto_with_a_key_but_no_network_logs_offline(tmp_path: Path, monkeypatch, caplog) -> None:
    """wandb.init online raises W&B's own CommError after its timeout where the network is unreachable (a cluster
    node): it stands in for that here, the offline start after it is W&B's real one."""
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    real_init, modes = wandb.init, []

    def init(*args, mode=None, **kwargs):
        modes.append(mode)
        if mode == "online":
            raise wandb.errors.CommError("Timed out while retrying: Post \"https://api.wandb.ai/graphql\": dial tcp: no route")
        return real_init(*args, mode=mode, **kwargs)

    monkeypatch.setattr(wandb, "init", init)
    with caplog.at_level("WARNING"):
        logger = MetricsLogger(LoggerConfig(wandb=True, mode="auto"), {}, tmp_path)
    assert modes == ["online", "offline"] and logger.run is not None
    assert "W&B online start failed (Timed out while retrying" in caplog.text and "logging offline instead" in caplog.text
    logger.finish()
    with pytest.raises(wandb.errors.CommError):  # an explicit mode=online is what the user asked: it still fails
        MetricsLogger(LoggerConfig(wandb=True, mode="online"), {}, tmp_path / "online")


def test_a_resume_drops_the_steps_after_its_checkpoint_and_wandb_gets_no_step_twice(tmp_path: Path) -> None:
    """A run killed after logging step 12, resumed from its step-10 checkpoint: the steps after 10 were appended again
    (1..12, 11, 12, ...) and W&B refused those that went back. The file keeps 1..10 (a line the kill cut is dropped), the
    resumed steps follow once, and W&B is sent only the steps it does not hold yet."""
    from common.metrics_logger import drop_metrics_after

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "train/loss": 1.0}) + "\n" for s in range(1, 13)) + '{"step": 13, "tr')
    sent = []

    class Run:  # W&B's run, as MetricsLogger calls it
        def log(self, metrics, step):
            sent.append(step)

    logger = MetricsLogger(LoggerConfig(wandb=False), {}, tmp_path)  # opened before the resume, as train.trainer.build does
    logger.run = Run()
    drop_metrics_after(tmp_path, 10)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == list(range(1, 11))
    assert not list(tmp_path.glob(".metrics.jsonl.*"))
    for step in (11, 12, 13):
        logger.log({"train/loss": 0.5}, step)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == list(range(1, 14))
    assert sent == [13]
    drop_metrics_after(tmp_path, 0)  # a fresh start in the folder of a run killed before its first checkpoint
    assert path.read_text() == ""
