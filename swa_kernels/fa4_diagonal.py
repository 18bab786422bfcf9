"""FlashAttention-4's window backward with EAGLE-3's diagonal keys folded into its preprocess
(GPU only; imported lazily by ``swa_kernels.window_attention``).

FA4's backward runs three kernels: a preprocess (rowsum(dO * O), lse * log2(e), and a zeroed fp32
dQ accumulator), the main kernel (adds the band's dS @ K into the accumulator, writes dK, dV), and
a postprocess (dQ = scale * accumulator, in bf16). The diagonal keys' gradient needs rowsum(dO * O)
too, and adds its own share of dQ. Done apart (``diagonal_keys.diag_backward``) it reads q, dO, O
and dQ and writes dQ again after FA4 has finished: about 1 GB more traffic per step at 32K tokens.

Here one Triton kernel takes the preprocess's place: it reads q, O, dO and the diagonal keys once,
writes FA4's rowsum and lse * log2(e), the diagonal keys' gradients, and *starts* the accumulator at
the diagonal keys' share of dQ instead of zero; FA4's main kernel and postprocess then run as they
are, and the postprocess's dQ holds both shares. The accumulator's tile is stored in the order of
FA4's MMA fragments, not row-major: ``dq_accum_tile`` reads that order off FA4's own postprocess
(an encoded tile converted once), so nothing here restates FA4's layout. Only the preprocess is
swapped, for the length of one call (FA4's interface looks it up by name at each call), through
``swa_kernels.fa4_adapter`` (version and signatures checked first); the replacement takes exactly the
recorded parameters of FA4's preprocess and refuses what it does not implement.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .diagonal_keys import CONFIGS, _diagonal_grads, _program_rows, _row_offsets
from .fa4_adapter import interface, replacement_preprocess, swapped


@triton.autotune(CONFIGS, key=["S", "G", "D", "TM"])  # writes only: every config rewrites the same outputs
@triton.jit
def _diag_backward_into_fa4_kernel(Q, DO, O, LSE, DK, DV, DQACC, PERM, DPSUM, LSE2, DDK, DDV, scale, T, T_ROUND, HKV,
                                   sq_b, sq_h, sq_t, sg_b, sg_h, sg_t, so_b, so_h, so_t, sl_b, sl_h,
                                   sd_s, sd_b, sd_h, sd_t, sv_s, sv_b, sv_h, sv_t, sx_s, sx_b, sx_h, sx_t,
                                   S: tl.constexpr, G: tl.constexpr, D: tl.constexpr, TM: tl.constexpr, BT: tl.constexpr):
    # rows run to FA4's rounded length: the padded rows get FA4's preprocess values (0, +inf, 0)
    b, hk, h, t, in_tile = _program_rows(T_ROUND, HKV, G, BT)
    real = t < T
    m2 = real[:, None]
    q = tl.load(Q + _row_offsets(b, h, t, sq_b, sq_h, sq_t, D), mask=m2, other=0.0).to(tl.float32)
    do = tl.load(DO + _row_offsets(b, h, t, sg_b, sg_h, sg_t, D), mask=m2, other=0.0).to(tl.float32)
    o = tl.load(O + _row_offsets(b, h, t, so_b, so_h, so_t, D), mask=m2, other=0.0).to(tl.float32)
    lse = tl.load(LSE + b * sl_b + h * sl_h + t, mask=real, other=float("inf"))
    row_dot = tl.sum(do * o, axis=1)  # rowsum(dO * O): FA4's dpsum
    # unscaled: FA4's postprocess multiplies the accumulator by the scale
    dq = _diagonal_grads(q, do, lse, row_dot, b, hk, t, real, T, DK, DV, DDK, DDV, scale, sd_s, sd_b, sd_h, sd_t,
                         sv_s, sv_b, sv_h, sv_t, sx_s, sx_b, sx_h, sx_t, S, G, D, BT)  # padded rows: lse = +inf, p = 0
    row = (b * (G * HKV) + h) * T_ROUND + t  # dpsum, lse_log2: [B, Hq, T_ROUND] contiguous
    tl.store(DPSUM + row, tl.where(real, row_dot, 0.0), mask=in_tile)
    tl.store(LSE2 + row, tl.where(lse == float("-inf"), 0.0, lse * 1.4426950408889634), mask=in_tile)
    # the accumulator: [B, Hq, T_ROUND * D], tile t // TM at element perm[t % TM, c] of its TM * D
    c = tl.arange(0, D)[None, :]
    perm = tl.load(PERM + (t % TM)[:, None] * D + c)
    acc_off = (row - t).to(tl.int64)[:, None] * D + (t // TM).to(tl.int64)[:, None] * (TM * D) + perm
    tl.store(DQACC + acc_off, dq, mask=in_tile[:, None])


@functools.cache
def dq_accum_tile(head_dim: int, dtype: torch.dtype, device: torch.device) -> tuple[int, torch.Tensor]:
    """(tile_m, perm [tile_m, head_dim] int32): where FA4's SM90 window backward keeps dQ element
    (r, c) of a query tile inside that tile's stretch of its fp32 accumulator. Read off FA4's own
    postprocess: a tiny window backward records the postprocess's arguments, which then convert two
    tiles holding each element's index (in base-256 digits, exact in bf16)."""
    fa4 = interface("the fused diagonal backward")
    recorded = []
    convert = fa4._bwd_postprocess_convert

    def record(*args, **kwargs):
        recorded.append((args, kwargs))
        return convert(*args, **kwargs)

    record.compile_cache = convert.compile_cache  # FA4 reaches it through the module-level name

    x = torch.randn(3, 1, 128, 1, head_dim, device=device, dtype=dtype)
    out, lse = fa4._flash_attn_fwd(x[0], x[1], x[2], causal=True, window_size_left=63, return_lse=True)[:2]
    with swapped("the fused diagonal backward", _bwd_postprocess_convert=record):
        fa4._flash_attn_bwd(x[0], x[1], x[2], out, torch.randn_like(out), lse, causal=True, window_size_left=63)
    args, kwargs = recorded[0]  # the dQ conversion comes first
    tile_m = args[8]  # FA4's block_size argument: the query tile of the dQ accumulator
    size = tile_m * head_dim
    if head_dim % kwargs["hdim_multiple_of"]:
        raise RuntimeError(f"FA4 pads head_dim {head_dim} in its dQ accumulator; the fused diagonal backward does not")
    index = torch.arange(size, device=device)
    digits = []
    for code in (index % 256, index // 256):
        dq = torch.empty(1, tile_m, 1, head_dim, device=device, dtype=dtype)
        convert(code.float().view(1, 1, size), dq, 1.0, *args[3:], **kwargs)
        digits.append(dq.view(tile_m, head_dim).float().round().long())
    perm = digits[1] * 256 + digits[0]
    if not torch.equal(perm.flatten().sort().values, index):
        raise RuntimeError("FA4's dQ accumulator tile is not a permutation of its elements (flash-attn-4 changed?)")
    return tile_m, perm.int().contiguous()


def supported(q: torch.Tensor, diag_k: torch.Tensor) -> bool:
    """The fused path's shapes: the diagonal kernels' (power-of-two head dim and group) and 64 or 128
    head dims (FA4's unpadded accumulator); more than 256 x 256 accumulator elements per tile would
    not round-trip through the two bf16 digits."""
    from .diagonal_keys import supported as diagonal_supported

    return diagonal_supported(q, diag_k) and q.shape[-1] in (64, 128)


def window_backward_with_diagonal(dout, q, k, v, out, lse, diag_k, diag_v, window_left: int | None, scale: float):
    """Gradients of the window (FA4, ``window_size_left``) + diagonal keys, given the merged output
    and log-sum-exp. q/out/dout [B, Hq, T, D] (any strides with dense rows), k/v [B, Hkv, T, D],
    diag_k/diag_v [S, B, Hkv, T, D]. Returns (dq, dk, dv) in q/k/v's layout and (d diag_k, d diag_v)."""
    s, b, hkv, t, d = diag_k.shape
    tile_m, perm = dq_accum_tile(d, q.dtype, q.device)
    bshd = lambda x: x.transpose(1, 2)  # noqa: E731  (FA4's layout; the models' projections already are)
    dense = lambda x: x if x.stride(-1) == 1 else x.contiguous()  # noqa: E731
    q, out, dout, diag_k, diag_v = map(dense, (q, out, dout, diag_k, diag_v))
    lse = lse.float().contiguous()
    ddiag_k = torch.empty_like(diag_k, memory_format=torch.contiguous_format)
    ddiag_v = torch.empty_like(diag_v, memory_format=torch.contiguous_format)

    def launch(dpsum, lse_log2, dq_accum):
        t_round = dpsum.shape[-1]
        assert dq_accum.shape[-1] == t_round * d and dpsum.is_contiguous() and lse_log2.is_contiguous()
        grid = lambda meta: (triton.cdiv(t_round, meta["BT"]), b * hkv)  # noqa: E731
        _diag_backward_into_fa4_kernel[grid](
            q, dout, out, lse, diag_k, diag_v, dq_accum, perm, dpsum, lse_log2, ddiag_k, ddiag_v, scale, t, t_round, hkv,
            *q.stride()[:3], *dout.stride()[:3], *out.stride()[:3], *lse.stride()[:2], *diag_k.stride()[:4], *diag_v.stride()[:4],
            *ddiag_k.stride()[:4], S=s, G=q.shape[1] // hkv, D=d, TM=tile_m)

    with swapped("the fused diagonal backward", _bwd_preprocess=replacement_preprocess(launch, tile_m)) as fa4:
        dq, dk, dv = fa4._flash_attn_bwd(bshd(q), bshd(k), bshd(v), bshd(out), bshd(dout), lse, scale, causal=True,
                                         window_size_left=window_left)[:3]
    return (bshd(dq), bshd(dk), bshd(dv)), (ddiag_k, ddiag_v)
