"""swa_kernels/row_stats.py (one pass: each row's log-sum-exp and argmax) against a row-by-row float64 reference and
``torch.argmax``: on the CPU under Triton's interpreter (fp32 and fp16; the interpreter has no bf16), on a GPU compiled
(bf16, and inside a compiled cross-entropy)."""

from __future__ import annotations

import pytest
import torch

from swa_kernels.row_stats import reference_row_stats, row_stats
from triton_interpreter import run_interpreted

# rows that exercise the single-pass bookkeeping: ties inside a chunk and across chunks (the first column must win),
# the maximum in a later chunk, -inf columns, a row of -inf only, a vocabulary not a multiple of the chunk
CASE_BUILDER = """
import torch
def rows(n, v, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, v, generator=gen) * 4).to(dtype)
    x[0, 3] = x[0, v - 2] = 1000          # a tie across chunks: column 3 wins
    x[1, 5] = x[1, 6] = 1000              # a tie inside one chunk
    x[2, v - 1] = 1000                    # the maximum in the last (partial) chunk
    x[3, : v // 2] = float("-inf")        # -inf columns
    x[4] = float("-inf")                  # a row of -inf only: log-sum-exp -inf, argmax 0
    if n > 5:
        x[5, v // 2] = float("inf")       # a +inf logit: log-sum-exp +inf (the running shift made it NaN), argmax there
    return x
def reference(x):
    lse = torch.stack([torch.logsumexp(r.double(), 0) for r in x]).float()
    return lse, x.float().argmax(-1)
"""

SCRIPT = CASE_BUILDER + """
from swa_kernels import row_stats as rs
for dtype in (torch.float32, torch.float16):
    for n, v, block in [(9, 301, 64), (6, 64, 64), (7, 1000, 256), (5, 17, 32)]:
        x = rows(n, v, dtype)
        lse, top = torch.ops.swa_drafters.row_logsumexp_argmax(x, block, 4)
        ref_lse, ref_top = reference(x)
        assert lse.dtype == torch.float32 and top.dtype == torch.int64 and lse.shape == top.shape == (n,)
        assert torch.equal(top, ref_top), (dtype, n, v, top, ref_top)
        torch.testing.assert_close(lse, ref_lse, rtol=1e-5, atol=1e-5)
print("ok")
"""


def test_cpu_path_is_the_reference() -> None:
    exec(CASE_BUILDER, ns := {})
    x = ns["rows"](9, 301, torch.bfloat16)
    lse, top = row_stats(x)
    ref_lse, ref_top = ns["reference"](x)
    assert torch.equal(top, ref_top)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-6, atol=1e-6)
    assert torch.equal(top, reference_row_stats(x)[1])


def test_bad_shape_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"row_stats: x \(2, 3, 4\); expected \[N, V\]"):
        row_stats(torch.zeros(2, 3, 4))


@pytest.mark.slow  # the Triton interpreter
def test_kernel_equals_the_reference_under_the_interpreter() -> None:
    pytest.importorskip("triton")
    out = run_interpreted(SCRIPT)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("n,v", [(4096, 8192), (300, 151936), (33, 1000)])
def test_kernel_equals_the_reference_on_a_gpu(n: int, v: int) -> None:
    exec(CASE_BUILDER, ns := {})
    x = ns["rows"](n, v, torch.bfloat16).cuda()
    lse, top = row_stats(x)
    ref_lse, ref_top = ns["reference"](x.cpu())
    assert torch.equal(top.cpu(), ref_top)
    torch.testing.assert_close(lse.cpu(), ref_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_compiled_cross_entropy_with_the_kernel_equals_eager_reference() -> None:
    from train.cross_entropy import logits_cross_entropy

    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(2048, 8192, generator=gen) * 4).to(torch.bfloat16)
    labels = torch.randint(0, 8192, (2048,), generator=gen)
    labels[::7] = -100
    weights = torch.rand(2048, generator=gen)

    def loss(x, lab, w):
        ce, top = logits_cross_entropy(x, lab, ignore_index=-100, with_argmax=True)
        return (ce * w).sum(), top

    a = logits.clone().requires_grad_(True)  # CPU: the pure-PyTorch arithmetic
    ref_loss, ref_top = loss(a, labels, weights)
    ref_loss.backward()
    b = logits.cuda().requires_grad_(True)
    got_loss, got_top = torch.compile(loss, fullgraph=True)(b, labels.cuda(), weights.cuda())
    got_loss.backward()
    assert torch.equal(got_top.cpu(), ref_top)
    torch.testing.assert_close(got_loss.cpu(), ref_loss, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(b.grad.float().cpu(), a.grad.float(), rtol=0, atol=4e-3)
