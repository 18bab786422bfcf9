"""Sliding-window causal attention for training (forward + backward), plus optional per-query
diagonal keys (EAGLE-3's training-time test).

Window convention (Hugging Face ``sliding_window``): the query at position p sees keys p-W+1 .. p,
W keys counting itself. FlashAttention's and FlashInfer's left window is W - 1; cuDNN's
``diagonal_band_left_bound`` (the frontend's ``window_left``) is W.

Three ways to run the band, the same result (tests: one dense mask built pair by pair):

``fa4-band`` (``default_ops(True)`` when the ``flash-attn-4`` package is installed, Hopper or newer):
FlashAttention-4's own sliding window, forward and backward, in one call each. The fastest kernel
measured for a window (511 TFLOP/s at 32K, W=2048 on an H100; BENCHMARKS.md, issue 8).

``cudnn-band`` (the default when only the ``nvidia-cudnn-frontend`` package is installed): the whole
band in one call of cuDNN's fused attention with its native diagonal band (457-468 TFLOP/s there).

``CUDNN`` (chunked; torch's built-in cuDNN op, which takes no window): the band cut into causal
pieces cuDNN can run. Measured slower than flex (14.9 vs 11.5 ms at 32K, W=2048): cuDNN on 2K-long
chunks is far from its long-sequence rate, and the reversed copies and merges cost memory passes.
With chunks of C = W positions, the query at offset i of chunk c sees

    chunk c       offsets j <= i          a causal square                      -> piece A
    chunk c - 1   offsets j >  i          a strictly upper triangle; reversing -> piece B
                                          both orders within the chunk makes it strictly lower:
                                          queries 1..C-1 over keys 0..C-2, causal

Softmaxes of separate pieces are merged by log-sum-exp. The backward needs no merging: each
piece's backward kernel is called with the *merged* output and log-sum-exp, which makes it compute
exactly the merged softmax's gradient over its own keys (the ring-attention identity:
dS = P * (dP - rowsum(dO * O)) with P = exp(S - LSE) of the whole row).

``diag_k``/``diag_v`` add S extra keys per query, key s of query t being the t-th row of step s
(EAGLE-3's training-time test: each query also sees its own index's earlier drafts). They are one
more piece, computed elementwise and merged the same way.

``REFERENCE`` / ``REFERENCE_BAND`` are plain PyTorch (any device and dtype) for tests.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from .attention import raise_recompile_limit
from .fa4_adapter import available as fa4_available  # noqa: F401  (FlashAttention-4 on a Hopper+ GPU, version and signatures checked)
from .fa4_adapter import interface

NEG_INF = float("-inf")


# --- piece kernels: causal (top-left) attention returning the log-sum-exp, and its backward that
# --- takes the output and log-sum-exp to use -------------------------------------------------------


@dataclass(frozen=True)
class PieceOps:
    name: str
    # (q [N, Hq, L, D], k/v [N, Hkv, L, D], scale) -> (out [N, Hq, L, D], lse [N, Hq, L] fp32)
    forward: Callable
    # (dout, q, k, v, out, lse, scale) -> (dq, dk, dv)
    backward: Callable


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def _reference_scores(q, k, v, scale, window=None):
    """Upcast q, expanded k/v, and the causal (optionally windowed) scores, masked with -inf."""
    groups = q.shape[1] // k.shape[1]
    dtype = _acc(q)
    qf, kf, vf = q.to(dtype), _repeat_kv(k, groups).to(dtype), _repeat_kv(v, groups).to(dtype)
    visible = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
    if window is not None:
        visible = visible.triu(1 - window)
    return qf, kf, vf, (qf @ kf.transpose(-1, -2) * scale).masked_fill(~visible, NEG_INF)


def _reference_forward(q, k, v, scale, window=None):
    _, _, vf, scores = _reference_scores(q, k, v, scale, window)
    lse = torch.logsumexp(scores, dim=-1)
    return (torch.exp(scores - lse[..., None]) @ vf).to(q.dtype), lse


def _reference_backward(dout, q, k, v, out, lse, scale, window=None):
    groups = q.shape[1] // k.shape[1]
    qf, kf, vf, scores = _reference_scores(q, k, v, scale, window)
    of, dof = out.to(qf.dtype), dout.to(qf.dtype)
    probs = torch.exp(scores - lse.to(qf.dtype)[..., None])  # masked scores give 0
    dv = probs.transpose(-1, -2) @ dof
    dprobs = dof @ vf.transpose(-1, -2)
    dscores = probs * (dprobs - (dof * of).sum(-1, keepdim=True))
    dq = dscores @ kf * scale
    dk = dscores.transpose(-1, -2) @ qf * scale
    fold = lambda g: g.unflatten(1, (k.shape[1], groups)).sum(2)  # noqa: E731  (sum a KV head's query heads)
    return dq.to(q.dtype), fold(dk).to(k.dtype), fold(dv).to(v.dtype)


REFERENCE = PieceOps("reference", _reference_forward, _reference_backward)


# cuDNN's backward takes the forward's dropout RNG state (unused at dropout 0); kept from a forward call.
_CUDNN_RNG: dict = {}


def _cudnn_forward(q, k, v, scale):
    out, lse, _, _, _, _, seed, offset, _ = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q, k, v, None, True, 0.0, True, False, scale=scale)
    _CUDNN_RNG.setdefault(q.device, (seed, offset))
    return out, lse.reshape(q.shape[:3])


def _cudnn_backward(dout, q, k, v, out, lse, scale):
    seed, offset = _CUDNN_RNG[q.device]
    n, h, length, _ = q.shape
    # cum_seq_q/k undefined (None): dense batches, not packed sequences
    return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        dout, q, k, v, out, lse.reshape(n, h, length, 1).contiguous(), seed, offset, None, None, None, length, k.shape[2], 0.0,
        True, scale=scale)


CUDNN = PieceOps("cudnn", _cudnn_forward, _cudnn_backward)


# --- band kernels: the whole window in one call ----------------------------------------------------


@dataclass(frozen=True)
class BandOps:
    name: str
    # (q [B, Hq, T, D], k/v [B, Hkv, T, D], window or None, scale) -> (out [B, Hq, T, D], lse [B, Hq, T] fp32)
    forward: Callable
    # (dout, q, k, v, out, lse, window, scale) -> (dq, dk, dv)
    backward: Callable
    # (dout, q, k, v, out, lse, diag_k, diag_v, window, scale) -> ((dq, dk, dv), (d diag_k, d diag_v)): the band's
    # backward with the diagonal keys' gradient inside, or None where the shapes do not fit; an engine without
    # one (None) has the diagonal keys' gradient computed apart
    backward_with_diagonal: Callable | None = None


REFERENCE_BAND = BandOps("reference-band", lambda q, k, v, window, scale: _reference_forward(q, k, v, scale, window),
                         lambda dout, q, k, v, out, lse, window, scale: _reference_backward(dout, q, k, v, out, lse, scale, window))


@functools.cache  # one engine per process: unroll asks for it every training step
def _cudnn_band_ops():
    import cudnn.sdpa.fwd.torch_op  # noqa: F401  (registers torch.ops.cudnn.sdpa_fwd / sdpa_bwd)

    def forward(q, k, v, window, scale):
        # window_left = W: cuDNN's left bound counts the diagonal, as Hugging Face's window does
        out, lse = torch.ops.cudnn.sdpa_fwd(q, k, v, scale, is_causal=True, window_left=window or -1, return_lse=True)
        return out, lse.view(q.shape[:3])

    def backward(dout, q, k, v, out, lse, window, scale):
        return torch.ops.cudnn.sdpa_bwd(dout, q, k, v, out, lse.float().contiguous(), scale, is_causal=True,
                                        window_left=window or -1)

    return BandOps("cudnn-band", forward, backward)


@functools.cache
def _fa4_band_ops():
    # FlashAttention-4's own entry points: its autograd function cannot take the merged output and
    # log-sum-exp the diagonal keys need in the backward (see the module docstring); as custom ops
    # (swa_kernels.fa4_window) a compiled step keeps them as single nodes
    interface("FlashAttention-4's window (trainer.attention_backend=fa4, EAGLE-3)")  # version and signatures first
    from . import fa4_window

    bshd = lambda x: x.transpose(1, 2)  # noqa: E731  (FA4's layout [B, T, H, D]; the models' projections are already)

    def left(window):
        return None if window is None else window - 1  # FlashAttention's left window excludes the query

    def forward(q, k, v, window, scale):
        out, lse = fa4_window.window_forward(bshd(q), bshd(k), bshd(v), left(window), scale)
        return bshd(out), lse

    def backward(dout, q, k, v, out, lse, window, scale):
        grads = fa4_window.window_backward(bshd(q), bshd(k), bshd(v), bshd(out), bshd(dout), lse, left(window), scale)
        return tuple(bshd(g) for g in grads)

    def backward_with_diagonal(dout, q, k, v, out, lse, diag_k, diag_v, window, scale):
        from .fa4_diagonal import supported  # its gradient in FA4's preprocess

        if not supported(q, diag_k):
            return None
        dq, dk, dv, ddiag_k, ddiag_v = fa4_window.window_backward_diagonal(dout, q, k, v, out, lse, diag_k, diag_v, left(window), scale)
        return (bshd(dq), bshd(dk), bshd(dv)), (ddiag_k, ddiag_v)

    return BandOps("fa4-band", forward, backward, backward_with_diagonal)


# a constant to torch.compile (run at trace time, outside the graph): EAGLE-3's compiled step asks for the kernels inside
# its traced code, and Dynamo, which looks through functools.cache (and so past a mark on its wrapper), traced the probe's
# problem into the step
@torch.compiler.assume_constant_result
def cudnn_band_available() -> bool:
    return _cudnn_band_available()


@functools.cache
def _cudnn_band_available() -> bool:
    """cuDNN's native band needs the ``nvidia-cudnn-frontend`` package (cuDNN backend >= 9.x). Installed but failing to
    load (no usable libcudnn, another frontend version) is said once: the chunked path serves, slower."""
    import importlib.util
    import logging

    try:
        import cudnn.sdpa.fwd.torch_op  # noqa: F401
    except Exception as e:  # not installed, or no usable libcudnn: the chunked path serves
        if importlib.util.find_spec("cudnn") is not None:
            logging.getLogger(__name__).warning("nvidia-cudnn-frontend is installed but cudnn.sdpa.fwd.torch_op did not load "
                                                "(%s: %s): EAGLE-3's window runs cuDNN's causal chunks instead (slower)",
                                                type(e).__name__, e)
        return False
    problem = installed_band_problem()
    if problem is not None:
        import cudnn

        logging.getLogger(__name__).warning("nvidia-cudnn-frontend %s: its band (torch.ops.cudnn.sdpa_fwd/sdpa_bwd) %s; EAGLE-3's "
                                            "window runs cuDNN's causal chunks instead (slower)", getattr(cudnn, "__version__", "?"),
                                            problem)
        return False
    return True


def installed_band_problem() -> str | None:
    """``cudnn_band_problem`` for the installed frontend on the GPU; None without a GPU (nothing to run it on)."""
    return cudnn_band_problem() if torch.cuda.is_available() else None


def cudnn_band_problem(band: BandOps | None = None, window: int = 16, device: str = "cuda") -> str | None:
    """Why cuDNN's band cannot serve, in a few words, or None. The frontend's torch ops are called by keyword with
    ``window_left`` read as W keys counting the query (probed on frontend 1.32.0: ``benchmarks/probe_cudnn_band.py``);
    another version may take other arguments or count otherwise, so the band is run once on a small problem, forward
    and backward, against the dense reference mask at W and at W +- 1 (an off-by-one lands nearer a neighbour)."""
    band = band or _cudnn_band_ops()
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v, dout = (torch.randn(1, h, 64, 64, device=device, generator=gen).to(torch.bfloat16) for h in (2, 1, 1, 2))
    scale = 64 ** -0.5
    try:
        out, lse = band.forward(q, k, v, window, scale)
        grads = band.backward(dout, q, k, v, out, lse, window, scale)
    except Exception as e:  # noqa: BLE001 - another signature: TypeError, RuntimeError from the op's schema
        return f"failed on a 64-token problem ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    got = torch.cat([out.flatten(), *(g.flatten() for g in grads)]).float()
    errors = {}
    for w in (window - 1, window, window + 1):
        ref_out, ref_lse = _reference_forward(q.float(), k.float(), v.float(), scale, w)
        ref = _reference_backward(dout.float(), q.float(), k.float(), v.float(), ref_out, ref_lse, scale, w)
        errors[w] = float((got - torch.cat([ref_out.flatten(), *(g.flatten() for g in ref)])).abs().max())
    if not (errors[window] < 0.05 and errors[window] * 4 < min(errors[window - 1], errors[window + 1])):
        return (f"disagrees with the window's dense mask (max |error| {errors[window]:.3g} at W={window}, {errors[window - 1]:.3g} "
                f"at W-1, {errors[window + 1]:.3g} at W+1)")
    return None


@functools.cache
def default_ops(on_gpu: bool):
    """The band in one call: FlashAttention-4 where installed, else cuDNN's when its frontend is;
    cuDNN chunks otherwise; PyTorch on CPU (the order is the measured speed, BENCHMARKS.md)."""
    if not on_gpu:
        return REFERENCE
    return _fa4_band_ops() if fa4_available() else cudnn_ops()


# torch's private cuDNN attention ops, called positionally above: their arguments by name and their outputs' count as
# torch 2.11-2.13 have them (a change is refused with torch's version, not guessed at)
CUDNN_SIGNATURES = {
    "_scaled_dot_product_cudnn_attention": (
        ("query", "key", "value", "attn_bias", "compute_log_sumexp", "dropout_p", "is_causal", "return_debug_mask", "scale"), 9),
    "_scaled_dot_product_cudnn_attention_backward": (
        ("grad_out", "query", "key", "value", "out", "logsumexp", "philox_seed", "philox_offset", "attn_bias", "cum_seq_q",
         "cum_seq_k", "max_q", "max_k", "dropout_p", "is_causal", "scale"), 3),
}


def check_cudnn_pieces() -> None:
    """Raise ``ValueError`` naming torch's version unless its private cuDNN attention ops take the recorded arguments."""
    for name, (arguments, returns) in CUDNN_SIGNATURES.items():
        try:
            schema = getattr(torch.ops.aten, name).default._schema
            got = (tuple(a.name for a in schema.arguments), len(schema.returns))
        except (AttributeError, RuntimeError) as e:
            got = f"missing ({type(e).__name__})"
        if got != (arguments, returns):
            raise ValueError(f"torch {torch.__version__}: torch.ops.aten.{name} takes {got}; the chunked cuDNN attention calls it "
                             f"with {(arguments, returns)} (torch 2.11-2.13); install nvidia-cudnn-frontend for cuDNN's band, "
                             "or flash-attn-4")


@functools.cache  # once per process: EAGLE-3's unroll asks for it every training step (the schema check is not free)
def cudnn_ops():
    """cuDNN's band in one call when its frontend is installed, else torch's cuDNN op in causal chunks."""
    if cudnn_band_available():
        return _cudnn_band_ops()
    check_cudnn_pieces()
    return CUDNN


def band_ops(name: str) -> BandOps:
    """A band engine by name: ``fa4-band`` or ``cudnn-band``."""
    engines = {"fa4-band": _fa4_band_ops, "cudnn-band": _cudnn_band_ops}
    if name not in engines:
        raise ValueError(f"band engine {name!r}; expected one of {sorted(engines)}")
    return engines[name]()


# --- the band cut into pieces -----------------------------------------------------------------------


def _chunks(x: torch.Tensor, size: int) -> torch.Tensor:
    """[B, H, n*C, D] -> [B, n, H, C, D] (a view)."""
    b, h, t, d = x.shape
    return x.view(b, h, t // size, size, d).transpose(1, 2)


def _flat(x: torch.Tensor) -> torch.Tensor:
    """[B, n, H, C, ...] -> [B*n, H, C, ...]."""
    return x.flatten(0, 1)


def _prev_piece_inputs(q5, k5, v5):
    """Piece B in the reversed frame: queries of chunks 1.. (offsets C-1 .. 1), keys of chunks
    0..n-2 (offsets C-1 .. 1); both as [B*(n-1), H, C-1, D] contiguous."""
    qb = q5[:, 1:].flip(3)[:, :, :, 1:]
    kb = k5[:, :-1].flip(3)[:, :, :, :-1]
    vb = v5[:, :-1].flip(3)[:, :, :, :-1]
    return _flat(qb).contiguous(), _flat(kb).contiguous(), _flat(vb).contiguous()


def _acc(x: torch.Tensor) -> torch.dtype:
    """Accumulation dtype: fp32, or fp64 for fp64 inputs (the tests' reference precision)."""
    return torch.promote_types(x.dtype, torch.float32)


def _diag_scores(q, diag_k, scale):
    """[S, B, Hq, T] scores of each query against its own index's S diagonal keys (accumulation dtype)."""
    b, hq, t, d = q.shape
    hkv = diag_k.shape[2]
    qg = q.reshape(b, hkv, hq // hkv, t, d).to(_acc(q))
    return (qg[None] * diag_k.to(_acc(q))[:, :, :, None]).sum(-1).flatten(2, 3) * scale


# The elementwise stages below are plain functions; on the GPU each runs under torch.compile, which
# fuses its flips, pads, exps and sums into one or two memory passes (eager: ~10 passes in fp32).


def _merge_pieces(out_a, lse_a, out_b, lse_b, t: int):
    """Piece A [B, n, Hq, C, D] + piece B in its reversed frame [B, n-1, Hq, C-1, D] (or None)
    -> out [B, Hq, T, D] in out_a's dtype and lse [B, Hq, T] (accumulation dtype)."""
    acc = _acc(out_a)
    b, n, hq, size, d = out_a.shape
    lse = lse_a.to(acc)
    out = out_a.to(acc)
    if out_b is not None:
        # back to chunk order: offsets 0 .. C-2 of chunks 1..; chunk 0 and offset C-1 see no previous chunk
        ob = F.pad(out_b.flip(3).to(acc), (0, 0, 0, 1, 0, 0, 1, 0))
        lb = F.pad(lse_b.flip(3).to(acc), (0, 1, 0, 0, 1, 0), value=NEG_INF)
        lse = torch.logaddexp(lse_a.to(acc), lb)
        out = torch.exp(lse_a.to(acc) - lse)[..., None] * out + torch.exp(lb - lse)[..., None] * ob
    out = out.transpose(1, 2).reshape(b, hq, n * size, d)[:, :, :t]
    lse = lse.transpose(1, 2).reshape(b, hq, n * size)[:, :, :t]
    return out.to(out_a.dtype), lse


def _diag_forward(q, out, lse, diag_k, diag_v, scale: float):
    """Fold the S diagonal keys into (out, lse)."""
    acc = _acc(q)
    scores = _diag_scores(q, diag_k, scale)  # [S, B, Hq, T]
    lse_all = torch.logsumexp(torch.cat([lse[None], scores]), dim=0)
    probs = torch.exp(scores - lse_all)
    rep = q.shape[1] // diag_k.shape[2]
    diag_out = (probs[..., None] * diag_v.to(acc).repeat_interleave(rep, dim=2)).sum(0)
    return (out.to(acc) * torch.exp(lse - lse_all)[..., None] + diag_out).to(q.dtype), lse_all


def _diag_backward(q, dout, out, lse, diag_k, diag_v, scale: float):
    """Gradients through the diagonal keys: dq's share and d(diag_k), d(diag_v)."""
    acc = _acc(q)
    hkv = diag_k.shape[2]
    rep = q.shape[1] // hkv
    probs = torch.exp(_diag_scores(q, diag_k, scale) - lse)  # [S, B, Hq, T]
    dof = dout.to(acc)
    row_dot = (dof * out.to(acc)).sum(-1)  # rowsum(dO * O)
    dprobs = (dof[None] * diag_v.to(acc).repeat_interleave(rep, dim=2)).sum(-1)
    dscores = probs * (dprobs - row_dot)
    dq = (dscores[..., None] * diag_k.to(acc).repeat_interleave(rep, dim=2)).sum(0) * scale
    fold = lambda g: g.unflatten(2, (hkv, rep)).sum(3)  # noqa: E731  (a KV head's query heads)
    ddiag_k = fold(dscores[..., None] * q.to(acc)[None] * scale).to(diag_k.dtype)
    ddiag_v = fold(probs[..., None] * dof[None]).to(diag_v.dtype)
    return dq, ddiag_k, ddiag_v


def _combine_grads(g_a, g_b, t: int, query_side: bool):
    """Piece A's gradient [B, n, H, C, D] + piece B's [B*(n-1), H, C-1, D] (reversed frame, or None)
    -> [B, H, T, D]. Piece B's queries are offsets 0..C-2 of chunks 1..; its keys offsets 1..C-1 of
    chunks 0..n-2."""
    b, n, h, size, d = g_a.shape
    g = g_a
    if g_b is not None:
        gb = g_b.view(b, n - 1, h, size - 1, d).flip(3)
        g = g + F.pad(gb, (0, 0, 0, 1, 0, 0, 1, 0) if query_side else (0, 0, 1, 0, 0, 0, 0, 1))
    return g.transpose(1, 2).reshape(b, h, n * size, d)[:, :, :t]



def _stage(fn, on_gpu: bool):
    if not on_gpu:
        return fn
    if fn.__name__ not in _COMPILED:
        # one compiled graph per shape; training shapes vary per batch (dynamo turns them dynamic)
        raise_recompile_limit()
        _COMPILED[fn.__name__] = torch.compile(fn)
    return _COMPILED[fn.__name__]


_COMPILED: dict = {}


class _WindowAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, diag_k, diag_v, window, scale, ops):
        b, hq, t, d = q.shape
        on_gpu = q.is_cuda
        if isinstance(ops, BandOps):
            ctx.band_window = None if window is None or window >= t else window
            out, lse = ops.forward(q, k, v, ctx.band_window, scale)
            return _WindowAttention._finish_forward(ctx, q, k, v, diag_k, diag_v, out, lse, (t, t, 1, 0, scale, ops))
        size = t if window is None or window >= t else window
        if size == 1:  # one key per query: cuDNN refuses 1 x 1 pieces, and PyTorch's are as fast
            ops = REFERENCE
        n = -(-t // size)
        pad = n * size - t
        if pad:  # padded keys come after every real query: causality hides them
            q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        q5, k5, v5 = _chunks(q, size), _chunks(k, size), _chunks(v, size)
        out_a, lse_a = ops.forward(_flat(q5), _flat(k5), _flat(v5), scale)
        out_b = lse_b = None
        if n > 1 and size > 1:
            out_b, lse_b = ops.forward(*_prev_piece_inputs(q5, k5, v5), scale)
            out_b, lse_b = out_b.view(b, n - 1, hq, size - 1, d), lse_b.view(b, n - 1, hq, size - 1)
        out, lse = _stage(_merge_pieces, on_gpu)(out_a.view(b, n, hq, size, d), lse_a.view(b, n, hq, size), out_b, lse_b, t)
        return _WindowAttention._finish_forward(ctx, q, k, v, diag_k, diag_v, out, lse, (t, size, n, pad, scale, ops))

    @staticmethod
    def _finish_forward(ctx, q, k, v, diag_k, diag_v, out, lse, meta):
        t, scale = meta[0], meta[4]
        has_diag = diag_k is not None and diag_k.shape[0] > 0
        if has_diag:
            if _triton_diagonal(q, diag_k):
                from .diagonal_keys import diag_forward

                out, lse = diag_forward(q[:, :, :t], out, lse, diag_k, diag_v, scale)
            else:
                out, lse = _stage(_diag_forward, q.is_cuda)(q[:, :, :t], out, lse, diag_k, diag_v, scale)
        ctx.save_for_backward(q, k, v, diag_k if has_diag else None, diag_v if has_diag else None, out, lse)
        ctx.meta = meta
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, diag_k, diag_v, out, lse = ctx.saved_tensors
        t, size, n, pad, scale, ops = ctx.meta
        # the band kernels take any layout with dense rows (a copy here is a full memory pass)
        dout = dout if isinstance(ops, BandOps) and dout.stride(-1) == 1 else dout.contiguous()
        if isinstance(ops, BandOps) and diag_k is not None and ops.backward_with_diagonal is not None:
            grads = ops.backward_with_diagonal(dout, q, k, v, out, lse, diag_k, diag_v, ctx.band_window, scale)
            if grads is not None:
                (dq, dk, dv), (ddiag_k, ddiag_v) = grads
                return dq, dk, dv, ddiag_k, ddiag_v, None, None, None
        if isinstance(ops, BandOps):
            dq, dk, dv = ops.backward(dout, q, k, v, out, lse, ctx.band_window, scale)
        else:
            dq, dk, dv = _chunked_backward(dout, q, k, v, out, lse, t, size, n, pad, scale, ops)
        if diag_k is None:
            return dq, dk, dv, None, None, None, None, None
        if _triton_diagonal(q, diag_k):
            from .diagonal_keys import diag_backward

            ddiag_k, ddiag_v = diag_backward(q[:, :, :t], dout, out, lse, diag_k, diag_v, dq, scale)  # adds to dq in place
        else:
            dq_diag, ddiag_k, ddiag_v = _stage(_diag_backward, q.is_cuda)(q[:, :, :t], dout, out, lse, diag_k, diag_v, scale)
            dq = (dq.to(dq_diag.dtype) + dq_diag).to(q.dtype)
        return dq, dk, dv, ddiag_k, ddiag_v, None, None, None


def _triton_diagonal(q: torch.Tensor, diag_k: torch.Tensor) -> bool:
    """The fused Triton kernels for the diagonal keys (swa_kernels/diagonal_keys.py) where they apply."""
    if not q.is_cuda:
        return False
    from .diagonal_keys import supported

    return supported(q, diag_k)


def _chunked_backward(dout, q, k, v, out, lse, t, size, n, pad, scale, ops):
    """The band's gradients from its causal pieces, each given the merged output and log-sum-exp."""
    b, hq, _, d = q.shape
    if pad:
        dout, out = (F.pad(x, (0, 0, 0, pad)) for x in (dout, out))
        lse = F.pad(lse, (0, pad), value=0.0)
    q5, k5, v5 = _chunks(q, size), _chunks(k, size), _chunks(v, size)
    do5, o5 = _chunks(dout, size), _chunks(out, size)
    lse4 = lse.view(b, hq, n, size).transpose(1, 2)  # [B, n, Hq, C]
    grads_a = ops.backward(_flat(do5), _flat(q5), _flat(k5), _flat(v5), _flat(o5), _flat(lse4).contiguous(), scale)
    grads_b = (None, None, None)
    if n > 1 and size > 1:
        rev = lambda x: _flat(x[:, 1:].flip(3)[:, :, :, 1:]).contiguous()  # noqa: E731  (piece B's reversed frame)
        grads_b = ops.backward(rev(do5), *_prev_piece_inputs(q5, k5, v5), rev(o5), rev(lse4[..., None])[..., 0], scale)
    combine = _stage(_combine_grads, q.is_cuda)
    return tuple(combine(g_a.view(b, n, -1, size, d), g_b, t, side == 0) for side, (g_a, g_b) in enumerate(zip(grads_a, grads_b)))


def window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None, scale: float | None = None,
                     diag_k: torch.Tensor | None = None, diag_v: torch.Tensor | None = None, ops: PieceOps | None = None) -> torch.Tensor:
    """Causal attention with a sliding window, plus optional per-query diagonal keys.

    Args:
        q: [B, Hq, T, D]; k, v: [B, Hkv, T, D] (Hq a multiple of Hkv).
        window: W keys visible counting the query itself, or None (plain causal).
        diag_k, diag_v: [S, B, Hkv, T, D] or None: query t also sees row t of each of the S.
        ops: the kernels (default: ``default_ops``: cuDNN's band on CUDA when available, else cuDNN
            chunks; the PyTorch reference elsewhere).

    Returns:
        [B, Hq, T, D] in q's dtype (under autocast, autocast's: every input is cast to it first).
    """
    if window is not None and window < 1:
        raise ValueError(f"window={window}; expected a positive number of keys or None")
    ops = ops or default_ops(q.is_cuda)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if torch.is_autocast_enabled(q.device.type):
        # what autocast does for PyTorch's own attention, done here for kernels it does not see: one dtype for all
        # (RoPE with fp32 cos/sin, from an fp32 hidden state, lifts q and k out of bf16; FA4 refuses mixed dtypes)
        low = torch.get_autocast_dtype(q.device.type)
        q, k, v = (x.to(low) for x in (q, k, v))
        diag_k, diag_v = (None if x is None else x.to(low) for x in (diag_k, diag_v))
    return _WindowAttention.apply(q, k, v, diag_k, diag_v, window, scale, ops)
