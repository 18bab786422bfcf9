"""The drafters the trainer knows, by ``drafter.kind``: one training file each.

Each training file builds its drafter (``build_drafter``), names the target layers it reads by
default (``feature_layer_ids``), picks its fastest GPU attention (``fastest_gpu_backend``) and defines
its step (``Step``: plan, labels, forward, loss, metrics). Its config schema (``DFlashConfig``,
``Eagle3Config``) lives in ``train/config.py``, which registers it with Hydra without importing torch
or the models, so a bad key fails when the config is composed, in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from . import dflash, eagle3
from .config import DRAFTER_SCHEMAS


@dataclass(frozen=True)
class Drafter:
    module: ModuleType  # the training file
    step: type  # its step class

    @property
    def name(self) -> str:
        return self.module.NAME


DRAFTERS = {
    "dflash": Drafter(dflash, dflash.DFlashStep),
    "eagle3": Drafter(eagle3, eagle3.Eagle3Step),
}
assert tuple(DRAFTERS) == tuple(DRAFTER_SCHEMAS)  # a schema per training file, and the other way round
