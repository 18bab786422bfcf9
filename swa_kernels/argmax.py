"""Each row's first maximal index (``x.argmax(-1)``) over a few rows of a vocabulary's logits, in two Triton passes;
and a greedy verify on top of it (``greedy_values``: the accepted drafts and the token after them, in the same two).

A greedy speculative step takes the argmax of 1-16 rows of 152K logits (the verify's, the DFlash block's) and nothing
else of them. torch's reduction over fp32 logits took 11.2 µs for 16 rows on an H200, inductor's over the drafter's 15
rows 14.2 µs (a fp32 cast and a split reduction in torch ops, which this kernel replaced), where reading 16 bf16 rows
takes ~1.2 µs: a row's reduction runs on a few SMs. Here pass 1 (grid rows x chunks of ``BLOCK`` ids) writes each chunk's
maximum and its first index, pass 2 (one program a row) picks the first chunk holding the row's maximum, so the logits
are read once, in their own dtype (the greedy step needs no fp32 copy: the cast is exact, the argmax the same).

Ties resolve as torch's do: the smallest index holding the maximum. Rows are assumed free of NaN (logits of a finite
model); a row of -inf gives 0, as torch's. ``row_argmax`` runs torch's argmax where Triton or a GPU is absent (the
CPU), and through a custom op (``swa_drafters::row_argmax``) on a GPU, opaque to torch.compile as the other kernels.

Triton is public API here (``triton.jit``, ``triton.language``); ``available`` says whether it imported.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU wheels of torch come without Triton
    triton = tl = None

available = triton is not None
BLOCK = 4096  # ids a pass-1 program reads: 38 chunks of Qwen3's 151,936, 608 programs for 16 rows
INT32_MAX = 2**31 - 1

if available:

    @triton.jit
    def _chunk_max(x_ptr, value_ptr, index_ptr, V, stride_row, CHUNKS, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)  # row * stride_row passes 2^31 from 14,135 rows of a 151,936 vocabulary
        chunk = tl.program_id(1)
        ids = chunk * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_row + ids, mask=ids < V, other=float("-inf")).to(tl.float32)
        best = tl.max(x, axis=0)
        # the first id holding the maximum (ids past V hold -inf: never before a real id, which every chunk has)
        first = tl.min(tl.where(x == best, ids, 2147483647), axis=0)
        tl.store(value_ptr + row * CHUNKS + chunk, best)
        tl.store(index_ptr + row * CHUNKS + chunk, first)

    @triton.jit
    def _pick_chunk(value_ptr, index_ptr, out_ptr, CHUNKS, BLOCK_C: tl.constexpr):
        row = tl.program_id(0)
        c = tl.arange(0, BLOCK_C)
        ok = c < CHUNKS
        values = tl.load(value_ptr + row * CHUNKS + c, mask=ok, other=float("-inf"))
        firsts = tl.load(index_ptr + row * CHUNKS + c, mask=ok, other=2147483647)
        best = tl.max(values, axis=0)
        # chunks cover ascending ids, so the smallest first-index among the chunks at the maximum is the row's first
        tl.store(out_ptr + row, tl.min(tl.where(values == best, firsts, 2147483647), axis=0).to(tl.int64))


    @triton.jit
    def _greedy_values(value_ptr, index_ptr, ids_ptr, forced_ptr, out_ptr, N, CHUNKS, BLOCK_C: tl.constexpr,
                       BLOCK_T: tl.constexpr):
        # one program a batch row: its n token rows' argmax from pass 1's chunk maxima (as ``_pick_chunk``), then the
        # greedy verify over them: a = the drafts ids[1:]'s prefix equal to the argmax at the positions before, the
        # token after it the argmax at row a; ``forced`` >= 0 replaces a (benchmarks). Writes [a, ids[1:], token].
        b = tl.program_id(0)
        c = tl.arange(0, BLOCK_C)
        ok = c < CHUNKS
        forced = tl.load(forced_ptr + b)
        accepted = b * 0  # loop-carried int32 scalars
        alive = b * 0 + 1
        following = (b * 0).to(tl.int64)
        at_forced = (b * 0).to(tl.int64)
        for t in range(0, N):
            row = b * N + t
            values = tl.load(value_ptr + row * CHUNKS + c, mask=ok, other=float("-inf"))
            firsts = tl.load(index_ptr + row * CHUNKS + c, mask=ok, other=2147483647)
            token = tl.min(tl.where(values == tl.max(values, axis=0), firsts, 2147483647), axis=0).to(tl.int64)
            following = tl.where(alive == 1, token, following)  # while every draft so far matched: row t is the next
            draft = tl.load(ids_ptr + b * N + t + 1, mask=t + 1 < N, other=-1)
            alive = tl.where((alive == 1) & (t + 1 < N) & (draft == token), 1, 0)
            accepted += alive
            at_forced = tl.where(t == forced, token, at_forced)
        use_forced = forced >= 0
        tl.store(out_ptr + b * (N + 1), tl.where(use_forced, forced, accepted.to(tl.int64)))
        tl.store(out_ptr + b * (N + 1) + N, tl.where(use_forced, at_forced, following))
        j = tl.arange(0, BLOCK_T)
        drafts = (j >= 1) & (j < N)
        tl.store(out_ptr + b * (N + 1) + j, tl.load(ids_ptr + b * N + j, mask=drafts), mask=drafts)


def _chunk_maxima(x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # pass 1 over x2 [R, V]: each chunk's maximum and first index, [R, chunks] each
    rows, v = x2.shape
    chunks = triton.cdiv(v, BLOCK)
    values = torch.empty(rows, chunks, dtype=torch.float32, device=x2.device)
    firsts = torch.empty(rows, chunks, dtype=torch.int32, device=x2.device)
    _chunk_max[(rows, chunks)](x2, values, firsts, v, x2.stride(0), chunks, BLOCK=BLOCK, num_warps=4)
    return values, firsts


def _launch(x2: torch.Tensor) -> torch.Tensor:
    # x2 [R, V], last dim contiguous -> int64 [R]
    values, firsts = _chunk_maxima(x2)
    out = torch.empty(x2.shape[0], dtype=torch.int64, device=x2.device)
    _pick_chunk[(x2.shape[0],)](values, firsts, out, values.shape[1], BLOCK_C=triton.next_power_of_2(values.shape[1]), num_warps=1)
    return out


def _launch_greedy(x2: torch.Tensor, ids: torch.Tensor, forced: torch.Tensor) -> torch.Tensor:
    # x2 [B*n, V], ids [B, n] int64, forced [B] int64 -> values [B, n+1]
    b, n = ids.shape
    values, firsts = _chunk_maxima(x2)
    out = torch.empty(b, n + 1, dtype=torch.int64, device=x2.device)
    _greedy_values[(b,)](values, firsts, ids, forced, out, n, values.shape[1], BLOCK_C=triton.next_power_of_2(values.shape[1]),
                         BLOCK_T=triton.next_power_of_2(n + 1), num_warps=1)
    return out


def check(x: torch.Tensor) -> None:
    if x.dim() < 1 or x.shape[-1] == 0 or x.shape[-1] > INT32_MAX:
        raise ValueError(f"row_argmax: logits of shape {tuple(x.shape)}; expected [..., V] with 1 <= V < 2**31")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"row_argmax: dtype {x.dtype}; expected float32, float16 or bfloat16")


if available:

    @torch.library.custom_op("swa_drafters::row_argmax", mutates_args=())
    def _row_argmax_op(x2: torch.Tensor) -> torch.Tensor:
        return _launch(x2)

    @_row_argmax_op.register_fake
    def _(x2):
        return x2.new_empty(x2.shape[0], dtype=torch.int64)

    @torch.library.custom_op("swa_drafters::greedy_values", mutates_args=())
    def _greedy_values_op(x2: torch.Tensor, ids: torch.Tensor, forced: torch.Tensor) -> torch.Tensor:
        return _launch_greedy(x2, ids, forced)

    @_greedy_values_op.register_fake
    def _(x2, ids, forced):
        return ids.new_empty(ids.shape[0], ids.shape[1] + 1)


def row_argmax(x: torch.Tensor, kernel: bool | None = None) -> torch.Tensor:
    """``x.argmax(-1)`` for x ``[..., V]``: the two-pass kernel on a GPU with Triton (``kernel=None``), torch's argmax
    elsewhere; ``kernel=True`` forces the kernel (Triton's interpreter runs it on the CPU in the tests)."""
    check(x)
    use = (available and x.is_cuda) if kernel is None else kernel
    if not use:
        return x.argmax(dim=-1)
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.ops.swa_drafters.row_argmax(x2) if x.is_cuda else _launch(x2)
    return out.view(x.shape[:-1])


def greedy_values(logits: torch.Tensor, ids: torch.Tensor, forced: torch.Tensor) -> torch.Tensor:
    """A greedy verify in two kernels: ``logits`` [B, n, V] of a block ``ids`` [B, n] (each row's newest token, then n-1
    drafts), ``forced`` [B] int64 (-1: none) -> int64 [B, n+1]: the accepted drafts a (their prefix equal to the argmax
    at the positions before), the n-1 drafts, and the argmax at row a (where ``forced[b] >= 0``, a is that instead).
    ``StaticTarget.greedy_step``'s graph on a GPU; its CPU path computes the same in torch ops (the tests compare them)."""
    check(logits)
    b, n = ids.shape
    if logits.shape[:2] != (b, n) or ids.dtype != torch.long or forced.shape != (b,) or forced.dtype != torch.long:
        raise ValueError(f"greedy_values: logits {tuple(logits.shape)}, ids {tuple(ids.shape)} {ids.dtype}, forced "
                         f"{tuple(forced.shape)} {forced.dtype}; expected [B, n, V], int64 [B, n], int64 [B]")
    x2 = logits.reshape(b * n, logits.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    ids = ids.contiguous()
    return torch.ops.swa_drafters.greedy_values(x2, ids, forced) if logits.is_cuda else _launch_greedy(x2, ids, forced)
