"""Host-to-device copies that leave the host free.

A copy from pageable host memory may make the host wait for the stream ("API synchronization behavior" in the CUDA
runtime documentation: to stage such a copy "the driver may synchronize with the stream"), so a training step whose
first act is moving its CPU batch to the GPU may wait there until the previous step's kernels have run, and the GPU
then idles while the host prepares the new step. Staged through pinned memory (PyTorch's caching host allocator: the block is reused only
after its copy has run) the copy is queued behind them instead.
"""

from __future__ import annotations

import torch


def to_device_async(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``tensor`` on ``device``, the copy queued without waiting for the device: a CPU tensor is pinned first when the
    device is a GPU; anything else is ``tensor.to(device, non_blocking=True)``."""
    device = torch.device(device)
    if device.type == "cuda" and tensor.device.type == "cpu" and not tensor.is_pinned():
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)
