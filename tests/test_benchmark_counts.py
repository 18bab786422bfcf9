"""The benchmarks' own counters against independent ones: ``train_step``'s Linear FLOPs against torch's FLOP counter over
a real forward and backward, and ``sweep_kept_ci``'s τ columns over the questions its ratio reads."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode


@pytest.mark.parametrize("input_grad", [False, True])
def test_linear_flops_count_what_the_backward_computes(input_grad) -> None:
    """A trainable Linear over an input without a gradient (the drafters' fc over the target's features) computes its
    weight gradient only: 2x forward, not 3x; over an input with one, 3x; a frozen one the gradient passes through, 2x."""
    from benchmarks.train_step import LinearFlops

    torch.manual_seed(0)
    trainable, frozen = torch.nn.Linear(24, 16, bias=False), torch.nn.Linear(16, 8, bias=False).requires_grad_(False)
    x = torch.randn(5, 24, requires_grad=input_grad)
    counter = LinearFlops(trainable, frozen)
    with FlopCounterMode(display=False) as reference:
        frozen(trainable(x)).sum().backward()
    counter.remove()
    assert counter.total == reference.get_total_flops()


def test_sweep_columns_pool_the_questions_the_ratio_reads() -> None:
    from benchmarks.sweep_kept_ci import shared
    from eval.bootstrap import pooled_tau, ratio_with_interval

    base = {"1": (30, 10), "2": (20, 10), "3": (90, 10)}  # question 3 only at prefill 0 (an interrupted cell behind)
    behind = {"1": (30, 10), "2": (20, 10)}
    kept, _, _ = ratio_with_interval(base, behind, resamples=10)
    assert kept == pytest.approx(1.0) and pooled_tau(base) == pytest.approx(140 / 30)  # the cell's own τ: 4.67 against 2.5
    assert pooled_tau(shared(behind, base)) / pooled_tau(shared(base, behind)) == pytest.approx(kept)
