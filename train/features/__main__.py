"""Hydra entry point: ``python -m train.features experiment=dflash_swa features.path=DIR [key=value ...]``.

Takes the training run's own config (so the store holds exactly what that run reads) and writes the
store with ``train.features.write.write_features``. Rerun the same command after a kill to finish it;
launch with ``torchrun --nproc_per_node N -m train.features ...`` to split the shards over N GPUs.
"""

import logging
import sys

import hydra
from omegaconf import DictConfig

from train.config import refuse_bad_overrides, remove_if_unstarted  # (the module registers the schemas too)
from train.features.store import StoreError
from train.features.write import write_features

log = logging.getLogger("train.features")


@hydra.main(version_base="1.3", config_path="pkg://configs", config_name="train")
def main(cfg: DictConfig) -> None:
    try:
        write_features(cfg)
    except (ValueError, StoreError, OSError) as e:  # bad user input (or a disk that refuses): one line, non-zero exit
        log.error("%s", e)
        remove_if_unstarted(cfg.get("output_dir"))  # Hydra made the run folder (its .hydra and log) before the refusal
        sys.exit(2)


if __name__ == "__main__":
    refuse_bad_overrides(sys.argv[1:])
    main()
