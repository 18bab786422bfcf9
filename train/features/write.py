"""``write_features(cfg)``: run the target over the training data once and store what the drafter reads.

The config is the training run's own (same target, data, drafter layer choice), so
``python -m train.features experiment=dflash_swa features.path=/data/feat`` followed by
``python -m train experiment=dflash_swa features.path=/data/feat`` trains on exactly the rows and
layers the online run would.

Every batch runs at the GPU trainer's static shape, ``[features.batch_size, data.max_length]``
(a short last batch is filled with copies of its first row): a row's features then do not depend on
which rows share its batch, so they equal, bit for bit, what the online trainer captures for that row
(tests/test_feature_store.py; on the GPU benchmarks/feature_store.py). Under ``torchrun`` each rank
writes every world-th shard.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from ..config import TrainConfig
from ..data import prepare_data
from ..data.dataset import collate_padded
from ..distributed import barrier, init_process_group, local_device, rank0_first, ranks_from_env
from models.target import TargetModel
from models.builtin_targets import resolve_target_path
from .spec import store_spec
from .store import StoreError, StoreSpec, StoreWriter

log = logging.getLogger(__name__)


@torch.no_grad()
def capture_shard(target: TargetModel, ds, rows: range, layer_ids: list[int], spec: StoreSpec) -> tuple[dict[str, torch.Tensor], int]:
    """The stored tensors of one shard: each row's features (and final hidden state), real tokens only."""
    tensors: dict[str, torch.Tensor] = {}
    tokens = 0
    for start in range(rows.start, rows.stop, spec.batch_size):
        idx = list(range(start, min(start + spec.batch_size, rows.stop)))
        batch_rows = [ds[i] for i in idx]
        filled = batch_rows + [batch_rows[0]] * (spec.batch_size - len(batch_rows))
        batch = collate_padded(filled, target.pad_id, spec.max_length)
        # no padding mask, as the online trainer captures (``StepContext.features``): collate_padded pads on the right,
        # so no real token sees a pad under causal attention, and on a GPU the same causal kernel runs as online
        captured = target.capture(batch["input_ids"].to(target.device), layer_ids, attention_mask=None,
                                  with_final_hidden=spec.with_final_hidden)
        for i, r in enumerate(idx):
            n = len(batch_rows[i]["input_ids"])
            tensors[f"{r}.features"] = captured.features[i, :n].to("cpu", copy=True)
            if spec.with_final_hidden:
                tensors[f"{r}.final_hidden"] = captured.final_hidden[i, :n].to("cpu", copy=True)
            tokens += n
    return tensors, tokens


def check_writable(path: str) -> None:
    """``features.path`` is a folder the store can be written to, or can be made in: its nearest existing ancestor a
    writable folder. One line now, where the store's first write came after the target, the data and any regeneration."""
    folder = Path(path)
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if existing is None or not existing.is_dir():
        raise StoreError(f"features.path={path!r}: {existing} is a file; expected a folder for the store (or nothing there yet)")
    from common.atomic import unwritable_reason

    reason = unwritable_reason(path)
    if reason:
        raise StoreError(f"features.path={path!r}: {reason}; expected a folder the store can be written to")


def check_features_command(cfg) -> TrainConfig:
    """The refusals before any work (``python -m train.features`` removes the run folder Hydra made with them): the
    config, ``features.path`` set and writable (before the target and the data, hours of regeneration, not after)."""
    from ..trainer import to_train_config

    cfg: TrainConfig = to_train_config(cfg)
    if cfg.features.path is None:
        raise ValueError("features.path is null; set where the store goes: python -m train.features ... features.path=DIR")
    check_writable(cfg.features.path)
    return cfg


def write_features(cfg) -> dict[str, Any]:
    """Write (or finish) the store at ``features.path``; returns its totals (rank 0) or {}."""
    from ..trainer import pick_device, target_dtype, target_layer_ids

    cfg = check_features_command(cfg)
    ranks = ranks_from_env()
    device = local_device(pick_device(cfg.trainer.device), ranks)
    init_process_group(device, ranks)
    # the training run's own dtype rule (trainer.target_dtype): else `auto` with trainer.precision=fp32 wrote a bf16 store
    # on a GPU that the same config's training run then refused (the store's dtype must match)
    dtype = target_dtype(cfg.trainer.precision, cfg.target.dtype, device)
    target = TargetModel.from_pretrained(resolve_target_path(cfg.target.path), device, dtype, cfg.target.attn_implementation)
    layer_ids = target_layer_ids(cfg, target)

    with rank0_first(ranks):  # rank 0 tokenizes and fills the cache, the others then load it
        train_ds, eval_ds, _ = prepare_data(cfg.data, target, seed=cfg.trainer.seed, progress=cfg.trainer.progress and ranks.is_main)
    splits = {"train": train_ds.with_format(None)}
    if eval_ds is not None:
        splits["eval"] = eval_ds.with_format(None)
    if cfg.target.compile_layers and device.type == "cuda":
        target.compile_layers()

    spec = store_spec(cfg, target, layer_ids, splits)
    with rank0_first(ranks):  # rank 0 creates store.json (or checks it) and clears a killed run's leftovers
        writer = StoreWriter(cfg.features.path, spec)
        if ranks.is_main and (leftovers := writer.remove_leftovers()):
            log.info("removed %d partial files of an interrupted run", len(leftovers))
    todo = [(split, shard) for split in splits for shard in writer.pending(split, ranks.rank, ranks.world_size)]
    log.info("feature store %s: layers %s, %s; %d shards to write on rank %d", cfg.features.path, layer_ids,
             {k: f"{v} rows" for k, v in spec.rows.items()}, len(todo), ranks.rank)

    from tqdm.auto import tqdm

    # One shard is written in the background while the next one is captured.
    with ThreadPoolExecutor(1) as io:
        pending: Future | None = None
        for split, shard in tqdm(todo, desc="features", unit="shard", disable=not (cfg.trainer.progress and ranks.is_main)):
            tensors, tokens = capture_shard(target, splits[split], spec.shard_rows(split, shard), layer_ids, spec)
            if pending is not None:
                pending.result()
            pending = io.submit(writer.write_shard, split, shard, tensors, tokens)
        if pending is not None:
            pending.result()
    barrier()
    if not ranks.is_main:
        return {}
    totals = writer.finish()
    log.info("feature store complete: %d shards, %d tokens, %.1f KiB per token", totals["shards"], totals["tokens"], totals["bytes_per_token"] / 1024)
    return totals
