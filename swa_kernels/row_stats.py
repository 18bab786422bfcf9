"""Each row's log-sum-exp and argmax in one pass over bf16 logits, in Triton: the forward of the drafters' training
cross-entropy (``train.cross_entropy``) on a GPU.

Compiled by Inductor, ``torch.logsumexp`` and ``argmax`` over DFlash's [65,536, 8,192] bf16 logits ran as one reduction
kernel of 0.96 ms a step on an H200, ~1.1 TB/s: the row is read twice (its maximum and argmax first, then the sum of
exponentials), the log-sum-exp's ``where(isinf(max))`` between the two keeping Inductor from its online softmax. This
kernel reads each row once, ``BLOCK`` columns at a time, keeping the running maximum (and where it first occurs) and the
sum of exponentials rescaled to it: the values of ``torch.logsumexp(x.float(), -1)`` to fp32 rounding (the summation
order differs) and exactly ``x.argmax(-1)`` (the first column of the maximum, as torch's; NaN rows are not handled).

Triton is public API here (``triton.jit``, ``triton.language``); ``available`` says whether it imported.
``reference_row_stats`` is the pure-PyTorch reference and ``row_stats``' path on the CPU.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU wheels of torch come without Triton
    triton = None

available = triton is not None
NUM_WARPS = 4  # fewer warps, more rows in flight: 4 beat 8 and 16 at every chunk size (benchmarks/row_stats_speed.py)


def reference_row_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, V] -> (log-sum-exp [N] fp32, argmax [N] int64), two passes in PyTorch."""
    xf = x.float()
    return torch.logsumexp(xf, -1), xf.argmax(-1)


if available:

    @triton.jit
    def _row_stats_kernel(X, LSE, TOP, V, stride_row, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        base = X + row * stride_row
        cols = tl.arange(0, BLOCK)
        x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        best = tl.max(x, 0)
        best_at = tl.argmax(x, 0, tie_break_left=True)
        # an all -inf row keeps best = -inf: its exponentials are taken against 0, not -inf (which would give NaN)
        total = tl.sum(tl.exp(x - tl.where(best == float("-inf"), 0.0, best)), 0)
        for start in range(BLOCK, V, BLOCK):
            x = tl.load(base + start + cols, mask=start + cols < V, other=float("-inf")).to(tl.float32)
            chunk_max = tl.max(x, 0)
            chunk_at = tl.argmax(x, 0, tie_break_left=True)
            new_best = tl.maximum(best, chunk_max)
            shift = tl.where(new_best == float("-inf"), 0.0, new_best)
            total = total * tl.exp(best - shift) + tl.sum(tl.exp(x - shift), 0)  # best = -inf: total was 0
            best_at = tl.where(chunk_max > best, start + chunk_at, best_at)  # strictly greater: the first maximum
            best = new_best
        # a +inf logit: the shifts were +inf and the total NaN (inf - inf); the log-sum-exp is +inf, as torch's
        tl.store(LSE + row, tl.where(best == float("-inf"), float("-inf"), tl.where(best == float("inf"), float("inf"),
                                                                                     best + tl.log(total))))
        tl.store(TOP + row, best_at.to(tl.int64))

    @torch.library.custom_op("swa_drafters::row_logsumexp_argmax", mutates_args=())
    def _row_stats_op(x: torch.Tensor, block: int, num_warps: int) -> tuple[torch.Tensor, torch.Tensor]:
        # an opaque op to torch.compile, as the project's other kernels (its graph calls it; CUDA graphs capture it)
        n, v = x.shape
        lse = torch.empty(n, dtype=torch.float32, device=x.device)
        top = torch.empty(n, dtype=torch.int64, device=x.device)
        if n:
            _row_stats_kernel[(n,)](x, lse, top, v, x.stride(0), BLOCK=block, num_warps=num_warps)
        return lse, top

    @_row_stats_op.register_fake
    def _(x, block, num_warps):
        return x.new_empty(x.shape[0], dtype=torch.float32), x.new_empty(x.shape[0], dtype=torch.int64)


def block_for(vocab: int) -> int:
    # a power of two of at most 4,096 columns a step: DFlash's 8,192-wide head in two, a 152K head in 38
    return min(4096, triton.next_power_of_2(vocab)) if available else 0


def row_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, V] (any float dtype, rows contiguous) -> (log-sum-exp [N] fp32, argmax [N] int64): through the kernel on a
    GPU with Triton, else ``reference_row_stats``."""
    if x.dim() != 2:
        raise ValueError(f"row_stats: x {tuple(x.shape)}; expected [N, V]")
    if not (available and x.is_cuda) or x.shape[1] == 0:
        return reference_row_stats(x)
    if x.stride(1) != 1:
        x = x.contiguous()
    block = block_for(x.shape[1])
    return torch.ops.swa_drafters.row_logsumexp_argmax(x, block, NUM_WARPS)
