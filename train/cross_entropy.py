"""Cross-entropy on low-precision logits that keeps no fp32 copy for the backward.

``F.cross_entropy(logits.float(), ...)`` saves the fp32 log-softmax ([rows, vocab], twice the bf16 logits' bytes) for
its backward: on DFlash's small-target step (65,536 block rows x 8,192 vocabulary) 2.1 GB written and read again, its
two kernels 2.8 ms of a ~45 ms step on an H100. ``logits_cross_entropy`` saves the logits as they are (bf16) and one
fp32 log-sum-exp per row, and recomputes the softmax in the backward: the same values (the softmax is computed in fp32
from the same bf16 logits both ways) for less traffic. Pure PyTorch, so ``torch.compile`` fuses each direction into
one pass over the logits (the forward with the accuracy's argmax). Measured: the step ~1 ms (2%) faster, the 8B-shape
step 223 against 227 ms with 2.3 GiB less peak memory (BENCHMARKS.md, "DFlash's cross-entropy without an fp32
log-softmax"). Eager on the CPU it is the reference arithmetic.
"""

from __future__ import annotations

import torch


class _LogitsCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
        x = logits.float()
        lse = torch.logsumexp(x, dim=-1)
        valid = labels != ignore_index
        picked = x.gather(-1, torch.where(valid, labels, 0).unsqueeze(-1)).squeeze(-1)
        ctx.save_for_backward(logits, labels, lse)
        ctx.ignore_index = ignore_index
        return torch.where(valid, lse - picked, 0.0)

    @staticmethod
    def backward(ctx, grad_ce: torch.Tensor):
        logits, labels, lse = ctx.saved_tensors
        g = torch.where(labels != ctx.ignore_index, grad_ce, 0.0).unsqueeze(-1)
        prob = torch.exp(logits.float() - lse.unsqueeze(-1))
        is_label = torch.arange(logits.shape[-1], device=logits.device) == labels.unsqueeze(-1)
        return ((prob - is_label.float()) * g).to(logits.dtype), None, None


def logits_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Per-row CE, fp32: ``F.cross_entropy(logits.float(), labels, ignore_index=..., reduction="none")``'s values and
    gradient. logits [N, V] (any float dtype; the gradient comes back in it), labels [N] int64, ``ignore_index`` rows
    give 0 and no gradient."""
    if logits.dim() != 2 or labels.shape != logits.shape[:1]:
        raise ValueError(f"logits_cross_entropy: logits {tuple(logits.shape)} and labels {tuple(labels.shape)}; "
                         "expected [N, V] and [N]")
    return _LogitsCrossEntropy.apply(logits, labels, ignore_index)
