"""Metrics sink: the log file always, Weights & Biases when ``logger.wandb`` is on."""

from __future__ import annotations

import json
import logging
import os
import secrets
import string
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def has_wandb_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    return netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore")


def wandb_run_id(output_dir: Path) -> str:
    """The run folder's W&B run id, made on its first start and kept in ``wandb_run_id`` (temp name, then rename)."""
    path = output_dir / "wandb_run_id"
    if path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))  # W&B's own id alphabet
    output_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(run_id + "\n")
    os.replace(tmp, path)
    return run_id


def record_step(line: str) -> int | None:
    """A ``metrics.jsonl`` line's step, or None for a line a kill cut short."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def logged_steps(path: Path) -> list[int]:
    """The steps of ``metrics.jsonl``'s records, in file order ([] without the file)."""
    lines = path.read_text().splitlines() if path.is_file() else []
    return [s for s in map(record_step, lines) if s is not None]


def logged_records(path: Path, through: int) -> list[dict[str, Any]]:
    """``metrics.jsonl``'s records up to step ``through``, in file order ([] without the file; lines a kill cut short
    skipped)."""
    records = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        if (step := record_step(line)) is not None and step <= through:
            records.append(json.loads(line))
    return records


def drop_metrics_after(output_dir: Path, step: int) -> None:
    """Keep only ``output_dir/metrics.jsonl``'s records up to ``step`` (the checkpoint a run resumes from; 0 = a fresh
    start): the steps after it are logged again, and were appended after the killed run's own. Temp name, then rename."""
    path = Path(output_dir) / "metrics.jsonl"
    if not path.is_file():
        return
    lines = path.read_text().splitlines(keepends=True)
    kept = [line for line in lines if (s := record_step(line)) is not None and s <= step]
    if kept == lines:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text("".join(line if line.endswith("\n") else line + "\n" for line in kept))
    os.replace(tmp, path)


class MetricsLogger:
    """Writes ``metrics.jsonl`` in the run folder and mirrors every record to W&B if enabled.
    ``enabled=False`` (every rank but 0 of a multi-GPU run) writes nothing anywhere."""

    def __init__(self, logger_cfg: Any, run_config: dict[str, Any], output_dir: Path, enabled: bool = True):
        self.path = output_dir / "metrics.jsonl"
        self.enabled = enabled
        self.run = None
        # W&B refuses a step below one it holds: a resumed run's repeats of the steps after its checkpoint go to the
        # file only (read here, before the resume trims the file; the W&B run's own step too where it resumed online)
        self.wandb_logged_through = max(logged_steps(self.path), default=0) if enabled else 0
        if enabled and logger_cfg.wandb and logger_cfg.mode != "disabled":
            import wandb

            mode = logger_cfg.mode
            if mode == "auto":
                mode = "online" if has_wandb_key() else "offline"
            # one W&B run per run folder: a resumed run logs into the run it started (each resume was a new W&B run)
            run_id = wandb_run_id(output_dir)

            def start(how: str, **settings):
                return wandb.init(project=logger_cfg.project, name=logger_cfg.name, mode=how, config=run_config,
                                  dir=str(output_dir), id=run_id, resume="allow", **settings)

            try:
                self.run = start(mode, **({"settings": wandb.Settings(init_timeout=60)} if logger_cfg.mode == "auto" else {}))
            except wandb.errors.Error as e:
                if logger_cfg.mode != "auto":
                    raise
                # auto: a key but no network (a cluster node) ended the run after the data and the target were ready
                log.warning("W&B online start failed (%s); logging offline instead (wandb sync %s later)",
                            str(e).splitlines()[0][:200], output_dir / "wandb")
                mode = "offline"
                self.run = start(mode)
            log.info("W&B %s run %s in %s", mode, run_id, self.run.dir)
            self.wandb_logged_through = max(self.wandb_logged_through, self.run.starting_step - 1)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        if self.run is not None and step > self.wandb_logged_through:
            self.run.log(metrics, step=step)

    def summary(self, metrics: dict[str, Any]) -> None:
        if self.run is not None:
            self.run.summary.update(metrics)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
