"""swa_kernels/skinny_gemm.py against torch's product, element by element within rounding: on the CPU under Triton's
interpreter (fp32 and fp16; the interpreter has no bf16), on a GPU compiled (bf16)."""

from __future__ import annotations

import pytest
import torch

from triton_interpreter import run_interpreted

triton = pytest.importorskip("triton")

CASES = "[(16, 200, 512, (64, 128, 2)), (1, 130, 256, (32, 128, 1)), (5, 64, 1024, (64, 256, 4)), (16, 96, 256, (32, 128, 2))]"
SCRIPT = f"""
import torch
from swa_kernels import skinny_gemm as sg
torch.manual_seed(0)
for dtype in (torch.float32, torch.float16):
    for m, n, k, (bn, bk, splits) in {CASES}:
        x, w = torch.randn(m, k).to(dtype), torch.randn(n, k).to(dtype)
        y = sg.linear(x, w, sg.Config(block_n=bn, block_k=bk, splits=splits))
        assert y.dtype == dtype and y.shape == (m, n)
        torch.testing.assert_close(y.float(), x.float() @ w.float().T, rtol=1e-2, atol=5e-2 if dtype == torch.float16 else 1e-3)
        # the custom op few_row_linear calls (what torch.compile sees): the same products, a fresh [M, N]
        z = torch.ops.swa_drafters.skinny_linear(x, w, bn, bk, splits, 4, 3)
        assert z.shape == (m, n) and z._base is None
        torch.testing.assert_close(z, y, rtol=0, atol=0)
        # the splits' fp32 partials (``split_partials``): each split's own sum over its K range, added in torch ops
        part = torch.ops.swa_drafters.skinny_partials(x, w, bn, bk, splits, 4, 3)
        assert part.shape == (splits, m, n) and part.dtype == torch.float32
        kk = k // splits
        for s in range(splits):
            torch.testing.assert_close(part[s], x[:, s * kk:(s + 1) * kk].float() @ w[:, s * kk:(s + 1) * kk].float().T,
                                       rtol=1e-2, atol=5e-2 if dtype == torch.float16 else 1e-3)
        torch.testing.assert_close(sg.split_partials(x, w, sg.Config(bn, bk, splits)), y, rtol=1e-3,
                                   atol=2e-2 if dtype == torch.float16 else 1e-4)
print("ok")
"""


@pytest.mark.slow  # the Triton interpreter
def test_products_equal_torchs_under_the_interpreter() -> None:
    out = run_interpreted(SCRIPT)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def test_bad_shapes_are_refused_in_one_line() -> None:
    from swa_kernels import skinny_gemm as sg

    with pytest.raises(ValueError, match="17 rows; at most 16"):
        sg.check(torch.zeros(17, 256), torch.zeros(8, 256), sg.Config())
    with pytest.raises(ValueError, match="K=300 does not divide"):
        sg.check(torch.zeros(2, 300), torch.zeros(8, 300), sg.Config())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bf16_products_on_the_gpu() -> None:
    from swa_kernels import skinny_gemm as sg

    torch.manual_seed(0)
    for m, (n, k), config in [(16, (6144, 4096), sg.Config(32, 128, 1)), (1, (4096, 12288), sg.Config(32, 128, 4))]:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        torch.testing.assert_close(sg.linear(x, w, config).float(), (x.float() @ w.float().T), rtol=2e-2, atol=2e-1)


def test_only_measured_shapes_on_a_gpu_take_the_kernel() -> None:
    """``few_row_linear``'s routing: the kernel for a TUNED shape of at most 16 rows on CUDA without a bias; cuBLAS
    (``F.linear``, the same numbers) for everything else, the CPU included."""
    from swa_kernels import skinny_gemm as sg

    x, w = torch.randn(3, 64), torch.randn(24, 64)
    assert sg.tuned_config(x, w) is None  # a CPU tensor
    torch.testing.assert_close(sg.few_row_linear(x, w, torch.ones(24)), torch.nn.functional.linear(x, w, torch.ones(24)))
    if torch.cuda.is_available():
        w8b = torch.empty(24576, 4096, device="cuda", dtype=torch.bfloat16)
        rows = lambda m: torch.empty(m, 4096, device="cuda", dtype=torch.bfloat16)  # noqa: E731
        assert sg.tuned_config(rows(16), w8b) == sg.TUNED[(24576, 4096)]
        assert sg.tuned_config(rows(17), w8b) is None  # more rows than the kernel takes
        assert sg.tuned_config(rows(16), w8b, torch.empty(24576, device="cuda", dtype=torch.bfloat16)) is None
        assert sg.tuned_config(rows(16), w8b[:, :2048]) is None  # not contiguous (and not measured)
        # fp32: tl.dot would round to TF32 (3.7e-3 from fp64 against cuBLAS's 2.5e-6) and the head's tiling would not fit
        assert sg.tuned_config(rows(16).float(), w8b.float()) is None
        x32, w32 = torch.randn(16, 4096, device="cuda"), torch.randn(6144, 4096, device="cuda")
        exact = (x32.double() @ w32.double().T)
        assert (sg.few_row_linear(x32, w32).double() - exact).abs().max() < 1e-3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_split_partials_folded_into_the_next_norm_on_the_gpu() -> None:
    """o_proj / down_proj at Qwen3-8B's widths (TUNED tilings that split K): compiled with the residual add and the norm
    after them (their splits' sum folded into that kernel), the result equals the fp32 product within bf16 rounding
    and the eager path (``_sum_splits``), and a row's result is the same in a 1-row and a 16-row product (one tiling
    whatever the row count: a decode step and a verify agree). Compiled, the sum is added to the residual in fp32 and
    rounded once (inductor drops the product's own bf16 rounding, as a fused epilogue would): within one bf16 step of
    the eager path's two roundings."""
    from models.static_target import rms_norm
    from swa_kernels import skinny_gemm as sg

    @torch.compile(dynamic=False)
    def layer_tail(x, resid, w, norm_w):
        h = resid + sg.few_row_linear(x, w)
        return h, rms_norm(h, norm_w, 1e-6)

    torch.manual_seed(0)
    for n, k in ((4096, 4096), (4096, 12288)):
        assert sg.TUNED[(n, k)].splits > 1
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
        norm_w = torch.rand(n, device="cuda", dtype=torch.bfloat16) + 0.5
        x = torch.randn(1, 16, k, device="cuda", dtype=torch.bfloat16)
        resid = torch.randn(1, 16, n, device="cuda", dtype=torch.bfloat16)
        h, normed = layer_tail(x, resid, w, norm_w)
        exact = resid.float() + (x.float() @ w.float().T).to(torch.bfloat16).float()
        torch.testing.assert_close(h.float(), exact, rtol=2e-2, atol=3e-2)
        eager = resid + sg.few_row_linear(x, w)  # the product rounded to bf16, then the add rounded
        torch.testing.assert_close(h.float(), eager.float(), rtol=8e-3, atol=8e-3)
        torch.testing.assert_close(normed, rms_norm(h, norm_w, 1e-6), rtol=2e-2, atol=2e-2)
        h1, normed1 = layer_tail(x[:, :1], resid[:, :1], w, norm_w)
        torch.testing.assert_close(h1, h[:, :1], rtol=0, atol=0)
        torch.testing.assert_close(normed1, normed[:, :1], rtol=0, atol=0)
