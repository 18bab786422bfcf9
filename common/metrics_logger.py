"""Metrics sink: the log file always, Weights & Biases when ``logger.wandb`` is on."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def has_wandb_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    return netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore")


class MetricsLogger:
    """Writes ``metrics.jsonl`` in the run folder and mirrors every record to W&B if enabled.
    ``enabled=False`` (every rank but 0 of a multi-GPU run) writes nothing anywhere."""

    def __init__(self, logger_cfg: Any, run_config: dict[str, Any], output_dir: Path, enabled: bool = True):
        self.path = output_dir / "metrics.jsonl"
        self.enabled = enabled
        self.run = None
        if enabled and logger_cfg.wandb and logger_cfg.mode != "disabled":
            import wandb

            mode = logger_cfg.mode
            if mode == "auto":
                mode = "online" if has_wandb_key() else "offline"
            self.run = wandb.init(
                project=logger_cfg.project, name=logger_cfg.name, mode=mode, config=run_config, dir=str(output_dir),
            )
            log.info("W&B %s run in %s", mode, self.run.dir)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        if self.run is not None:
            self.run.log(metrics, step=step)

    def summary(self, metrics: dict[str, Any]) -> None:
        if self.run is not None:
            self.run.summary.update(metrics)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
