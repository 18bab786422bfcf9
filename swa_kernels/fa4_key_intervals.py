"""FlashAttention-4's SM90 kernels with per-row key intervals (GPU only; imported lazily).

Each query row sees the keys of at most two intervals, [lo1, hi1) and [lo2, hi2) (the tables of
``swa_kernels.key_intervals``). FA4's own forward and backward run unchanged except for four things,
patched into copies of its two SM90 kernel files at import:

- which key tiles a query tile visits (forward) and which query tiles a key tile visits
  (backward) come from the tables instead of a window formula;
- the forward visits the interval-1 tiles, then the interval-2 tiles as if they followed them
  ("virtual" tile numbers past interval 1 load the physical interval-2 tiles);
- the mask on a partly visible tile compares each element with its row's interval in that tile
  (a key tile holds one interval's keys; the forward builds FA4's R2P bitmasks from it);
- the backward skips the mask on a tile wholly inside every row's first interval.

Everything else (pipelines, TMA, softmax, GQA packing in the forward, dQ/dK/dV accumulation) is
FA4's. The patch is tied to the pinned flash-attn-4 version: ``swa_kernels.fa4_adapter`` checks the
version and every FA4 internal used here (entry points' parameters, ``BlockInfo``/``AttentionMask``
fields, the mask helpers) before this module imports any of them, and a changed source still fails
at import with the line the patch expected.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import re
import sys
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path

from .fa4_adapter import forward_outputs_like, grads_like, refuse_persistent_cache, require, swapped

require("FlashAttention-4 key-interval attention (trainer.attention_backend=fa4, DFlash)")  # before any FA4 import or patch
refuse_persistent_cache("FlashAttention-4 key-interval attention (trainer.attention_backend=fa4, DFlash)")

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from cutlass import Float32, Int32, const_expr  # noqa: E402
from flash_attn.cute.block_info import BlockInfo  # noqa: E402
from flash_attn.cute.mask import AttentionMask, mask_r2p_lambda, r2p_bitmask_above, r2p_bitmask_below, sm90_col_to_r2p_idx  # noqa: E402
from quack import layout_utils  # noqa: E402

# The aux tensors (swa_kernels.key_intervals builds them; keep the two in step). Forward:
# [rows, fwd_tiles], backward: [rows, bwd_key_tiles, bwd_query_tiles], all int32.
#   rows[b, r]: lo1, hi1, lo2, hi2 (rows packed by KV group; padded to whole query tiles with empty rows)
#   fwd_tiles[b, m]: n_min, n_end (interval-1 key tiles), n2_min, n2_end (interval-2 key tiles),
#                    first tile that needs masking on the right, end of the tiles masked on the left
#   bwd_key_tiles[b, n]: m_min, m_end;  bwd_query_tiles[b, m]: max lo1, min hi1 over the tile's rows,
#                    and the first key of the tile's interval-2 key tiles (int32 max if none)
ROWS, FWD_TILES, BWD_KEY_TILES, BWD_QUERY_TILES = 0, 1, 1, 2


@dataclass(frozen=True)
class IntervalBlockInfo(BlockInfo):
    tables: object = None

    @staticmethod
    def create(tables, *args, **kwargs) -> "IntervalBlockInfo":
        base = BlockInfo(*args, **kwargs)
        return IntervalBlockInfo(**{f.name: getattr(base, f.name) for f in fields(base)}, tables=tables)

    @cute.jit
    def get_n_block_min_max(self, seqlen_info, m_block, split_idx=0, num_splits=1, batch_idx=0):
        t = self.tables[FWD_TILES]
        n_min = t[batch_idx, m_block, 0]
        return n_min, t[batch_idx, m_block, 1] + t[batch_idx, m_block, 3] - t[batch_idx, m_block, 2]

    @cute.jit
    def get_n_block_min_causal_local_mask(self, seqlen_info, m_block, n_block_min, batch_idx=0):
        return cutlass.max(n_block_min, self.tables[FWD_TILES][batch_idx, m_block, 4])

    @cute.jit
    def get_n_block_min_before_local_mask(self, seqlen_info, m_block, n_block_min, batch_idx=0):
        return cutlass.max(n_block_min, self.tables[FWD_TILES][batch_idx, m_block, 5])

    @cute.jit
    def physical_n_block(self, n_block, m_block, batch_idx):
        """Forward: the key tile that virtual tile ``n_block`` of query tile ``m_block`` loads."""
        t = self.tables[FWD_TILES]
        n_end = t[batch_idx, m_block, 1]
        phys = n_block
        if n_block >= n_end:
            phys = t[batch_idx, m_block, 2] + n_block - n_end
        return phys

    @cute.jit
    def get_m_block_min_max(self, seqlen_info, n_block, batch_idx=0):
        t = self.tables[BWD_KEY_TILES]
        return t[batch_idx, n_block, 0], t[batch_idx, n_block, 1]


@dataclass(frozen=True)
class IntervalMask(AttentionMask):
    tables: object = None
    forward: cutlass.Constexpr[bool] = True

    @staticmethod
    def create(tables, forward: bool):
        return functools.partial(IntervalMask, tables=tables, forward=forward)

    @cute.jit
    def apply_mask(self, acc_S, batch_idx, head_idx, m_block, n_block, thr_mma, mask_seqlen, mask_causal,
                   mask_local=False, mask_mod=None, aux_data=None, fastdiv_mods=(None, None)):
        acc_S_mn = layout_utils.reshape_acc_to_mn(acc_S, transpose=self.swap_AB)
        acc_shape = (self.tile_m, self.tile_n)
        cS = cute.make_identity_tensor(acc_shape if const_expr(not self.swap_AB) else acc_shape[::-1])
        tScS_mn = layout_utils.reshape_acc_to_mn(thr_mma.partition_C(cS), transpose=self.swap_AB)
        ROW = 0 if const_expr(not self.swap_AB) else 1
        COL = 1 if const_expr(not self.swap_AB) else 0
        rows = self.tables[ROWS]
        needs_mask = True
        col0 = n_block * self.tile_n
        # A key tile holds keys of one interval only (interval-2 tiles lie past the query tile's
        # interval-1 tiles), so each row is compared with one interval: lo at column `which`.
        which = Int32(0)
        if const_expr(self.forward):
            t = self.tables[FWD_TILES]
            n_end = t[batch_idx, m_block, 1]
            if n_block >= n_end:
                col0 = (t[batch_idx, m_block, 2] + n_block - n_end) * self.tile_n
                which = Int32(2)
        else:  # a key tile wholly inside every row's first interval needs no mask
            tq = self.tables[BWD_QUERY_TILES]
            needs_mask = not (tq[batch_idx, m_block, 0] <= col0 and tq[batch_idx, m_block, 1] >= col0 + self.tile_n)
            if col0 >= tq[batch_idx, m_block, 2]:
                which = Int32(2)
        if needs_mask:
            if const_expr(not self.swap_AB):
                # FA4's R2P bitmasks (as its local mask): columns relative to thread 0's, known at compile time
                thr_col_offset = tScS_mn[0][COL]
                for r in cutlass.range(cute.size(tScS_mn.shape[0]), unroll_full=True):
                    row = tScS_mn[r, 0][ROW] + m_block * self.tile_m
                    lo = sm90_col_to_r2p_idx(rows[batch_idx, row, which] - col0 - thr_col_offset)
                    hi = sm90_col_to_r2p_idx(rows[batch_idx, row, which + 1] - col0 - thr_col_offset)

                    def keep(s: int):
                        return r2p_bitmask_below(hi, s) & r2p_bitmask_above(lo, s)

                    mask_r2p_lambda(acc_S_mn[r, None], keep, rank1=True)
            else:
                for r in cutlass.range(cute.size(tScS_mn.shape[0]), unroll_full=True):
                    row = tScS_mn[r, 0][ROW] + m_block * self.tile_m
                    lo = rows[batch_idx, row, which] - col0
                    hi = rows[batch_idx, row, which + 1] - col0
                    for c in cutlass.range(cute.size(tScS_mn.shape[1]), unroll_full=True):
                        col = tScS_mn[0, c][COL]
                        if col < lo or col >= hi:
                            acc_S_mn[r, c] = -Float32.inf


# ---------------------------------------------------------------------------------------------
# The two kernel files, patched


def _patch(source: str, module: str) -> str:
    def sub(pattern, repl, text, expected):
        new, n = re.subn(pattern, repl, text)
        if n != expected:
            raise RuntimeError(f"flash-attn-4's {module}: expected {expected} match(es) of {pattern!r}, found {n} "
                               "(swa_kernels/fa4_key_intervals.py is written against flash-attn-4 4.0.0b36)")
        return new

    source = sub(r"(from flash_attn\.cute\.block_info import BlockInfo\n)",
                 r"\1from swa_kernels.fa4_key_intervals import IntervalBlockInfo, IntervalMask\n", source, 1)
    source = sub(r"block_info = BlockInfo\(", "block_info = IntervalBlockInfo.create(aux_data.tensors, ", source, 1)
    forward = "fwd" in module
    source = sub(r"AttentionMaskCls = partial\(\s*AttentionMask,",
                 f"AttentionMaskCls = partial(IntervalMask.create(aux_data.tensors, forward={forward}),", source, 1)
    calls = r"(block_info\.get_(?:n_block_min_max|n_block_min_causal_local_mask|n_block_min_before_local_mask|m_block_min_max)\()([^()]*?)(,?\s*)\)"
    source = sub(calls, r"\1\2, batch_idx=batch_idx)", source, 4)
    if forward:
        source = sub(r"(?<![\w])block=(n_block(?:_prev)?)(?=[,\s)])",
                     r"block=block_info.physical_n_block(\1, m_block, batch_idx)", source, 7)
    return source


@functools.cache
def _patched(module: str):
    spec = importlib.util.find_spec(f"flash_attn.cute.{module}")
    source = _patch(Path(spec.origin).read_text(), module)
    # CuTe DSL reads the source of the functions it compiles: the module lives in a real file
    digest = hashlib.sha1(source.encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"fa4_key_intervals_{module}_{digest}.py"
    if not path.exists():  # a temporary name of this process's own: ranks (or runs) patching at once each write theirs
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            f.write(source)
        os.replace(tmp, path)  # atomic: a reader sees the whole file or none
    name = f"_fa4_key_intervals_{module}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@contextlib.contextmanager
def _interval_kernels():
    """FA4's interface, for the duration, builds the patched SM90 classes."""
    with swapped("FlashAttention-4 key-interval attention", FlashAttentionForwardSm90=_patched("flash_fwd_sm90").FlashAttentionForwardSm90,
                 FlashAttentionBackwardSm90=_patched("flash_bwd_sm90").FlashAttentionBackwardSm90) as interface:
        yield interface


def _check_hopper(x: torch.Tensor) -> None:
    # the patch replaces FA4's SM90 classes only: another architecture would run FA4's unpatched kernels
    if torch.cuda.get_device_capability(x.device)[0] != 9:
        raise RuntimeError(f"key-interval attention runs FlashAttention-4's SM90 kernels; this GPU is "
                           f"{torch.cuda.get_device_name(x.device)}")


# FA4's Python entry points are not traceable: Dynamo breaks the graph at their DLPack wrappers, so a training step
# compiled whole (trainer.compile_scope=step) ran in pieces around every attention call, 51-56 ms a step against flex's
# 40 ms on an H200 (BENCHMARKS.md, "FlashAttention-4 installs after all"). As custom ops each direction is one node the
# compiler does not enter; the fakes give it the output shapes and (contiguous) strides: FA4 allocates out and lse
# afresh and dq, dk, dv like q, k, v, which the backward makes contiguous first (no copy for the drafter's rows).


@torch.library.custom_op("swa_drafters::fa4_key_intervals_forward", mutates_args=())
def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fwd_tables: list[torch.Tensor],
            softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """out [B, Tq, Hq, D], lse [B, Hq, Tq]; the tables' rows are packed by KV group (FA4's pack_gqa)
    unless q already is (Hq = Hkv)."""
    _check_hopper(q)
    big = k.shape[1]  # any window: FA4 then takes its local-attention code path, whose bounds we replace
    with _interval_kernels() as fa4:
        out, lse = fa4._flash_attn_fwd(q, k, v, softmax_scale=softmax_scale, window_size_left=big,
                                       window_size_right=big, pack_gqa=q.shape[2] != k.shape[2], return_lse=True,
                                       tile_mn=(128, 128),  # the tables' tiles (swa_kernels.key_intervals)
                                       aux_tensors=list(fwd_tables))[:2]
    return out.contiguous(), lse.contiguous()


@forward.register_fake
def _(q, k, v, fwd_tables, softmax_scale):
    return forward_outputs_like(q, v)


@torch.library.custom_op("swa_drafters::fa4_key_intervals_backward", mutates_args=())
def backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, dout: torch.Tensor, lse: torch.Tensor,
             bwd_tables: list[torch.Tensor], softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v = (x.contiguous() for x in (q, k, v))  # FA4 allocates dq, dk, dv like them
    big = k.shape[1]
    with _interval_kernels() as fa4:
        dq, dk, dv = fa4._flash_attn_bwd(q, k, v, out, dout, lse, softmax_scale=softmax_scale,
                                         window_size_left=big, window_size_right=big,
                                         aux_tensors=list(bwd_tables))[:3]
    return dq.contiguous(), dk.contiguous(), dv.contiguous()


@backward.register_fake
def _(q, k, v, out, dout, lse, bwd_tables, softmax_scale):
    return grads_like(q, k, v)


# ---------------------------------------------------------------------------------------------
# Head regrouping for the backward: [B, T, A, C, D] -> [B, T, C, A, D], one program per (b, t)


@triton.jit
def _swap_heads_kernel(X, Y, A: tl.constexpr, C: tl.constexpr, D: tl.constexpr):
    base = tl.program_id(0).to(tl.int64) * (A * C * D)
    c = tl.arange(0, C)[:, None, None]
    a = tl.arange(0, A)[None, :, None]
    d = tl.arange(0, D)[None, None, :]
    tl.store(Y + base + c * (A * D) + a * D + d, tl.load(X + base + a * (C * D) + c * D + d))


def swap_heads(x: torch.Tensor, a: int, c: int) -> torch.Tensor:
    """x [B, T, a * c, D] read as heads (a, c) -> [B, T, c * a, D] with heads (c, a); a copy at the
    bandwidth (PyTorch's strided copy runs these at about half of it). Non-power-of-two sizes fall
    back to PyTorch."""
    b, t, h, d = x.shape
    if any(n & (n - 1) for n in (a, c, d)):
        return x.view(b, t, a, c, d).transpose(2, 3).reshape(b, t, h, d)
    x = x.contiguous()
    y = torch.empty_like(x)
    _swap_heads_kernel[(b * t,)](x, y, a, c, d)
    return y
