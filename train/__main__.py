"""Hydra entry point: ``python -m train experiment=dflash_swa_tiny [key=value ...]``.

The composed config is checked against ``train.config.TrainConfig`` before anything runs (and
before the trainer, torch and the models import: a bad key or value fails in seconds); the work
itself is ``train.trainer.train(cfg)``, which tests call directly.
"""

import logging
import os
import shutil
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from train.config import check_paths, to_train_config  # registers train_schema and each drafter's schema

log = logging.getLogger("train")


@hydra.main(version_base="1.3", config_path="pkg://configs", config_name="train")
def main(cfg: DictConfig) -> None:
    if int(os.environ.get("RANK", 0)) != 0:  # multi-GPU launches: rank 0 speaks for the run
        logging.getLogger().setLevel(logging.WARNING)
    try:
        checked = to_train_config(cfg)  # schema and cross-field checks, before the heavy imports below
        check_paths(checked)
        from train.trainer import train

        train(checked)
    except ValueError as e:  # bad user input: one line naming what is wrong, non-zero exit
        log.error("%s", e)
        remove_if_unstarted(cfg.get("output_dir"))
        sys.exit(2)
    except KeyboardInterrupt:
        log.error("interrupted (Ctrl-C); the same command resumes from the newest checkpoint in %s, if one was written",
                  cfg.get("output_dir"))
        sys.exit(130)


def remove_if_unstarted(output_dir) -> None:
    """A run that failed at start-up leaves no folder behind: removed while it holds only what Hydra wrote
    (``.hydra``, the log), never once it has checkpoints, metrics or an export."""
    path = Path(str(output_dir)) if output_dir else None
    if path is not None and path.is_dir() and all(p.name in (".hydra", "__main__.log") for p in path.iterdir()):
        logging.shutdown()  # close the log file first
        shutil.rmtree(path, ignore_errors=True)


def refuse_file_output_dir(argv: list[str]) -> None:
    """Hydra makes the run folder (``hydra.run.dir: ${output_dir}``) before ``main`` runs: an ``output_dir=`` that is, or
    lies under, a file failed there with a traceback."""
    for arg in argv:
        key, _, value = arg.partition("=")
        if key.lstrip("+") != "output_dir" or not value:
            continue
        path = Path(value)
        existing = next((p for p in (path, *path.parents) if p.exists()), None)
        if existing is not None and not existing.is_dir():
            print(f"output_dir={value!r}: {existing} is a file; expected a folder for the run (new, or a run's to resume)", file=sys.stderr)
            sys.exit(2)


def refuse_bad_overrides(argv: list[str]) -> None:
    """Hydra answers a bad override (an unknown key, a value of the wrong type, a config group option that does not exist,
    a malformed ``key=value``) in 4-15 lines and exit status 1; composed here first through Hydra's public compose API,
    the same error comes as one line (``hydra_error_line``) and exit status 2. With Hydra's own flags (``--cfg``,
    ``--multirun``, ``--help``, ...) Hydra answers as it does."""
    if any(a.startswith("-") for a in argv):
        return
    from hydra import compose, initialize_config_module
    from hydra.errors import HydraException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    def composed(overrides: list[str]) -> Exception | None:
        try:
            with initialize_config_module("configs", version_base="1.3"):
                compose("train", overrides=overrides)
        except (HydraException, OmegaConfBaseException) as e:
            return e
        return None

    error = composed(argv)
    if error is None:
        return
    line = hydra_error_line(error)
    if isinstance(error, OverrideParseException) and not any(a in line for a in argv):  # e.g. "mismatched input '='": which one
        line = next((f"{a}: {line}" for a in argv if isinstance(composed([a]), OverrideParseException)), line)
    print(f"error: {line}", file=sys.stderr)
    sys.exit(2)


def hydra_error_line(e: Exception) -> str:
    """Hydra's error and its cause in one line: the message, the cause's (OmegaConf's) reason and full key, a missing
    option's choices (the ``*_schema`` nodes, internal, left out); its search path, links and the ``+key=`` hint (this
    project's schema refuses appended keys too) dropped."""
    text = str(e).split("Config search path:")[0]
    lines = [line.strip() for line in text.splitlines()
             if line.strip() and not line.strip().startswith(("See https://", "To append to your config"))]
    parts, options = [lines[0].rstrip(".")], []
    for line in lines[1:]:
        if options or parts[-1].endswith(":"):
            if not line.endswith("_schema"):
                options.append(line)
        else:
            parts.append(line.rstrip("."))
    if options:
        parts[-1] += " " + ", ".join(options)
    cause = [line.strip() for line in str(e.__cause__ or "").splitlines() if line.strip()]
    if cause:
        key = next((c for c in cause if c.startswith("full_key:")), None)
        parts[0] += f": {cause[0]}" + (f" ({key})" if key else "")
    return "; ".join(parts)


if __name__ == "__main__":
    # The deepspeed launcher appends --local_rank=N (it also sets LOCAL_RANK); Hydra takes key=value only.
    sys.argv = [a for a in sys.argv if not a.startswith("--local_rank")]
    refuse_file_output_dir(sys.argv[1:])
    refuse_bad_overrides(sys.argv[1:])
    main()
