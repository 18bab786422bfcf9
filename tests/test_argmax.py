"""swa_kernels/argmax.py against torch's argmax, row by row: ties (the first index wins), rows of -inf, widths that
are not a multiple of the chunk, more than two dimensions; its greedy verify (``greedy_values``) against torch's argmax,
a cumulative product of matches and a gather, with drafts matching for 0 .. n-1 positions and forced counts; under
Triton's interpreter on the CPU (fp32, fp16), compiled on a GPU (bf16, fp32, and inside a captured graph)."""

from __future__ import annotations

import pytest
import torch

from triton_interpreter import run_interpreted

triton = pytest.importorskip("triton")

CASES = """
def cases(dtype, device="cpu"):
    torch.manual_seed(0)
    for rows, v in [(16, 151936 // 8), (1, 4096), (3, 4097), (5, 10000), (2, 7)]:
        x = torch.randn(rows, v, device=device).to(dtype)
        x[0, v // 2] = 100.0; x[0, v - 1] = 100.0  # a tie across chunks: the first index
        if rows > 1:
            x[1, :] = float("-inf")  # torch's argmax gives 0
        if rows > 2:
            x[2, 1] = 50.0; x[2, 0] = 50.0; x[2, 4096:] = 60.0  # a tie inside a chunk, the maximum in the second
        yield x
    yield torch.randn(2, 3, 5000, device=device).to(dtype)
"""

GREEDY = """
def greedy_cases(device="cpu"):
    torch.manual_seed(1)
    for b, n, v in [(1, 16, 5000), (3, 5, 4097), (2, 1, 300), (4, 9, 8192)]:
        logits = torch.randn(b, n, v, device=device)
        tokens = logits.argmax(-1)
        ids = torch.randint(0, v, (b, n), device=device)
        for row in range(b):  # row 0 matches every draft (the bonus token), row r its first 2r - 1
            k = n - 1 if row == 0 else min(2 * row - 1, n - 1)
            ids[row, 1:1 + k] = tokens[row, :k]
        for forced in (torch.full((b,), -1, device=device), torch.randint(0, n, (b,), device=device)):
            yield logits, ids, forced

def greedy_reference(logits, ids, forced):
    tokens = logits.argmax(-1)
    accepted = (ids[:, 1:] == tokens[:, :-1]).long().cumprod(-1).sum(-1)
    accepted = torch.where(forced >= 0, forced, accepted)
    return torch.cat([accepted[:, None], ids[:, 1:], tokens.gather(1, accepted[:, None])], 1)
"""

SCRIPT = CASES + GREEDY + """
import torch
from swa_kernels.argmax import row_argmax
for dtype in (torch.float32, torch.float16):
    for x in cases(dtype):
        got, want = row_argmax(x, kernel=True), x.argmax(-1)
        assert got.dtype == torch.int64 and torch.equal(got, want), (dtype, tuple(x.shape), got, want)
from swa_kernels.argmax import greedy_values
for logits, ids, forced in greedy_cases():
    got, want = greedy_values(logits, ids, forced), greedy_reference(logits, ids, forced)
    assert torch.equal(got, want), (tuple(logits.shape), got, want)
print("ok")
"""


@pytest.mark.slow  # the Triton interpreter (~5 s)
def test_row_argmax_equals_torchs_under_the_interpreter() -> None:
    out = run_interpreted(SCRIPT)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def test_bad_logits_are_refused_in_one_line() -> None:
    from swa_kernels.argmax import row_argmax

    with pytest.raises(ValueError, match=r"dtype torch.int64; expected float32"):
        row_argmax(torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"shape \(2, 0\); expected \[..., V\]"):
        row_argmax(torch.zeros(2, 0))
    from swa_kernels.argmax import greedy_values

    with pytest.raises(ValueError, match=r"greedy_values: logits \(1, 3, 7\), ids \(1, 4\) torch.int64"):
        greedy_values(torch.zeros(1, 3, 7), torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, dtype=torch.long))
    x = torch.randn(3, 9)  # the CPU without kernel=True: torch's own argmax
    assert torch.equal(row_argmax(x), x.argmax(-1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_row_argmax_on_the_gpu_compiled_and_captured() -> None:
    from swa_kernels.argmax import greedy_values, row_argmax

    scope = {"torch": torch}
    exec(CASES + GREEDY, scope)
    for logits, ids, forced in scope["greedy_cases"]("cuda"):
        assert torch.equal(greedy_values(logits.bfloat16(), ids, forced), scope["greedy_reference"](logits.bfloat16(), ids, forced))
    for dtype in (torch.bfloat16, torch.float32):
        for x in scope["cases"](dtype, "cuda"):
            assert torch.equal(row_argmax(x), x.argmax(-1)), (dtype, tuple(x.shape))
    x = torch.randn(16, 151936, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(lambda t: row_argmax(t * 2) + 1, fullgraph=True)
    assert torch.equal(compiled(x), (x * 2).argmax(-1) + 1)
    graph, out = torch.cuda.CUDAGraph(), None
    row_argmax(x)  # warm (compiles the kernels outside the capture)
    with torch.cuda.graph(graph):
        out = row_argmax(x)
    x.copy_(torch.randn_like(x))
    graph.replay()
    assert torch.equal(out, x.argmax(-1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_row_argmax_past_two_to_the_31_elements_on_the_gpu() -> None:
    """Row offsets in int64: from row 14,135 of a 151,936-id vocabulary ``row * stride`` passes 2^31 (int32 wrapped to
    another row's logits, or out of the buffer: an illegal memory access on an H200)."""
    from swa_kernels.argmax import row_argmax

    rows, v = 14_200, 151_936
    x = torch.randn(rows, v, device="cuda", dtype=torch.bfloat16)
    x[torch.arange(rows, device="cuda"), torch.arange(rows, device="cuda") * 7 % v] = 100.0  # each row's own maximum
    assert torch.equal(row_argmax(x), x.argmax(-1))
