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
