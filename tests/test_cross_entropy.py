"""``train.cross_entropy.logits_cross_entropy`` against an independent reference: each row's -log softmax at its label,
computed row by row in float64, and its gradient by autograd through that reference."""

import pytest
import torch

from train.cross_entropy import logits_cross_entropy

IGNORE = -100


def reference_rows(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    rows = []
    for row, label in zip(logits.double(), labels.tolist()):
        rows.append(torch.zeros((), dtype=torch.float64) if label == IGNORE else torch.logsumexp(row, 0) - row[label])
    return torch.stack(rows)


def case(dtype: torch.dtype, n: int = 37, vocab: int = 301, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, vocab, generator=gen) * 4).to(dtype)
    labels = torch.randint(0, vocab, (n,), generator=gen)
    labels[::5] = IGNORE
    labels[1] = vocab - 1  # the last column
    weights = torch.rand(n, generator=gen)  # a weighted sum, as block_loss takes: the gradient is not uniform per row
    return logits, labels, weights


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_values_and_gradient_equal_a_row_by_row_reference(dtype):
    logits, labels, weights = case(dtype)
    x = logits.clone().requires_grad_(True)
    ce = logits_cross_entropy(x, labels, ignore_index=IGNORE)
    (ce * weights).sum().backward()

    ref_x = logits.double().requires_grad_(True)
    ref = reference_rows(ref_x, labels)
    (ref * weights.double()).sum().backward()

    assert ce.dtype == torch.float32 and x.grad.dtype == dtype
    torch.testing.assert_close(ce.double(), ref.detach(), rtol=1e-5, atol=1e-5)
    again, top = logits_cross_entropy(logits, labels, ignore_index=IGNORE, with_argmax=True)  # DFlash's accuracy reads it
    assert torch.equal(again, ce.detach()) and torch.equal(top, logits.float().argmax(-1))
    assert (ce[labels == IGNORE] == 0).all() and (x.grad[labels == IGNORE] == 0).all()
    tol = 1e-6 if dtype == torch.float32 else 8e-3  # bf16: the gradient is rounded to bf16 once
    torch.testing.assert_close(x.grad.double(), ref_x.grad, rtol=0, atol=tol)


def test_equals_torch_cross_entropy_on_bf16_logits():
    """The call it replaces in ``block_loss``: ``F.cross_entropy(logits.float(), ..., reduction="none")``."""
    logits, labels, weights = case(torch.bfloat16, seed=1)
    a, b = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    ours = logits_cross_entropy(a, labels, ignore_index=IGNORE)
    theirs = torch.nn.functional.cross_entropy(b.float(), labels, ignore_index=IGNORE, reduction="none")
    (ours * weights).sum().backward()
    (theirs * weights).sum().backward()
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(a.grad.float(), b.grad.float(), rtol=0, atol=4e-3)  # both rounded to bf16 once


@pytest.mark.slow  # compiles on the CPU
def test_compiled_equals_eager():
    logits, labels, weights = case(torch.float32, seed=2)
    fn = lambda x: (logits_cross_entropy(x, labels, ignore_index=IGNORE) * weights).sum()  # noqa: E731
    a, b = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    fn(a).backward()
    torch.compile(fn, fullgraph=True)(b).backward()
    torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6)


def test_bad_shapes_are_rejected():
    with pytest.raises(ValueError, match=r"logits \(2, 3, 4\) and labels \(2, 3\); expected \[N, V\] and \[N\]"):
        logits_cross_entropy(torch.zeros(2, 3, 4), torch.zeros(2, 3, dtype=torch.long))
