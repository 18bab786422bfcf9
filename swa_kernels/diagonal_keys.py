"""Triton kernels for the diagonal keys of EAGLE-3's training-time test, merged into an attention
output by log-sum-exp (forward) and their share of the gradients (backward).

Query t of head h also sees S extra keys: row t of each earlier step s (``diag_k[s, b, h // G, t]``).
Their work is tiny (S dot products per query) but it touches every query, output and gradient row,
so it is memory-bound: one program loads a block of query rows for all G query heads of one KV
head together with the S diagonal rows they share, and does the whole merge (or the whole
gradient) in registers: one read of each tensor, one write. ``swa_kernels/window_attention.py`` falls
back to its compiled PyTorch stages where Triton or the shapes do not fit.

Shapes: q, out [B, Hq, T, D]; lse [B, Hq, T] fp32; diag_k, diag_v [S, B, Hkv, T, D]; Hq = G * Hkv.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Query positions per program (x G heads = rows held in registers) and warps, tuned once per (S, G, D).
CONFIGS = [triton.Config({"BT": bt}, num_warps=w) for bt in (2, 4, 8, 16) for w in (2, 4, 8)]


def supported(q: torch.Tensor, diag_k: torch.Tensor) -> bool:
    """Power-of-two head dim and group size (Triton tiles), on CUDA."""
    d, groups = q.shape[-1], q.shape[1] // diag_k.shape[2]
    return q.is_cuda and d >= 16 and d & (d - 1) == 0 and groups & (groups - 1) == 0 and groups <= 16


def _dense_rows(x: torch.Tensor) -> torch.Tensor:
    """The kernels index the last dimension with stride 1."""
    return x if x.stride(-1) == 1 else x.contiguous()


@triton.jit
def _program_rows(T, HKV, G: tl.constexpr, BT: tl.constexpr):
    """This program's batch b, KV head hk, and its G * BT rows: row r = (query head h = hk * G + r // BT,
    position t = t0 + r % BT), with the in-range flag."""
    bk = tl.program_id(1)
    b = (bk // HKV).to(tl.int64)  # 64-bit offsets: S * B * Hkv * T * D passes 2^31 at 32K x batch 16
    hk = bk % HKV
    r = tl.arange(0, G * BT)
    t = tl.program_id(0) * BT + r % BT
    return b, hk, hk * G + r // BT, t, t < T


@triton.jit
def _row_offsets(b, h, t, sb, sh, st, D: tl.constexpr):
    """[rows, D] element offsets of rows (b, h, t) in a tensor with strides (sb, sh, st, 1); h may be
    one head for all rows."""
    return (b * sb + h * sh + t * st)[:, None] + tl.arange(0, D)[None, :]


@triton.autotune(CONFIGS, key=["S", "G", "D"])
@triton.jit
def _diag_forward_kernel(Q, O, LSE, DK, DV, OUT, LSE_OUT, scale, T, HKV,
                         sq_b, sq_h, sq_t, so_b, so_h, so_t, sl_b, sl_h,
                         sd_s, sd_b, sd_h, sd_t, sv_s, sv_b, sv_h, sv_t, su_b, su_h, su_t,
                         S: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BT: tl.constexpr):
    b, hk, h, t, valid = _program_rows(T, HKV, G, BT)
    m2 = valid[:, None]
    q = tl.load(Q + _row_offsets(b, h, t, sq_b, sq_h, sq_t, D), mask=m2, other=0.0).to(tl.float32)
    acc = tl.load(O + _row_offsets(b, h, t, so_b, so_h, so_t, D), mask=m2, other=0.0).to(tl.float32)
    m = tl.load(LSE + b * sl_b + h * sl_h + t, mask=valid, other=0.0)
    total = tl.full(m.shape, 1.0, tl.float32)  # sum of exp(score - m); the band's share is exp(lse - m) = 1
    for s in tl.static_range(S):
        k = tl.load(DK + s * sd_s + _row_offsets(b, hk, t, sd_b, sd_h, sd_t, D), mask=m2, other=0.0).to(tl.float32)
        v = tl.load(DV + s * sv_s + _row_offsets(b, hk, t, sv_b, sv_h, sv_t, D), mask=m2, other=0.0).to(tl.float32)
        score = tl.sum(q * k, axis=1) * scale
        m_new = tl.maximum(m, score)
        alpha = tl.exp(m - m_new)
        p = tl.exp(score - m_new)
        total = total * alpha + p
        acc = acc * alpha[:, None] + p[:, None] * v
        m = m_new
    tl.store(OUT + _row_offsets(b, h, t, su_b, su_h, su_t, D), (acc / total[:, None]).to(OUT.dtype.element_ty), mask=m2)
    tl.store(LSE_OUT + b * sl_b + h * sl_h + t, m + tl.log(total), mask=valid)


@triton.jit
def _diagonal_grads(q, do, lse, row_dot, b, hk, t, valid, T, DK, DV, DDK, DDV, scale, sd_s, sd_b, sd_h, sd_t,
                    sv_s, sv_b, sv_h, sv_t, sx_s, sx_b, sx_h, sx_t,
                    S: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BT: tl.constexpr):
    """The program's rows (fp32 q, dO, log-sum-exp and rowsum(dO * O) of the merged softmax): stores
    each diagonal key's dK, dV and returns the rows' sum over s of dS_s * k_s ([G * BT, D], dQ's share
    before the scale). Shared by the stand-alone backward and the one in FA4's preprocess."""
    m2 = valid[:, None]
    dq = tl.zeros((G * BT, D), tl.float32)
    tq = tl.program_id(0) * BT + tl.arange(0, BT)
    for s in tl.static_range(S):
        k = tl.load(DK + s * sd_s + _row_offsets(b, hk, t, sd_b, sd_h, sd_t, D), mask=m2, other=0.0).to(tl.float32)
        v = tl.load(DV + s * sv_s + _row_offsets(b, hk, t, sv_b, sv_h, sv_t, D), mask=m2, other=0.0).to(tl.float32)
        p = tl.exp(tl.sum(q * k, axis=1) * scale - lse)
        ds = p * (tl.sum(do * v, axis=1) - row_dot)
        dq += ds[:, None] * k
        # the G heads of the group share this key: sum their rows
        dk = tl.sum(tl.reshape(ds[:, None] * q * scale, (G, BT, D)), axis=0)
        dv = tl.sum(tl.reshape(p[:, None] * do, (G, BT, D)), axis=0)
        off = s * sx_s + _row_offsets(b, hk, tq, sx_b, sx_h, sx_t, D)
        tl.store(DDK + off, dk.to(DDK.dtype.element_ty), mask=(tq < T)[:, None])
        tl.store(DDV + off, dv.to(DDV.dtype.element_ty), mask=(tq < T)[:, None])
    return dq


@triton.autotune(CONFIGS, key=["S", "G", "D"], restore_value=["DQ"])  # DQ is accumulated in place
@triton.jit
def _diag_backward_kernel(Q, DO, O, LSE, DK, DV, DQ, DDK, DDV, scale, T, HKV,
                          sq_b, sq_h, sq_t, sg_b, sg_h, sg_t, so_b, so_h, so_t, sl_b, sl_h,
                          sd_s, sd_b, sd_h, sd_t, sv_s, sv_b, sv_h, sv_t, sdq_b, sdq_h, sdq_t,
                          sx_s, sx_b, sx_h, sx_t,
                          S: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BT: tl.constexpr):
    b, hk, h, t, valid = _program_rows(T, HKV, G, BT)
    m2 = valid[:, None]
    q = tl.load(Q + _row_offsets(b, h, t, sq_b, sq_h, sq_t, D), mask=m2, other=0.0).to(tl.float32)
    do = tl.load(DO + _row_offsets(b, h, t, sg_b, sg_h, sg_t, D), mask=m2, other=0.0).to(tl.float32)
    o = tl.load(O + _row_offsets(b, h, t, so_b, so_h, so_t, D), mask=m2, other=0.0).to(tl.float32)
    lse = tl.load(LSE + b * sl_b + h * sl_h + t, mask=valid, other=0.0)
    row_dot = tl.sum(do * o, axis=1)  # rowsum(dO * O) of the merged softmax
    dq_ptr = DQ + _row_offsets(b, h, t, sdq_b, sdq_h, sdq_t, D)
    dq = tl.load(dq_ptr, mask=m2, other=0.0).to(tl.float32)  # the band's share, from its own backward
    dq += scale * _diagonal_grads(q, do, lse, row_dot, b, hk, t, valid, T, DK, DV, DDK, DDV, scale, sd_s, sd_b, sd_h, sd_t,
                                  sv_s, sv_b, sv_h, sv_t, sx_s, sx_b, sx_h, sx_t, S, G, D, BT)
    tl.store(dq_ptr, dq.to(DQ.dtype.element_ty), mask=m2)


def _grid(q: torch.Tensor, diag_k: torch.Tensor):
    return lambda meta: (triton.cdiv(q.shape[2], meta["BT"]), q.shape[0] * diag_k.shape[2])


def diag_forward(q, out, lse, diag_k, diag_v, scale: float):
    """(out, lse) of the band -> (out, lse) of the band and the S diagonal keys, merged."""
    s, _, hkv, t, d = diag_k.shape
    q, out, diag_k, diag_v = map(_dense_rows, (q, out, diag_k, diag_v))
    lse = lse.float().contiguous()
    # in the band's output layout: the chunked path's is contiguous, as its cuDNN backward expects of
    # the output and its gradient alike; FlashAttention-4's is [B, T, H, D] like the models' projections
    merged, merged_lse = torch.empty_like(out), torch.empty_like(lse)
    _diag_forward_kernel[_grid(q, diag_k)](
        q, out, lse, diag_k, diag_v, merged, merged_lse, scale, t, hkv,
        *q.stride()[:3], *out.stride()[:3], *lse.stride()[:2], *diag_k.stride()[:4], *diag_v.stride()[:4], *merged.stride()[:3],
        S=s, G=q.shape[1] // hkv, D=d)
    return merged, merged_lse


def diag_backward(q, dout, out, lse, diag_k, diag_v, dq, scale: float):
    """Adds the diagonal keys' share to ``dq`` (in place) and returns (d diag_k, d diag_v)."""
    s, _, hkv, t, d = diag_k.shape
    q, dout, out, diag_k, diag_v = map(_dense_rows, (q, dout, out, diag_k, diag_v))
    assert dq.stride(-1) == 1, "dq is updated in place"
    lse = lse.float().contiguous()
    ddiag_k, ddiag_v = torch.empty_like(diag_k, memory_format=torch.contiguous_format), torch.empty_like(diag_v, memory_format=torch.contiguous_format)
    _diag_backward_kernel[_grid(q, diag_k)](
        q, dout, out, lse, diag_k, diag_v, dq, ddiag_k, ddiag_v, scale, t, hkv,
        *q.stride()[:3], *dout.stride()[:3], *out.stride()[:3], *lse.stride()[:2], *diag_k.stride()[:4], *diag_v.stride()[:4],
        *dq.stride()[:3], *ddiag_k.stride()[:4],
        S=s, G=q.shape[1] // hkv, D=d)
    return ddiag_k, ddiag_v
