"""Weight-only int8 matrices for a drafter's products (W8A16): a weight [N, K] stored as int8, one fp32 scale per output
row, ``q = round(w / s)`` with ``s = max |w_row| / 127``, and ``y = (x @ q.T) * s``.

Why: at real scale a speculative step's drafter pass reads every drafter weight (and, for DFlash, the target's LM head)
for a few rows, so its time is its bytes; int8 halves them. Only drafters take it: the target's products are never
quantized, so the loop's output stays the target's own; the drafts move by the rounding (BENCHMARKS.md measures τ with
int8 drafter weights beside the model's own, and prompt lookup's).

On CUDA with Triton and bf16/fp16 activations the products run ``swa_kernels/skinny_gemm.py``'s kernel on the int8 tiles
(each widened to the activations' dtype, exact for |q| <= 127; the scale applied to the fp32 sums), rows in blocks of
16 to 128, a weight tile's row blocks side by side (it comes from memory once, then from L2). Measured at Qwen3-8B's
widths on an H200 (BENCHMARKS.md, "int8 products by row count"): up to 32 rows the int8 products beat cuBLAS on the bf16
matrix by the bytes they save (1-16 rows: 1.0-2.0x, the larger the matrix the more; 32 rows: 0.84-1.5x), at 64 rows
they run 0.5-1.0x its speed, and past that the kernel is compute-bound (~400 TFLOP/s at most), 1.3-3.0x slower than
cuBLAS: int8 drafter weights serve the few-row steps of batch 1-2 (DFlash's block pass is batch x 16 rows), not large
batches or long prefills. Elsewhere (the CPU, fp32 activations, no Triton) the integer matrix is kept as a float copy
in the compute dtype (oneDNN-prepacked on the CPU in fp32, as the model's own matrices are there) and the scale follows
the product: the same arithmetic, for measuring τ anywhere.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from swa_kernels import skinny_gemm

QMAX = 127  # symmetric: -127 .. 127 (the int8 -128 unused, so negating a row negates its codes)
KERNEL_DTYPES = (torch.bfloat16, torch.float16)
DRAFTER_WEIGHTS = ("model", "int8")  # a drafter's ``weights=``: its matrices as the model holds them, or int8 copies


def check_weights(weights: str) -> str:
    if weights not in DRAFTER_WEIGHTS:
        raise ValueError(f"weights={weights!r}; expected one of {', '.join(DRAFTER_WEIGHTS)} (the drafter's matrices as "
                         "the model holds them, or weight-only int8 copies)")
    return weights


@dataclass
class Int8Weight:
    """One matrix in int8 with its per-row scales, and (where the kernel does not run) its float copy."""

    q: torch.Tensor  # [N, K] int8
    scale: torch.Tensor  # [N] fp32
    dense: torch.Tensor | None  # q in the compute dtype (maybe prepacked) for the non-kernel path; None: the kernel runs all

    @property
    def shape(self) -> torch.Size:
        return self.q.shape


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (q [N, K] int8, scale [N] fp32) with ``q * scale[:, None]`` nearest to w, row by row (round half to
    even); an all-zero row gets scale ``tiny`` and codes 0."""
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"quantize_rows: a floating-point matrix [N, K] expected, got {w.dtype} {tuple(w.shape)}")
    w32 = w.float()
    scale = w32.abs().amax(dim=1).div(QMAX).clamp_min(torch.finfo(torch.float32).tiny)
    q = torch.round(w32 / scale[:, None]).clamp_(-QMAX, QMAX).to(torch.int8)
    return q, scale


def kernel_runs(w: torch.Tensor) -> bool:
    """Whether products with this (float) matrix's int8 copy run the Triton kernel: CUDA, Triton, bf16/fp16, K a
    multiple of 16 (the smallest tile)."""
    return w.is_cuda and skinny_gemm.available and w.dtype in KERNEL_DTYPES and w.shape[1] % 16 == 0


def int8_weight(w: torch.Tensor, pack: Callable[[torch.Tensor], torch.Tensor] = lambda m: m) -> Int8Weight:
    """``w``'s int8 copy; where the kernel does not run, with the float copy of its codes (``pack``ed: e.g.
    ``models.static_target.prepacked_copy`` on the CPU)."""
    q, scale = quantize_rows(w)
    return Int8Weight(q, scale, None if kernel_runs(w) else pack(q.to(w.dtype)))


def dequantized(w: Int8Weight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The matrix the int8 copy stands for, ``q * scale`` [N, K] (references and tests)."""
    return (w.q.float() * w.scale[:, None]).to(dtype)


def config_for(m: int, n: int, k: int) -> tuple[skinny_gemm.Config, int]:
    """The kernel's tiling for x [m, k] @ q[n, k].T and its row block: up to 64 rows, 64 columns of 128-wide K tiles
    on 4 warps; more rows, 128 x 128 tiles on 8 warps in 3 stages (the best of the search at 128 and 512 rows on an
    H200: ~400 TFLOP/s against ~270 for the small tiles, which are compute-bound past ~32 rows). K split until the
    programs fill ~2 waves of an H100/H200's 132 SMs (a few-row product has too few column blocks otherwise)."""
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64 if m <= 64 else 128
    block_k = next(b for b in (128, 64, 32, 16) if k % b == 0)
    block_n = 64 if block_m <= 64 else 128
    programs = -(-n // block_n) * -(-m // block_m)
    splits = 1
    while programs * splits < 264 and splits < 8 and k % (2 * splits * block_k) == 0:
        splits *= 2
    warps, stages = (4, 4) if block_m <= 64 else (8, 3)
    return skinny_gemm.Config(block_n=block_n, block_k=block_k, splits=splits, num_warps=warps, num_stages=stages), block_m


if skinny_gemm.available:

    @torch.library.custom_op("swa_drafters::int8_linear", mutates_args=())
    def _int8_linear(x2: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, block_m: int, block_n: int, block_k: int,
                     splits: int, num_warps: int, num_stages: int) -> torch.Tensor:
        # opaque to torch.compile; CUDA graphs capture the launch
        return skinny_gemm._products(x2, q, skinny_gemm.Config(block_n, block_k, splits, num_warps, num_stages), scale, block_m)

    @_int8_linear.register_fake
    def _(x2, q, scale, block_m, block_n, block_k, splits, num_warps, num_stages):
        return x2.new_empty(x2.shape[0], q.shape[0])


def int8_linear(x: torch.Tensor, w: Int8Weight, bias: torch.Tensor | None = None,
                dense_linear: Callable = F.linear) -> torch.Tensor:
    """``F.linear(x, q * scale, bias)`` in x's dtype: the kernel where it runs (``kernel_runs``), else ``dense_linear``
    (the caller's product for its float matrices) over the codes, then the scale."""
    n, k = w.q.shape
    if w.dense is None:
        if x.dtype not in KERNEL_DTYPES or not x.is_cuda:
            raise ValueError(f"int8_linear: the kernel's int8 weights take bf16/fp16 CUDA activations, got {x.dtype} on {x.device}")
        x2 = x.reshape(-1, k).contiguous()
        config, block_m = config_for(x2.shape[0], n, k)
        out = torch.ops.swa_drafters.int8_linear(x2, w.q, w.scale, block_m, config.block_n, config.block_k, config.splits,
                                                 config.num_warps, config.num_stages).view(*x.shape[:-1], n)
    else:
        out = (dense_linear(x, w.dense, None).float() * w.scale).to(x.dtype)
    return out if bias is None else out + bias


class Int8Linear(nn.Module):
    """``nn.Linear``'s forward over an int8 copy of its weight (``int8_linear``), for drafters that run through their
    modules (EAGLE-3). Its ``weight`` is gone; ``in_features``/``out_features``/``bias`` stay."""

    def __init__(self, linear: nn.Linear, pack: Callable[[torch.Tensor], torch.Tensor] = lambda m: m):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.int8 = int8_weight(linear.weight.data, pack)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return int8_linear(x, self.int8, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weight, bias={self.bias is not None}"


@torch.no_grad()
def int8_linears(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose every ``nn.Linear`` is an ``Int8Linear``; everything else (embeddings, norms, buffers)
    shared with the original, which is left as it is. A model without ``nn.Linear`` comes back as the same object."""
    if not any(isinstance(m, nn.Linear) for m in model.modules()):
        return model
    shared = {id(t): t for t in list(model.parameters()) + list(model.buffers())}  # no tensor copied
    quantized = copy.deepcopy(model, memo=shared)
    for name, module in list(quantized.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, child_name, Int8Linear(child))
    return quantized
