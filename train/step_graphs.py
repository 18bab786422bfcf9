"""The drafters' compiled training step, optionally replayed as CUDA graphs (``trainer.cuda_graphs``).

On a small target the compiled step is bound by the host: it needs about the step's GPU time to queue the step's
~900 launches (the compiled graphs' Python wrappers, FlashAttention-4's calls, each kernel launch; BENCHMARKS.md, "The
trainer is host-bound"). ``torch.compile(mode="reduce-overhead")`` records the forward and the backward graph once per
input shape (CUDA Graph Trees) and replays each with one launch, so the host's share of a step shrinks to the eager
pieces around it (anchors, masks, the optimizer).

What a replay changes, and how this module keeps the trainer's semantics:

- a replay writes its outputs into memory the next replay overwrites: the stats it returns are cloned here (a few
  small tensors), so the trainer may keep them across steps (its logging window sums them);
- each call starts a new iteration (``torch.compiler.cudagraph_mark_step_begin``): the previous step's graph outputs
  are dead by then, the gradients they fed consumed by the optimizer and set to None;
- gradient accumulation (several micro-batches into one optimizer step) would add the second micro-batch's gradients
  to the first one's, which live in graph memory the second replay overwrites: refused at start-up
  (``TrainerConfig``), as are DeepSpeed (its gradient hooks and buckets) and ``compile_scope=regions``.

The math is the compiled step's: the same kernels, so the same losses (``tests/test_gpu.py`` compares several
optimizer steps with and without). On the CPU the flag does nothing (there is no compiled step there).
"""

from __future__ import annotations

from typing import Any, Callable

import torch


def compile_step(fn: Callable, cuda_graphs: bool) -> Callable:
    """``fn`` (a step's forward and loss, returning a stats dataclass of tensors) compiled with static shapes, and with
    ``cuda_graphs`` replayed as CUDA graphs."""
    if not cuda_graphs:
        return torch.compile(fn, dynamic=False)
    return GraphedStep(torch.compile(fn, dynamic=False, mode="reduce-overhead"))


class GraphedStep:
    """A compiled step under CUDA Graph Trees: every call a new iteration, its stats cloned out of graph memory."""

    def __init__(self, compiled: Callable):
        self.compiled = compiled

    def __call__(self, *args: Any) -> Any:
        torch.compiler.cudagraph_mark_step_begin()
        stats = self.compiled(*args)
        return type(stats)(*(t.clone() for t in vars(stats).values()))
