"""What every drafter's training step shares, fixed at start-up: device, attention backend,
precision, batch padding. ``trainer.DFlashStep`` and ``eagle3_objective.Eagle3Step`` add their
objective (``plan``, ``num_labels``, ``forward``)."""

from __future__ import annotations

import contextlib

import torch

from .data.dataset import collate_padded


class TrainStep:
    def __init__(self, cfg, target, drafter, layer_ids: list[int], device: torch.device):
        self.cfg, self.target, self.drafter, self.layer_ids, self.device = cfg, target, drafter, layer_ids, device
        backend = cfg.trainer.attention_backend
        if backend == "auto":
            backend = "flex" if device.type == "cuda" else "sdpa"
        if backend in ("flex", "cudnn") and device.type != "cuda":
            raise ValueError(f"trainer.attention_backend={backend} needs a GPU (trainer.device={device.type}); use sdpa")
        self.backend = backend
        precision = cfg.trainer.precision
        self.bf16 = precision == "bf16" or (precision == "auto" and device.type == "cuda")
        # Compiled flex attention wants one shape: pad every batch to max_length.
        self.static_shapes = self.backend == "flex"
        self.pad_to = cfg.data.max_length if self.static_shapes else None

    def collate(self, rows: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
        return collate_padded(rows, pad_id, self.pad_to)

    def autocast(self):
        if self.bf16:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()
