"""Hydra entry point: ``python -m train experiment=dflash_swa_tiny [key=value ...]``.

The composed config is checked against ``train.config.TrainConfig`` before anything runs (and
before the trainer, torch and the models import: a bad key or value fails in seconds); the work
itself is ``train.trainer.train(cfg)``, which tests call directly.
"""

import logging
import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

# registers train_schema and each drafter's schema
from train.config import (check_paths, output_dir_exists, refuse_bad_overrides, refuse_fresh_start_over_a_run,
                          remove_if_unstarted, to_train_config)

log = logging.getLogger("train")
OUTPUT_DIR_EXISTED = False  # set from the command line before Hydra makes the folder (remove_if_unstarted)


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
        remove_if_unstarted(cfg.get("output_dir"), OUTPUT_DIR_EXISTED)
        sys.exit(2)
    except KeyboardInterrupt:
        log.error("interrupted (Ctrl-C); the same command resumes: training from the newest checkpoint in %s, if one was "
                  "written; a regeneration from its replies kept in the data cache (<key>.partial.jsonl)", cfg.get("output_dir"))
        sys.exit(130)


def refuse_bad_output_dir(argv: list[str]) -> None:
    """Hydra makes the run folder (``hydra.run.dir: ${output_dir}``) before ``main`` runs: an ``output_dir=`` that is, or
    lies under, a file, or that cannot be made (under /proc, a read-only folder), failed there with a traceback; an empty
    one trained into the current folder. With ``trainer.resume=never``, a folder that holds a run is refused here too,
    before Hydra rewrites its ``.hydra``."""
    values = {}
    for arg in argv:
        key, _, value = arg.partition("=")
        values[key.lstrip("+")] = value
    if "output_dir" not in values:
        return
    value = values["output_dir"]
    if value.strip().strip("'\"").strip() == "":
        print(f"output_dir={value!r}: empty; expected a folder for the run (new, or a run's to resume)", file=sys.stderr)
        sys.exit(2)
    path = Path(value)
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        print(f"output_dir={value!r}: {existing} is a file; expected a folder for the run (new, or a run's to resume)", file=sys.stderr)
        sys.exit(2)
    from common.atomic import unwritable_reason

    reason = unwritable_reason(path)
    if reason:
        print(f"output_dir={value!r}: {reason}; expected a folder the run can be written to", file=sys.stderr)
        sys.exit(2)
    if values.get("trainer.resume") == "never":
        try:
            refuse_fresh_start_over_a_run(path)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)


if __name__ == "__main__":
    # The deepspeed launcher appends --local_rank=N (it also sets LOCAL_RANK); Hydra takes key=value only.
    sys.argv = [a for a in sys.argv if not a.startswith("--local_rank")]
    refuse_bad_output_dir(sys.argv[1:])
    refuse_bad_overrides(sys.argv[1:])
    OUTPUT_DIR_EXISTED = output_dir_exists(sys.argv[1:])
    main()
