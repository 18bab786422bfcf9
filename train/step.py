"""What every drafter's training step shares, fixed at start-up: device, attention backend,
precision, batch padding. ``trainer.DFlashStep`` and ``eagle3_objective.Eagle3Step`` add their
objective (``plan``, ``num_labels``, ``forward``)."""

from __future__ import annotations

import contextlib

import torch

from kernels.window_attention import fa4_available

from .data.dataset import collate_padded


class TrainStep:
    def __init__(self, cfg, target, drafter, layer_ids: list[int], device: torch.device, store=None):
        self.cfg, self.target, self.drafter, self.layer_ids, self.device = cfg, target, drafter, layer_ids, device
        self.store = store  # a train.features.store.FeatureStore: read features instead of running the target
        backend = cfg.trainer.attention_backend
        if backend == "auto":
            backend = self.fastest_gpu_backend(cfg) if device.type == "cuda" else "sdpa"
        if backend != "sdpa" and device.type != "cuda":
            raise ValueError(f"trainer.attention_backend={backend} needs a GPU (trainer.device={device.type}); use sdpa")
        if backend in ("fa4", "flex-flash") and not fa4_available():
            raise ValueError(f"trainer.attention_backend={backend} needs the flash-attn-4 package (pip install '.[fa4]') and a "
                             "Hopper or newer GPU")
        self.backend = backend
        precision = cfg.trainer.precision
        self.bf16 = precision == "bf16" or (precision == "auto" and device.type == "cuda")
        # Compiled flex attention wants one shape, and cuDNN and FlashAttention-4 build a kernel per shape:
        # pad every batch to max_length.
        self.static_shapes = backend != "sdpa"
        self.pad_to = cfg.data.max_length if self.static_shapes else None

    def fastest_gpu_backend(self, cfg) -> str:
        """What ``attention_backend=auto`` runs on the GPU; drafters with faster kernels override it."""
        return "flex"

    def collate(self, rows: list[dict], pad_id: int, split: str | None = None, indices: list[int] | None = None) -> dict:
        """Padded tensors; with ``split`` and ``indices`` (the rows' places in their split) also
        ``split`` and ``rows``, which the feature store looks rows up by."""
        batch = collate_padded(rows, pad_id, self.pad_to)
        if split is not None:
            batch["split"], batch["rows"] = split, list(indices)
        return batch

    def target_features(self, batch: dict, with_final_hidden: bool = False):
        """The target's features for a batch: from the store when there is one, else a target forward."""
        input_ids = batch["input_ids"]
        if self.store is not None:
            if "rows" not in batch:
                raise ValueError("a batch without row indices cannot be read from the feature store")
            return self.store.gather(batch["split"], batch["rows"], input_ids.shape[1], self.device)
        return self.target.capture(input_ids.to(self.device), self.layer_ids, attention_mask=batch["attention_mask"].to(self.device),
                                   with_final_hidden=with_final_hidden)

    def autocast(self):
        if self.bf16:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()
