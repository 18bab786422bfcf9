"""Process-group facts for multi-GPU runs: rank, world size, local device.

Both launchers (``torchrun`` and ``deepspeed``) set RANK, WORLD_SIZE and LOCAL_RANK; a plain
``python -m ...`` is rank 0 of 1 and never touches ``torch.distributed``.
"""

from __future__ import annotations

import datetime
import os
import socket
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def any_rank(flag: bool, device: torch.device) -> bool:
    """True on every rank when ``flag`` is true on any (a collective: every rank calls it at the same point)."""
    flags = torch.tensor([int(flag)], device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return bool(flags.item())


def ranks_from_env() -> Ranks:
    return Ranks(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0)))


def local_device(device: torch.device, ranks: Ranks) -> torch.device:
    """Each rank's own GPU (cuda:LOCAL_RANK) when the run is on GPUs; one process on ``cuda:N`` makes N the current
    device (Triton kernels and FlashAttention-4 launch on the current device, not their tensors')."""
    if device.type == "cuda" and ranks.distributed:
        torch.cuda.set_device(ranks.local_rank)
        return torch.device("cuda", ranks.local_rank)
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
    return device


# What torchrun sets for a process of a one-process group (DeepSpeed reads them)
LAUNCHER_ENV = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}

# How long a collective may wait: the longest a rank waits for rank 0's data preparation (regeneration included)
PREPARE_TIMEOUT = datetime.timedelta(hours=6)


def init_process_group(device: torch.device, ranks: Ranks, single_process: bool = False) -> None:
    """The launcher's process group (NCCL on GPUs, gloo on CPUs); with ``single_process`` a group of
    one for a plain ``python -m`` run too."""
    if single_process and not ranks.distributed:
        # what a launcher would set (DeepSpeed reads them); ``train`` takes them away again at its end
        # (``launcher_env_restored``), the group of one stays for the next run in this process
        for name, value in LAUNCHER_ENV.items():
            os.environ.setdefault(name, value)
    if dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    if ranks.distributed:
        # the other ranks wait in a barrier while rank 0 prepares the data (``rank0_first``): regenerating it with the
        # target takes minutes to hours, past NCCL's default timeout of 10 minutes, which would abort the job
        dist.init_process_group(backend, timeout=PREPARE_TIMEOUT, **({"device_id": device} if device.type == "cuda" else {}))
    elif single_process:
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)


@contextmanager
def launcher_env_restored() -> Iterator[None]:
    """The launcher's variables as they were before the block: a one-process DeepSpeed run sets them, and left behind
    they told later code in the same process that torchrun had launched it (vLLM speculators' trainer, run in a test
    worker after a DeepSpeed test, tried to bind GPU ``LOCAL_RANK`` on a CPU machine)."""
    before = {name: os.environ.get(name) for name in LAUNCHER_ENV}
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


@contextmanager
def rank0_first(ranks: Ranks) -> Iterator[None]:
    """Rank 0 runs the block first (filling caches, creating files), the other ranks after it."""
    if not ranks.is_main:
        barrier()
    yield
    if ranks.is_main:
        barrier()
