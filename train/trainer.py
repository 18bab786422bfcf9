"""``train(cfg) -> metrics``: the training pipeline as one plain function.

Today it prepares the data and streams target features through the loop a drafter trains in
(the DFlash and EAGLE-3 drafters plug into ``train_step``); read it top to bottom:

    train()            config check -> target -> data -> loop -> run record
      train_step()     one batch: target features (+ drafter step)
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any, Iterator

import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader

from .config import TrainConfig
from .data import prepare_data
from .data.dataset import collate_padded
from .target import TargetModel, default_layer_ids
from .tiny_target import resolve_target_path

log = logging.getLogger(__name__)


def to_train_config(cfg: DictConfig | TrainConfig) -> TrainConfig:
    """Composed Hydra config -> validated ``TrainConfig`` (runs every ``__post_init__`` check)."""
    if isinstance(cfg, TrainConfig):
        return cfg
    return OmegaConf.to_object(cfg)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"trainer.device={name!r} but no CUDA device is visible")
    return torch.device(name)


def target_layer_ids(cfg: TrainConfig, target: TargetModel) -> list[int]:
    drafter = cfg.drafter
    if drafter.target_layer_ids is not None:
        ids = list(drafter.target_layer_ids)
    else:
        ids = default_layer_ids(drafter.kind.value, target.num_layers, drafter.num_target_features or drafter.num_hidden_layers)
    target.check_layer_ids(ids)
    return ids


def write_json_atomic(path: Path, obj: Any) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=2, default=str)
    os.replace(tmp, path)


def batches_forever(loader: DataLoader) -> Iterator[dict[str, torch.Tensor]]:
    epoch = 0
    while True:
        if hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def train_step(batch: dict[str, torch.Tensor], target: TargetModel, layer_ids: list[int], device: torch.device) -> dict[str, float]:
    """One step on one batch: capture the target features a drafter reads."""
    input_ids = batch["input_ids"].to(device, non_blocking=True)  # [B, T]
    attention_mask = batch["attention_mask"].to(device, non_blocking=True)  # [B, T]
    feats = target.capture(input_ids, layer_ids, attention_mask=attention_mask).features  # [B, T, k*H]
    assert feats.shape[:2] == input_ids.shape
    return {"tokens": float(attention_mask.sum()), "loss_tokens": float(batch["loss_mask"].sum())}


def train(cfg: DictConfig | TrainConfig) -> dict[str, Any]:
    """Run the pipeline described by ``cfg``; returns the final metrics (also in ``run.json``)."""
    cfg = to_train_config(cfg)
    device = pick_device(cfg.trainer.device)
    torch.manual_seed(cfg.trainer.seed)
    output_dir = Path(cfg.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)

    target_path = resolve_target_path(cfg.target.path)
    target = TargetModel.from_pretrained(target_path, device, cfg.target.dtype, cfg.target.attn_implementation)
    layer_ids = target_layer_ids(cfg, target)
    log.info("target %s: %d layers, hidden %d; drafter reads layers %s", cfg.target.path, target.num_layers, target.hidden_size, layer_ids)

    train_ds, eval_ds, data_summary = prepare_data(cfg.data, target, seed=cfg.trainer.seed, progress=cfg.trainer.progress)
    pad_id = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else target.tokenizer.eos_token_id
    loader = DataLoader(
        train_ds.with_format(None), batch_size=cfg.trainer.batch_size, shuffle=True, num_workers=cfg.trainer.num_workers,
        collate_fn=partial(collate_padded, pad_token_id=pad_id), generator=torch.Generator().manual_seed(cfg.trainer.seed),
    )

    from tqdm.auto import tqdm

    from .metrics_logger import MetricsLogger

    run_config = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
    logger = MetricsLogger(cfg.logger, run_config, output_dir)
    totals = {"tokens": 0.0, "loss_tokens": 0.0}
    batches = batches_forever(loader)
    start = time.perf_counter()
    bar = tqdm(range(1, cfg.trainer.max_steps + 1), desc="train", unit="step", disable=not cfg.trainer.progress)
    for step in bar:
        stats = train_step(next(batches), target, layer_ids, device)
        for k in totals:
            totals[k] += stats[k]
        elapsed = time.perf_counter() - start
        bar.set_postfix(tok_s=f"{totals['tokens'] / elapsed:.0f}")
        if step % cfg.trainer.log_every == 0 or step == cfg.trainer.max_steps:
            logger.log({"train/tokens_per_s": totals["tokens"] / elapsed, "train/tokens": totals["tokens"]}, step)

    elapsed = time.perf_counter() - start
    metrics = {
        "steps": cfg.trainer.max_steps,
        "tokens": int(totals["tokens"]),
        "loss_tokens": int(totals["loss_tokens"]),
        "tokens_per_s": totals["tokens"] / elapsed,
        "seconds": elapsed,
    }
    logger.summary(metrics)
    logger.finish()
    record = {
        "target": {"path": cfg.target.path, "resolved_path": target_path, "num_layers": target.num_layers, "hidden_size": target.hidden_size},
        "target_layer_ids": layer_ids,
        "data": data_summary,
        "metrics": metrics,
        "config": run_config,
    }
    write_json_atomic(output_dir / "run.json", record)
    log.info("done: %s -> %s", metrics, output_dir / "run.json")
    return metrics
