"""FlashAttention-4's causal window, forward and backward, and the backward with EAGLE-3's diagonal keys
(``swa_kernels.fa4_diagonal``), as custom ops (GPU only; imported lazily by ``swa_kernels.window_attention``).

FA4's Python entry points are not traceable: Dynamo breaks the graph at their DLPack wrappers, so a
training step compiled whole (``trainer.compile_scope=step``) would run in pieces around every
attention call. As custom ops each call is one node the compiler does not enter; the fakes give it
the output shapes and strides. All tensors are in FA4's layout [B, T, H, D] except where noted; the
outputs are contiguous (FA4 allocates out and lse afresh and dq, dk, dv like q, k, v, which the
backward makes contiguous first: no copy for the drafter's projections, which already are).
"""

from __future__ import annotations

import functools

import torch

from .fa4_adapter import forward_outputs_like, grads_like, interface


@functools.cache  # once per process (checked there), not per attention call
def _fa4():
    return interface("FlashAttention-4's window (trainer.attention_backend=fa4, EAGLE-3)")


@torch.library.custom_op("swa_drafters::fa4_window_forward", mutates_args=())
def window_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window_left: int | None,
                   scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention over keys p - window_left .. p (all of them with None): out [B, T, Hq, D], lse [B, Hq, T] fp32."""
    out, lse, *_ = _fa4()._flash_attn_fwd(q, k, v, softmax_scale=scale, causal=True, window_size_left=window_left,
                                          return_lse=True)
    return out.contiguous(), lse.contiguous()


@window_forward.register_fake
def _(q, k, v, window_left, scale):
    return forward_outputs_like(q, v)


@torch.library.custom_op("swa_drafters::fa4_window_backward", mutates_args=())
def window_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, dout: torch.Tensor, lse: torch.Tensor,
                    window_left: int | None, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v = (x.contiguous() for x in (q, k, v))
    dq, dk, dv = _fa4()._flash_attn_bwd(q, k, v, out, dout, lse.float().contiguous(), scale, causal=True,
                                        window_size_left=window_left)[:3]
    return dq.contiguous(), dk.contiguous(), dv.contiguous()


@window_backward.register_fake
def _(q, k, v, out, dout, lse, window_left, scale):
    return grads_like(q, k, v)


@torch.library.custom_op("swa_drafters::fa4_window_backward_diagonal", mutates_args=())
def window_backward_diagonal(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                             lse: torch.Tensor, diag_k: torch.Tensor, diag_v: torch.Tensor, window_left: int | None,
                             scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``fa4_diagonal.window_backward_with_diagonal``: q/out/dout [B, Hq, T, D], k/v [B, Hkv, T, D] (the
    window module's layout), diag_k/diag_v [S, B, Hkv, T, D]; dq, dk, dv come back in FA4's [B, T, H, D]."""
    from .fa4_diagonal import window_backward_with_diagonal

    (dq, dk, dv), (ddiag_k, ddiag_v) = window_backward_with_diagonal(dout, q, k, v, out, lse, diag_k, diag_v, window_left, scale)
    return (*(g.transpose(1, 2).contiguous() for g in (dq, dk, dv)), ddiag_k.contiguous(), ddiag_v.contiguous())


@window_backward_diagonal.register_fake
def _(dout, q, k, v, out, lse, diag_k, diag_v, window_left, scale):
    return (*grads_like(*(x.transpose(1, 2) for x in (q, k, v))), *grads_like(diag_k, diag_v))  # dq, dk, dv in [B, T, H, D]
