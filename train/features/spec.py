"""The spec of the store a training config needs: built by the writer to create a store, and by the
trainer to check that a store holds its inputs (same target weights, layers, rows, shapes)."""

from __future__ import annotations

import logging
from typing import Any

from ..config import TrainConfig
from models.target import TargetModel
from .store import FeatureStore, StoreSpec, data_digest, target_digest

log = logging.getLogger(__name__)

# What must match for the stored features to be the ones this run would capture; the rest
# (batch size, compiled layers) only changes rounding, so a mismatch is logged, not refused.
MUST_MATCH = ("target", "layer_ids", "with_final_hidden", "dtype", "hidden_size", "max_length", "rows", "data")


def store_spec(cfg: TrainConfig, target: TargetModel, layer_ids: list[int], splits: dict[str, Any]) -> StoreSpec:
    """What a store made from these inputs holds (the trainer builds the same spec to check a store)."""
    return StoreSpec(
        target=target_digest(target.model), layer_ids=list(layer_ids), with_final_hidden=cfg.drafter.kind == "eagle3",
        dtype=str(target.embed_tokens.weight.dtype).removeprefix("torch."), hidden_size=target.hidden_size,
        max_length=cfg.data.max_length, batch_size=cfg.features.batch_size or cfg.trainer.batch_size,
        data={name: data_digest(ds) for name, ds in splits.items()}, rows={name: len(ds) for name, ds in splits.items()},
        rows_per_shard=cfg.features.rows_per_shard, compression=cfg.features.compression,
        compile_layers=bool(cfg.target.compile_layers and target.device.type == "cuda"),
    )


def open_store(cfg: TrainConfig, target: TargetModel, layer_ids: list[int], splits: dict[str, Any]) -> FeatureStore:
    """The complete store at ``features.path``, checked against this run's inputs."""
    store = FeatureStore(cfg.features.path, verify=False)
    asked = store_spec(cfg, target, layer_ids, splits)
    store.check(asked, MUST_MATCH)  # a store of another target or layer set: refused before its shards are hashed
    if cfg.features.verify:
        store.verify_all()
    for name in ("batch_size", "compile_layers"):
        if getattr(store.spec, name) != getattr(asked, name):
            log.warning("feature store %s was written with %s=%s, this run uses %s: features equal online capture up to "
                        "rounding, not bit for bit", cfg.features.path, name, getattr(store.spec, name), getattr(asked, name))
    log.info("reading target features from %s (%d tokens, %.1f KiB per token); the target's decoder layers are released",
             cfg.features.path, store.totals["tokens"], store.totals["bytes_per_token"] / 1024)
    return store
