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
