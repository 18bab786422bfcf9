"""DeepSpeed ZeRO for the drafter: config assembly, the engine, checkpoints, gathered weights.

What DeepSpeed does here: shard the drafter's optimizer state and gradients (ZeRO-2, the default
for multi-process runs) and optionally its parameters (ZeRO-3) over the data-parallel ranks, and
average gradients across them. What stays ours: the optimizer (AdamW) and schedule (warmup-cosine),
mixed precision (``torch.autocast`` bf16 over fp32 weights, as on one GPU), which rows each rank
reads (train/trainer.py: every rank plans the whole global step, then runs its own micro-batches),
and the loss normalisation (labels in the whole global step).

Configs: ``configs/deepspeed/zero2.json`` and ``zero3.json``, or any DeepSpeed JSON given by path
(``trainer.deepspeed=/path/ds.json``). The batch and clipping fields are filled from ``trainer.*``;
where a file sets one to something else than "auto" or the trainer's value, start-up fails naming it.
"""

from __future__ import annotations

import itertools
import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import configs

from .distributed import Ranks, init_process_group

log = logging.getLogger(__name__)

CONFIG_DIR = Path(configs.__file__).parent / "deepspeed"
REFUSED_KEYS = {
    "optimizer": "the optimizer is the trainer's AdamW (trainer.lr, trainer.weight_decay)",
    "scheduler": "the schedule is the trainer's warmup-cosine (trainer.warmup_ratio, trainer.min_lr_ratio)",
    "fp16": "precision is trainer.precision (bf16 autocast over fp32 weights)",
    "bf16": "precision is trainer.precision (bf16 autocast over fp32 weights)",
}


def config_path(name: str) -> Path:
    path = CONFIG_DIR / f"{name}.json" if "/" not in name and not name.endswith(".json") else Path(name)
    if not path.is_file():
        shipped = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.json")))
        raise ValueError(f"trainer.deepspeed={name!r}: no such DeepSpeed config (shipped: {shipped}; or a path to a .json file)")
    return path


def deepspeed_config(name: str, batch_size: int, grad_accum: int, grad_clip: float, world_size: int) -> dict[str, Any]:
    """The named (or given) JSON with the trainer's batch and clipping filled in; conflicts fail."""
    path = config_path(name)
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"trainer.deepspeed: {path} is not valid JSON ({e})") from None
    if not isinstance(config, dict):  # was an AttributeError traceback ('list' object has no attribute 'get')
        raise ValueError(f"trainer.deepspeed: {path} holds a JSON {type(config).__name__}; expected an object of DeepSpeed's fields")
    if not isinstance(config.get("zero_optimization", {}), dict):
        raise ValueError(f"{path}: field 'zero_optimization' is {config['zero_optimization']!r}; expected an object, "
                         "e.g. {\"stage\": 2}")
    for key, why in REFUSED_KEYS.items():
        enabled = not isinstance(config.get(key), dict) or config[key].get("enabled", False)  # {"enabled": false} is harmless
        if key in config and (key not in ("fp16", "bf16") or enabled):
            raise ValueError(f"{path}: field {key!r} is set, but {why}; remove it")
    filled = {
        "train_micro_batch_size_per_gpu": batch_size,
        "gradient_accumulation_steps": grad_accum,
        "train_batch_size": batch_size * grad_accum * world_size,
        "gradient_clipping": float(grad_clip),
    }
    for key, value in filled.items():
        if config.get(key, "auto") not in ("auto", value):
            raise ValueError(f"{path}: field {key!r} is {config[key]!r}, but the trainer runs {value!r} "
                             "(set it to \"auto\" or change trainer.batch_size / grad_accum / grad_clip)")
        config[key] = value
    config["zero_allow_untested_optimizer"] = True  # the trainer's own torch AdamW
    config.setdefault("steps_per_print", 2**31 - 1)  # our logger prints; keep DeepSpeed's quiet
    stage = config.get("zero_optimization", {}).get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"{path}: zero_optimization.stage={stage!r}; expected 0, 1, 2 or 3")
    return config


def initialize(drafter: torch.nn.Module, optimizer, scheduler, config: dict[str, Any], device: torch.device, ranks: Ranks):
    """-> the DeepSpeed engine wrapping the drafter, our optimizer and our scheduler."""
    import deepspeed

    if device.type == "cpu":
        # DeepSpeed compiles a shared-memory all-reduce (inference only) at start-up on CPU: 30-55 s
        # and a C++ compiler, for nothing a training run uses. (The module object, not the attribute:
        # deepspeed.comm.torch as an attribute is the torch package.)
        import deepspeed.comm.torch  # noqa: F401

        comm_torch = sys.modules["deepspeed.comm.torch"]
        if callable(getattr(comm_torch, "build_shm_op", None)):
            comm_torch.build_shm_op = lambda: None
        else:  # a DeepSpeed that builds it elsewhere: setting the name would do nothing, silently
            log.warning("DeepSpeed %s has no deepspeed.comm.torch.build_shm_op (checked with 0.19.8): its CPU shared-memory "
                        "all-reduce may compile at start-up (30-55 s, a C++ compiler)", deepspeed.__version__)
    init_process_group(device, ranks, single_process=True)  # DeepSpeed wants a process group, even of one
    engine, _, _, _ = deepspeed.initialize(model=drafter, optimizer=optimizer, lr_scheduler=scheduler, config=config)
    log.info("DeepSpeed ZeRO stage %d over %d rank(s): micro-batch %d, accumulation %d, global batch %d",
             engine.zero_optimization_stage(), engine.world_size, engine.train_micro_batch_size_per_gpu(),
             engine.gradient_accumulation_steps(), engine.train_batch_size())
    return engine


def gathered_parameters(engine) -> Any:
    """Full parameters on every rank for the duration (ZeRO-3 shards them; other stages hold them whole)."""
    if engine is None or engine.zero_optimization_stage() != 3:
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None)


@contextmanager
def plain_drafter(step, engine) -> Iterator[None]:
    """Inside ``gathered_parameters``: ``step`` on a plain copy of its drafter for rank 0's loop evaluation, under ZeRO-3
    on several ranks. ZeRO-3's forward hooks stay on the module while its parameters are gathered, and each forward's
    hook joins a collective: forwards on rank 0 alone waited for ranks that never came (a deadlock at the first eval with
    the default trainer.loop_eval_prompts). Other stages and one rank: the drafter itself."""
    if engine is None or engine.zero_optimization_stage() != 3 or engine.world_size == 1:
        yield
        return
    drafter, head = step.drafter, getattr(step, "head", None)
    gathered = dict(itertools.chain(drafter.named_parameters(), drafter.named_buffers()))
    copy = getattr(step, "plain_copy", None)  # one per run: a compiled evaluation guards on the module (a new one recompiled)
    if copy is None:
        copy = step.plain_copy = type(drafter)(drafter.config).to(next(iter(gathered.values())).device)
    copy.load_state_dict({name: gathered[name].detach() for name in copy.state_dict()})
    copy.train(drafter.training)
    step.drafter = copy
    if head is not None and head is getattr(drafter, "lm_head", None):  # a draft vocabulary's head is the drafter's own
        step.head = copy.lm_head
    try:
        yield
    finally:
        step.drafter, step.head = drafter, head


def leave_process_group() -> None:
    """Leave the process group in order at the end (a rank exiting with it open was seen to abort)."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
