"""The drafters the trainer knows, by ``drafter.kind``: one training file each.

Each training file holds its drafter's config schema (``Config``-named dataclass below), builds its
drafter (``build_drafter``), names the target layers it reads by default (``feature_layer_ids``), picks
its fastest GPU attention (``fastest_gpu_backend``) and defines its step (``Step``: plan, labels,
forward, loss, metrics). The schemas are registered here as the ``drafter`` group's
``<kind>_schema``; ``configs/drafter/<kind>.yaml`` starts from it, so a key of another drafter fails
when the config is composed, naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from hydra.core.config_store import ConfigStore

from . import dflash, eagle3
from .config import DRAFTER_KINDS


@dataclass(frozen=True)
class Drafter:
    module: ModuleType  # the training file
    schema: type  # its drafter config schema
    step: type  # its step class

    @property
    def name(self) -> str:
        return self.module.NAME


DRAFTERS = {
    "dflash": Drafter(dflash, dflash.DFlashConfig, dflash.DFlashStep),
    "eagle3": Drafter(eagle3, eagle3.Eagle3Config, eagle3.Eagle3Step),
}
assert tuple(DRAFTERS) == DRAFTER_KINDS


def register_schemas() -> None:
    for kind, drafter in DRAFTERS.items():
        ConfigStore.instance().store(group="drafter", name=f"{kind}_schema", node=drafter.schema)


register_schemas()
