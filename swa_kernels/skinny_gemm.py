"""Products of a few rows with a large weight matrix (``y = x @ w.T``, x ``[M <= 16, K]``), in Triton: the shapes of a
speculative step (a 16-token verify, a DFlash block pass), which read every weight once and do almost no arithmetic.

cuBLAS runs these at 2.3-2.7 TB/s on an H100 (``benchmarks/profile_decode_loop.py``: q|k|v 2.3, o_proj 2.3,
gate|up 2.7, down 2.6), where a plain device copy reaches 3.0. This kernel streams the weight in
``[BLOCK_N, BLOCK_K]`` tiles (``num_stages`` in flight), multiplies them with the 16 (padded) rows on the tensor
cores and, where ``N / BLOCK_N`` programs would not fill the GPU, splits K over ``splits`` programs whose fp32
partial sums a second (tiny) reduction adds: deterministic, no atomics, so a row's result does not depend on the
others'. ``Config`` picks the tiling; ``benchmarks/skinny_gemm.py`` measures the choices against cuBLAS.

The same kernel multiplies weight-only int8 matrices (``swa_kernels/int8_weights.py``: ``SCALED``, a per-column scale on the
fp32 sums) over any number of rows, in blocks of ``BLOCK_M`` (each block streams the matrix again; the tiles are
loaded ``evict_first``, as for one read).

Triton is public API here (``triton.jit``, ``triton.language``); ``available`` says whether it imported.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU wheels of torch come without Triton
    triton = None

available = triton is not None
MAX_ROWS = 16  # tl.dot's smallest M: fewer rows are padded (masked loads, no reads)


@dataclass(frozen=True)
class Config:
    block_n: int = 64
    block_k: int = 256
    splits: int = 1  # K split over this many programs (K must divide into splits * block_k)
    num_warps: int = 4
    num_stages: int = 4


if available:

    @triton.jit
    def _skinny_mm(x_ptr, w_ptr, s_ptr, out_ptr, M, N, K_PER_SPLIT, stride_xm, stride_wn, stride_os, stride_om,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SCALED: tl.constexpr,
                   W_EVICTION: tl.constexpr):
        # SCALED: w holds int8 values, each output column n scaled by s[n] (weight-only int8, ``int8_linear``); the
        # int8 tile is widened to x's dtype before the product (exact: |q| <= 127), the scale applied to the fp32 sums.
        # Row blocks are the fastest grid axis: the programs of one weight tile run side by side, so only the first
        # reads it from memory and the others from L2 (W_EVICTION "evict_last"); a single row block reads each tile
        # once ("evict_first": keep it out of L2)
        pid_m = tl.program_id(0)  # blocks of BLOCK_M rows (one block for the few-row products)
        pid_n = tl.program_id(1)
        pid_s = tl.program_id(2)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        k_start = pid_s * K_PER_SPLIT
        x_ptrs = x_ptr + offs_m[:, None] * stride_xm + (k_start + offs_k)[None, :]
        w_ptrs = w_ptr + offs_n[:, None] * stride_wn + (k_start + offs_k)[None, :]
        row_ok = offs_m[:, None] < M
        col_ok = offs_n[:, None] < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for _ in range(0, K_PER_SPLIT, BLOCK_K):
            x = tl.load(x_ptrs, mask=row_ok, other=0.0)
            w = tl.load(w_ptrs, mask=col_ok, other=0, eviction_policy=W_EVICTION)
            if SCALED:
                w = w.to(x.dtype)
            acc += tl.dot(x, tl.trans(w))
            x_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        if SCALED:
            acc = acc * tl.load(s_ptr + offs_n, mask=offs_n < N, other=0.0)[None, :]
        out = out_ptr + pid_s * stride_os + offs_m[:, None] * stride_om + offs_n[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok & (offs_n[None, :] < N))

    @triton.jit
    def _sum_splits(part_ptr, out_ptr, SPLITS, numel, BLOCK: tl.constexpr):
        # the K splits' fp32 partial sums [SPLITS, numel] -> their sum in out's dtype, split 0 first (deterministic):
        # one kernel where torch's sum over dim 0 and the cast took two (~4 us a product at 16 rows on an H200)
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < numel
        acc = tl.load(part_ptr + offs, mask=ok, other=0.0)
        for s in range(1, SPLITS):
            acc += tl.load(part_ptr + s * numel + offs, mask=ok, other=0.0)
        tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=ok)


def check(x: torch.Tensor, w: torch.Tensor, config: Config) -> None:
    m, k = x.shape
    if m > MAX_ROWS:
        raise ValueError(f"skinny_gemm: {m} rows; at most {MAX_ROWS}")
    if w.shape[1] != k or not w.is_contiguous() or x.stride(1) != 1:
        raise ValueError(f"skinny_gemm: x {tuple(x.shape)} and a contiguous w [N, {k}] expected, got w {tuple(w.shape)}")
    if k % (config.splits * config.block_k):
        raise ValueError(f"skinny_gemm: K={k} does not divide into {config.splits} splits of {config.block_k}-wide tiles")


def linear(x: torch.Tensor, w: torch.Tensor, config: Config = Config()) -> torch.Tensor:
    """``F.linear(x, w)`` for x ``[..., K]`` of at most 16 rows in all, w ``[N, K]`` (no bias), in x's dtype."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    return _products(x2, w, config).view(*lead, w.shape[0])


def _products(x2: torch.Tensor, w: torch.Tensor, config: Config, scale: torch.Tensor | None = None,
              block_m: int = MAX_ROWS, partials: bool = False) -> torch.Tensor:
    # x2 [M, K] -> a fresh [M, N] (no view of anything: what a custom op may return); with ``scale`` w is int8 and
    # column n is scaled by scale[n]; M over ceil(M / block_m) row blocks (a weight tile's row blocks run together).
    # partials: the K splits' fp32 sums [splits, M, N] as they are (``split_partials``: the caller adds them up)
    if scale is None:
        check(x2, w, config)
    m, k = x2.shape
    n = w.shape[0]
    if config.splits == 1 and not partials:
        out = torch.empty(m, n, dtype=x2.dtype, device=x2.device)
        stride_split = 0  # one split: program_id(2) is 0
    else:
        out = torch.empty(config.splits, m, n, dtype=torch.float32, device=x2.device)
        stride_split = out.stride(0)
    row_blocks = triton.cdiv(m, block_m)
    grid = (row_blocks, triton.cdiv(n, config.block_n), config.splits)
    _skinny_mm[grid](x2, w, w if scale is None else scale, out, m, n, k // config.splits, x2.stride(0), w.stride(0),
                     stride_split, out.stride(-2), BLOCK_M=block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                     SCALED=scale is not None, W_EVICTION="evict_first" if row_blocks == 1 else "evict_last",
                     num_warps=config.num_warps, num_stages=config.num_stages)
    if config.splits == 1 or partials:
        return out
    total = torch.empty(m, n, dtype=x2.dtype, device=x2.device)
    _sum_splits[(triton.cdiv(m * n, 1024),)](out, total, config.splits, m * n, BLOCK=1024)
    return total


# Tilings at Qwen3-8B's widths where the kernel beat cuBLAS; ``few_row_linear`` runs these shapes through the kernel and
# every other one through cuBLAS (where the kernel lost or was not measured). One tiling a shape, whatever the row count
# (1 .. 16): a row's sums then do not depend on how many rows the product has (a decode step's and a verify's agree).
# The first four measured on an H100, 16 rows, each product captured alone (``benchmarks/skinny_gemm.py``, BENCHMARKS.md
# "Few-row products in Triton"). o_proj and down_proj lost to cuBLAS alone, but cuBLAS splits their K and adds the
# splits in a kernel of its own; this kernel's fp32 partials, added inside the residual add and the next norm that
# follow them under torch.compile (``split_partials``), beat it by one kernel and its launch gap a product: measured
# on an H200 with the add and the norm, 20 copies a graph (``benchmarks/split_k_norm.py``, BENCHMARKS.md "o_proj and
# down_proj with their K splits added in the next norm").
TUNED: dict[tuple[int, int], Config] = {
    (6144, 4096): Config(block_n=32, block_k=128, splits=1, num_warps=4, num_stages=4),  # q|k|v: 21.5 -> 20.6 us
    (24576, 4096): Config(block_n=32, block_k=128, splits=1, num_warps=4, num_stages=3),  # gate|up: 73.7 -> 70.9 us
    (151936, 4096): Config(block_n=128, block_k=256, splits=1, num_warps=4, num_stages=3),  # Qwen3's LM head: 441.6 -> 413.9 us
    (32000, 4096): Config(block_n=128, block_k=128, splits=1, num_warps=4, num_stages=3),  # a 32K draft head: 100.4 -> 90.2 us
    # H200, with the add and the norm after them: 16 rows 16.4 -> 14.2 us, 1 row 14.6 -> 14.2
    (4096, 4096): Config(block_n=32, block_k=256, splits=2, num_warps=4, num_stages=4),  # o_proj
    # H200, with the add and the norm: 1 row 32.7 -> 29.5 us, 16 rows 31.3 -> 30.4 (its best 16-row tiling)
    (4096, 12288): Config(block_n=64, block_k=128, splits=4, num_warps=4, num_stages=4),  # down_proj
}

if available:

    @torch.library.custom_op("swa_drafters::skinny_linear", mutates_args=())
    def _skinny_linear(x2: torch.Tensor, w: torch.Tensor, block_n: int, block_k: int, splits: int, num_warps: int,
                       num_stages: int) -> torch.Tensor:
        # an opaque op to torch.compile (its graph calls it; CUDA graphs capture the launch)
        return _products(x2, w, Config(block_n, block_k, splits, num_warps, num_stages))

    @_skinny_linear.register_fake
    def _(x2, w, block_n, block_k, splits, num_warps, num_stages):
        return x2.new_empty(x2.shape[0], w.shape[0])

    @torch.library.custom_op("swa_drafters::skinny_partials", mutates_args=())
    def _skinny_partials(x2: torch.Tensor, w: torch.Tensor, block_n: int, block_k: int, splits: int, num_warps: int,
                         num_stages: int) -> torch.Tensor:
        return _products(x2, w, Config(block_n, block_k, splits, num_warps, num_stages), partials=True)

    @_skinny_partials.register_fake
    def _(x2, w, block_n, block_k, splits, num_warps, num_stages):
        return x2.new_empty(splits, x2.shape[0], w.shape[0], dtype=torch.float32)


def split_partials(x: torch.Tensor, w: torch.Tensor, config: Config) -> torch.Tensor:
    """``F.linear(x, w)`` with the K splits' fp32 sums added in torch ops (``sum`` over the splits, one cast to x's
    dtype, the rounding cuBLAS makes): under torch.compile inductor folds that sum (at most 8 terms: unrolled) into the
    kernel that reads the product next (a residual add and the next norm), where cuBLAS's split-K and
    ``_sum_splits`` each pay a reduction kernel of their own."""
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    part = torch.ops.swa_drafters.skinny_partials(x2, w, config.block_n, config.block_k, config.splits, config.num_warps,
                                                  config.num_stages)
    return part.sum(0).to(x.dtype).view(*x.shape[:-1], w.shape[0])


def tuned_config(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> Config | None:
    """The measured tiling for this product, or None where cuBLAS runs it: a CPU tensor, no Triton, a bias, more than
    16 rows, a shape not in ``TUNED``, a non-contiguous weight, an fp32 product (the tilings were measured in bf16: in
    fp32 ``tl.dot`` rounds its inputs to TF32, 3.7e-3 from fp64 where cuBLAS is 2.5e-6, and the 152K head's tiling
    needs 288 KiB of shared memory, more than a Hopper SM has)."""
    if not (available and x.is_cuda and bias is None and w.is_contiguous() and x.dtype == w.dtype
            and x.dtype in (torch.bfloat16, torch.float16)):
        return None
    rows = x.numel() // x.shape[-1]
    return TUNED.get(tuple(w.shape)) if rows <= MAX_ROWS else None


def few_row_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, w, bias)``: through the kernel where ``tuned_config`` has a tiling, else ``F.linear``. The
    results equal cuBLAS's within bf16 rounding (fp32 accumulation both; the summation order differs). A tiling that
    splits K: under torch.compile its fp32 partials and their sum in torch ops (``split_partials``), else the kernel's
    own reduction (``_sum_splits``). The splits are the same both ways; compiled, inductor may add the sum to what
    follows (a residual) before rounding it, one bf16 rounding where the eager path makes two."""
    config = tuned_config(x, w, bias)
    if config is None:
        return torch.nn.functional.linear(x, w, bias)
    if config.splits > 1 and torch.compiler.is_compiling():  # the splits' sum left to inductor to fold into what follows
        return split_partials(x, w, config)
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.ops.swa_drafters.skinny_linear(x2, w, config.block_n, config.block_k, config.splits, config.num_warps,
                                               config.num_stages)
    return out.view(*x.shape[:-1], w.shape[0])
