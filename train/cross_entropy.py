"""Cross-entropy on low-precision logits that keeps no fp32 copy for the backward.

``F.cross_entropy(logits.float(), ...)`` saves the fp32 log-softmax ([rows, vocab], twice the bf16 logits' bytes) for
its backward: on DFlash's small-target step (65,536 block rows x 8,192 vocabulary) 2.1 GB written and read again, its
two kernels 2.8 ms of a ~45 ms step on an H100. ``logits_cross_entropy`` saves the logits as they are (bf16) and one
fp32 log-sum-exp per row, and recomputes the softmax in the backward: the same values (the softmax is computed in fp32
from the same bf16 logits both ways) for less traffic. Pure PyTorch, so ``torch.compile`` fuses each direction into
one pass over the logits (the forward with the accuracy's argmax). Measured: the step ~1 ms (2%) faster, the 8B-shape
step 223 against 227 ms with 2.3 GiB less peak memory (BENCHMARKS.md, "DFlash's cross-entropy without an fp32
log-softmax"). Eager on the CPU it is the reference arithmetic.

On a GPU the forward's log-sum-exp and the accuracy's argmax come from one Triton pass over each row
(``swa_kernels.row_stats``): Inductor's reduction read the row twice, 0.96 ms of a ~34 ms DFlash step on an H200.
"""

from __future__ import annotations

import torch

from swa_kernels.row_stats import row_stats


class _LogitsCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
        lse, top = row_stats(logits)
        valid = labels != ignore_index
        picked = logits.gather(-1, torch.where(valid, labels, 0).unsqueeze(-1)).squeeze(-1).float()
        ctx.save_for_backward(logits, labels, lse)
        ctx.ignore_index = ignore_index
        ctx.mark_non_differentiable(top)
        return torch.where(valid, lse - picked, 0.0), top

    @staticmethod
    def backward(ctx, grad_ce: torch.Tensor, _grad_top: None):
        logits, labels, lse = ctx.saved_tensors
        g = torch.where(labels != ctx.ignore_index, grad_ce, 0.0).unsqueeze(-1)
        prob = torch.exp(logits.float() - lse.unsqueeze(-1))
        is_label = torch.arange(logits.shape[-1], device=logits.device) == labels.unsqueeze(-1)
        return ((prob - is_label.float()) * g).to(logits.dtype), None, None


def logits_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100,
                         with_argmax: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Per-row CE, fp32: ``F.cross_entropy(logits.float(), labels, ignore_index=..., reduction="none")``'s values and
    gradient. logits [N, V] (any float dtype; the gradient comes back in it), labels [N] int64, ``ignore_index`` rows
    give 0 and no gradient. ``with_argmax``: also each row's ``logits.argmax(-1)`` [N] (from the same pass)."""
    if logits.dim() != 2 or labels.shape != logits.shape[:1]:
        raise ValueError(f"logits_cross_entropy: logits {tuple(logits.shape)} and labels {tuple(labels.shape)}; "
                         "expected [N, V] and [N]")
    ce, top = _LogitsCrossEntropy.apply(logits, labels, ignore_index)
    return (ce, top) if with_argmax else ce
