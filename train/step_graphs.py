"""The DFlash training step replayed as CUDA graphs (``trainer.cuda_graphs``; DFlash on the ``fa4`` backend).

On a small target the compiled step is bound by the host: it needs about the step's GPU time to queue the step's
~900 launches (the compiled graphs' Python wrappers, FlashAttention-4's calls, each kernel launch; BENCHMARKS.md, "The
trainer is host-bound"). ``torch.compile(mode="reduce-overhead")`` records the forward and the backward graph once per
input shape (CUDA Graph Trees) and replays each with one launch, so the host's share of a step shrinks to the eager
pieces around it (anchors, masks, the target's capture, the optimizer).

What a replay needs, and how this module provides it:

- stable input addresses: the backward graph takes some forward inputs as they are (the key-interval tables FA4's
  backward reads) and treats them as static, so an input at a new address every step made CUDA Graph Trees record
  the backward again at every step (95-134 ms a step against 38.5 ms without graphs on an H200, BENCHMARKS.md). Every
  tensor the step takes (not the modules' parameters) is copied here into buffers kept per input signature, so a
  signature's replays read the same addresses;
- outputs that survive the next replay: a replay writes its outputs into memory the next one overwrites, so the stats
  are cloned out (a few small tensors; the trainer's logging window sums them across steps);
- one iteration per call (``torch.compiler.cudagraph_mark_step_begin``): by then the previous step's gradients have
  been consumed by the optimizer and set to None. Gradient accumulation, DeepSpeed and checkpointed steps are refused
  at start-up (``TrainerConfig``), and any backend but ``fa4`` (flex's block masks hold tensors inside their mask
  functions, out of this module's reach) by the DFlash step.

The math is the compiled step's (the same kernels): ``tests/test_gpu.py`` compares optimizer steps with and without.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch


def compile_step(fn: Callable, cuda_graphs: bool) -> Callable:
    """``fn`` (a step's forward and loss, returning a stats dataclass of tensors) compiled with static shapes, and with
    ``cuda_graphs`` replayed as CUDA graphs over stable input buffers."""
    if not cuda_graphs:
        return torch.compile(fn, dynamic=False)
    return GraphedStep(torch.compile(fn, dynamic=False, mode="reduce-overhead"))


def tensors_in(obj: Any) -> list[torch.Tensor]:
    """Every tensor reachable from ``obj`` through lists, tuples, dicts and dataclasses, in a fixed order (modules,
    whose parameters already stay put, are not entered)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in tensors_in(x)]
    if isinstance(obj, dict):
        return [t for k in obj for t in tensors_in(obj[k])]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [t for f in dataclasses.fields(obj) for t in tensors_in(getattr(obj, f.name))]
    return []


def with_tensors(obj: Any, replacements) -> Any:
    """``obj`` rebuilt with its tensors (``tensors_in``'s order) taken from the iterator ``replacements``."""
    if isinstance(obj, torch.Tensor):
        return next(replacements)
    if isinstance(obj, (list, tuple)):
        items = [with_tensors(x, replacements) for x in obj]
        return type(obj)(items) if isinstance(obj, list) or type(obj) is tuple else type(obj)(*items)
    if isinstance(obj, dict):
        return {k: with_tensors(obj[k], replacements) for k in obj}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: with_tensors(getattr(obj, f.name), replacements)
                                           for f in dataclasses.fields(obj) if f.init})
    return obj


class GraphedStep:
    """A compiled step under CUDA Graph Trees: its tensor inputs copied into buffers kept per signature (shapes,
    strides, dtypes), every call a new iteration, its stats cloned out of graph memory."""

    def __init__(self, compiled: Callable):
        self.compiled = compiled
        self.buffers: dict[tuple, list[torch.Tensor]] = {}

    def __call__(self, *args: Any) -> Any:
        inputs = tensors_in(args)
        if any(t.requires_grad for t in inputs):
            raise ValueError("trainer.cuda_graphs: a step input requires grad; only module parameters may (they stay put)")
        key = tuple((t.shape, t.stride(), t.dtype, t.device) for t in inputs)
        if key not in self.buffers:
            self.buffers[key] = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device) for t in inputs]
        buffers = self.buffers[key]
        for buffer, t in zip(buffers, inputs):
            buffer.copy_(t)
        torch.compiler.cudagraph_mark_step_begin()
        stats = self.compiled(*with_tensors(args, iter(buffers)))
        return type(stats)(*(t.clone() for t in vars(stats).values()))
