"""Hydra entry point: ``python -m train.features experiment=dflash_swa features.path=DIR [key=value ...]``.

Takes the training run's own config (so the store holds exactly what that run reads) and writes the
store with ``train.features.write.write_features``. Rerun the same command after a kill to finish it;
launch with ``torchrun --nproc_per_node N -m train.features ...`` to split the shards over N GPUs.
"""

import logging
import sys

import hydra
from omegaconf import DictConfig

from train.config import output_dir_exists, refuse_bad_overrides, remove_if_unstarted  # (registers the schemas too)
from train.features.store import StoreError
from train.features.write import check_features_command, write_features

log = logging.getLogger("train.features")
OUTPUT_DIR_EXISTED = False  # set from the command line before Hydra makes the folder (remove_if_unstarted)


@hydra.main(version_base="1.3", config_path="pkg://configs", config_name="train")
def main(cfg: DictConfig) -> None:
    try:
        check_features_command(cfg)
    except (ValueError, StoreError, OSError) as e:  # refused before any work: Hydra's run folder (.hydra, log) goes too
        log.error("%s", e)
        remove_if_unstarted(cfg.get("output_dir"), OUTPUT_DIR_EXISTED)
        sys.exit(2)
    try:
        write_features(cfg)
    except (ValueError, StoreError, OSError) as e:  # bad user input (or a disk that refuses): one line, non-zero exit; the log
        log.error("%s", e)  # of a capture that ran stays
        sys.exit(2)


if __name__ == "__main__":
    refuse_bad_overrides(sys.argv[1:])
    OUTPUT_DIR_EXISTED = output_dir_exists(sys.argv[1:])
    main()
