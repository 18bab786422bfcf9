"""FlashAttention-4's private internals, behind one checked door.

The fast training paths (``swa_kernels/fa4_key_intervals.py``: DFlash's key intervals in FA4's SM90
kernels; ``swa_kernels/fa4_diagonal.py``: EAGLE-3's diagonal keys folded into FA4's backward
preprocess; ``swa_kernels/window_attention.py``: FA4's windowed forward/backward) call FA4's private
entry points, subclass its mask and block-info classes, patch copies of two of its kernel files and
swap attributes of its ``interface`` module for the length of a call. None of that is public API:
across FA4's betas 5 -> 27 the private entry points' parameter lists changed 13 times while the
source patches still applied, so an upgrade would have given wrong gradients rather than an error.

So nothing reaches FA4 except through here, and ``check()`` runs first: the installed
``flash-attn-4`` must be the pinned version, and every internal we use (``RECORDED``, read off
4.0.0b36's source) must still have the recorded parameter names or fields. ``available()`` (what
``attention_backend=auto`` asks) is False with one warning when the check fails, and the next
backend runs; ``require()`` (an explicit ``fa4`` / ``flex-flash``, or any patch) raises ``ValueError``
naming the version and the difference. ``tests/test_fa4_adapter.py`` checks ``RECORDED`` against
FA4's source with ``ast`` wherever the package is installed (a CPU is enough), and the refusals.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import inspect
import logging
import os
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

DISTRIBUTION = "flash-attn-4"
PINNED_VERSION = "4.0.0b36"  # pyproject.toml's fa4 extra

# (module, name) -> ("params", names in order) for functions and methods ("Class.method", self included), ("fields",
# names) for dataclasses, ("class", ()) for classes we swap or patch by name. Read off flash-attn-4 4.0.0b36's source.
RECORDED: dict[tuple[str, str], tuple[str, tuple[str, ...]]] = {
    ("flash_attn.cute.interface", "_flash_attn_fwd"): ("params", (
        "q", "k", "v", "qv", "cu_seqlens_q", "cu_seqlens_k", "seqused_q", "seqused_k", "max_seqlen_q", "max_seqlen_k",
        "min_seqlen_k", "page_table", "softmax_scale", "causal", "softcap", "window_size_left", "window_size_right",
        "learnable_sink", "tile_mn", "mma_pv_is_rs", "intra_wg_overlap", "num_threads", "num_splits", "pack_gqa", "_arch",
        "score_mod", "mask_mod", "block_sparse_tensors", "return_lse", "out", "lse", "aux_tensors", "aux_scalars",
        "q_descale", "k_descale", "v_descale", "gather_kv_indices", "scheduler_metadata", "seqlen_k_per_split",
        "disable_scheduler_metadata", "gather_bwd_recompute_p")),
    ("flash_attn.cute.interface", "_flash_attn_bwd"): ("params", (
        "q", "k", "v", "out", "dout", "lse", "softmax_scale", "causal", "softcap", "window_size_left", "window_size_right",
        "m_block_size", "n_block_size", "num_threads", "pack_gqa", "num_stages_Q", "num_stages_dO", "SdP_swapAB",
        "dKV_swapAB", "dQ_swapAB", "AtomLayoutMSdP", "AtomLayoutNdKV", "AtomLayoutMdQ", "V_in_regs", "cu_seqlens_q",
        "cu_seqlens_k", "seqused_q", "seqused_k", "max_seqlen_q", "max_seqlen_k", "deterministic", "dq", "dk", "dv",
        "score_mod", "score_mod_bwd", "mask_mod", "aux_tensors", "aux_scalars", "block_sparse_tensors", "dlse",
        "learnable_sink")),
    ("flash_attn.cute.interface", "_bwd_preprocess"): ("params", (
        "out", "dout", "dpsum", "lse", "lse_log2", "dq_accum", "cu_seqlens_q", "seqused_q", "dlse", "dtype", "head_dim",
        "head_dim_v", "m_block_size", "row_max", "scale_p", "use_padded_offsets", "nheads_major", "pack_gqa",
        "qhead_per_kvhead", "nheads_kv", "softmax_scale", "cu_total_m_blocks", "hdim_multiple_of", "o_lo", "fake_mode")),
    ("flash_attn.cute.interface", "_bwd_postprocess_convert"): ("params", (
        "accum", "output", "scale", "cu_seqlens", "seqused", "arch", "dtype", "hdim", "block_size", "num_threads",
        "atom_layout", "swap_ab", "use_2cta_instrs", "cluster_size", "cu_total_m_blocks", "sink_tensors",
        "hdim_multiple_of", "accum_order", "fake_mode")),
    ("flash_attn.cute.interface", "FlashAttentionForwardSm90"): ("class", ()),
    ("flash_attn.cute.interface", "FlashAttentionBackwardSm90"): ("class", ()),
    ("flash_attn.cute.flash_fwd_sm90", "FlashAttentionForwardSm90"): ("class", ()),
    ("flash_attn.cute.flash_bwd_sm90", "FlashAttentionBackwardSm90"): ("class", ()),
    ("flash_attn.cute.block_info", "BlockInfo"): ("fields", (
        "tile_m", "tile_n", "is_causal", "is_local", "is_split_kv", "window_size_left", "window_size_right",
        "qhead_per_kvhead_packgqa", "num_splits", "pack_split_idx", "num_n_blocks_per_split")),
    ("flash_attn.cute.mask", "AttentionMask"): ("fields", (
        "tile_m", "tile_n", "seqlen_info", "window_size_left", "window_size_right", "qhead_per_kvhead_packgqa", "swap_AB")),
    # the methods fa4_key_intervals' IntervalBlockInfo / IntervalMask override (FA4's kernels call them positionally)
    ("flash_attn.cute.block_info", "BlockInfo.get_n_block_min_max"): ("params", (
        "self", "seqlen_info", "m_block", "split_idx", "num_splits")),
    ("flash_attn.cute.block_info", "BlockInfo.get_n_block_min_causal_local_mask"): ("params", (
        "self", "seqlen_info", "m_block", "n_block_min")),
    ("flash_attn.cute.block_info", "BlockInfo.get_n_block_min_before_local_mask"): ("params", (
        "self", "seqlen_info", "m_block", "n_block_min")),
    ("flash_attn.cute.block_info", "BlockInfo.get_m_block_min_max"): ("params", ("self", "seqlen_info", "n_block")),
    ("flash_attn.cute.mask", "AttentionMask.apply_mask"): ("params", (
        "self", "acc_S", "batch_idx", "head_idx", "m_block", "n_block", "thr_mma", "mask_seqlen", "mask_causal", "mask_local",
        "mask_mod", "aux_data", "fastdiv_mods")),
    ("flash_attn.cute.mask", "mask_r2p_lambda"): ("params", ("X", "mask_gen_fn", "rank1")),
    ("flash_attn.cute.mask", "r2p_bitmask_above"): ("params", ("limit", "s")),
    ("flash_attn.cute.mask", "r2p_bitmask_below"): ("params", ("limit", "s")),
    ("flash_attn.cute.mask", "sm90_col_to_r2p_idx"): ("params", ("col_limit",)),
    ("quack.layout_utils", ""): ("module", ()),
}


@dataclass(frozen=True)
class Fa4Check:
    ok: bool
    version: str | None  # the installed flash-attn-4, None when not installed
    reason: str


def installed_version() -> str | None:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def described(obj, kind: str) -> tuple[str, ...]:
    """What ``RECORDED`` holds for a live object: parameter names, or dataclass field names."""
    if kind == "params":
        return tuple(inspect.signature(obj).parameters)
    if kind == "fields":
        import dataclasses

        return tuple(f.name for f in dataclasses.fields(obj))
    return ()


def mismatches(lookup) -> list[str]:
    """Every recorded internal that ``lookup(module, name) -> object`` (raises when missing) does not match."""
    found = []
    for (module, name), (kind, expected) in RECORDED.items():
        where = f"{module}.{name}" if name else module
        try:
            obj = lookup(module, name)
        except Exception as e:  # missing module or attribute
            found.append(f"{where}: missing ({type(e).__name__}: {e})")
            continue
        if kind == "class" and not inspect.isclass(obj):
            found.append(f"{where}: not a class")
        elif kind in ("params", "fields"):
            actual = described(obj, kind)
            if actual != expected:
                extra, gone = [a for a in actual if a not in expected], [e for e in expected if e not in actual]
                found.append(f"{where}: {kind} changed (new {extra}, gone {gone}" + (", reordered)" if not (extra or gone) else ")"))
    return found


def _live(module: str, name: str):
    obj = importlib.import_module(module)
    for part in name.split(".") if name else ():  # "Class.method": a method looked up on its class
        obj = getattr(obj, part)
    return obj


@functools.cache
def check() -> Fa4Check:
    """Installed, the pinned version, and every recorded internal as recorded (cached per process)."""
    version = installed_version()
    if version is None:
        return Fa4Check(False, None, f"{DISTRIBUTION} is not installed")
    if version != PINNED_VERSION:
        return Fa4Check(False, version, f"{DISTRIBUTION} {version} is installed; this code is checked against {PINNED_VERSION} "
                                         f"(pip install '{DISTRIBUTION}[cu13]=={PINNED_VERSION}')")
    try:
        importlib.import_module("flash_attn.cute.interface")
    except Exception as e:  # its compiler libraries (nvidia-cutlass-dsl) missing or not loading
        hint = ""
        if isinstance(e, ModuleNotFoundError) and (e.name or "").split(".")[0] == "cutlass":
            # the DSL's Python sources ship in nvidia-cutlass-dsl-libs-core (a dependency of -libs-base since 4.6):
            # pip resolves it, a --no-deps or --target install of the wheels named in the extra does not
            hint = (" (cutlass.cute comes with nvidia-cutlass-dsl-libs-core; install nvidia-cutlass-dsl[cu13] with its "
                    "dependencies, or add -libs-core and -libs-cu13 to a --no-deps install)")
        return Fa4Check(False, version, f"{DISTRIBUTION} {version} does not import: {type(e).__name__}: {e}{hint}")
    wrong = mismatches(_live)
    if wrong:
        return Fa4Check(False, version, f"{DISTRIBUTION} {version}'s internals differ from the recorded ones: {'; '.join(wrong)}")
    return Fa4Check(True, version, "ok")


_warned = False


def available() -> bool:
    """FA4 usable here: a Hopper or newer GPU and a passing ``check()``. Installed but failing the check:
    one warning per process, and False (``attention_backend=auto`` then takes the next backend)."""
    global _warned
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        return False
    result = check()
    if not result.ok and result.version is not None and not _warned:
        _warned = True
        log.warning("FlashAttention-4 not used: %s; the next attention backend runs instead", result.reason)
    return result.ok


# FA4's persistent kernel cache (off by default; FA4 reads this variable at import) stores compiled kernels on disk under
# a fingerprint of FA4's own sources. swa_kernels/fa4_key_intervals.py compiles *patched copies* of FA4's SM90 kernels,
# which live outside those sources: with the cache on, a kernel compiled from one version of the patch would be served
# to another (FA4's compile key does not see the patch), silently. The key intervals refuse to run with it on.
PERSISTENT_CACHE_ENV = "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"


def persistent_cache_enabled() -> bool:
    """FA4's on-disk kernel cache is on (``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1``, FA4's own reading)."""
    return os.environ.get(PERSISTENT_CACHE_ENV, "0") == "1"


def refuse_persistent_cache(what: str) -> None:
    """Raise ``ValueError`` (one line) when FA4's persistent kernel cache is on: ``what`` runs patched FA4 kernels."""
    if persistent_cache_enabled():
        raise ValueError(f"{what} compiles patched copies of FlashAttention-4's kernels, which FA4's persistent kernel cache "
                         f"({PERSISTENT_CACHE_ENV}=1) keys by FA4's own sources only: it could serve a kernel built from "
                         f"another version of the patch; unset {PERSISTENT_CACHE_ENV} (or use trainer.attention_backend=flex-flash)")


def require(what: str) -> None:
    """Raise ``ValueError`` (one line) unless the check passes; call before any FA4 internal is touched."""
    result = check()
    if not result.ok:
        raise ValueError(f"{what} needs FlashAttention-4 {PINNED_VERSION}: {result.reason}")


def interface(what: str = "FlashAttention-4"):
    """FA4's ``flash_attn.cute.interface`` module, once the check passed."""
    require(what)
    return importlib.import_module("flash_attn.cute.interface")


def forward_outputs_like(q: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty tensors laid out as ``_flash_attn_fwd`` allocates its results (4.0.0b36, no varlen): out [B, T, Hq, Dv]
    in q's dtype and lse [B, Hq, T] fp32, both contiguous: the fakes of the custom ops around it."""
    b, t, h, _ = q.shape
    return q.new_empty(b, t, h, v.shape[-1]), q.new_empty(b, h, t, dtype=torch.float32)


def grads_like(*inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Empty tensors laid out as ``_flash_attn_bwd`` allocates dq, dk, dv for contiguous q, k, v (``empty_like``)."""
    return tuple(torch.empty_like(x, memory_format=torch.contiguous_format) for x in inputs)


@contextlib.contextmanager
def swapped(what: str, **attributes):
    """FA4's ``interface`` with ``attributes`` replaced for the duration (FA4 looks them up by name at
    each call), restored afterwards; only names in ``RECORDED`` may be swapped."""
    module = interface(what)
    unknown = [n for n in attributes if ("flash_attn.cute.interface", n) not in RECORDED]
    if unknown:
        raise AssertionError(f"swapping FA4 internals that are not recorded and checked: {unknown}")
    saved = {n: getattr(module, n) for n in attributes}
    for n, value in attributes.items():
        setattr(module, n, value)
    try:
        yield module
    finally:
        for n, value in saved.items():
            setattr(module, n, value)


def replacement_preprocess(launch, tile_m: int):
    """FA4's ``_bwd_preprocess`` replaced: the same parameters (4.0.0b36's, ``fa4_adapter.RECORDED``), no
    catch-all, so an argument a new FA4 passes is a TypeError, not silently dropped; every option the
    fused kernel does not implement (varlen, dlse, load-P, packed GQA, heads-major, fake tensors, another
    tile) is refused. ``launch(dpsum, lse_log2, dq_accum)`` runs the fused kernel."""

    def preprocess(out, dout, dpsum, lse, lse_log2, dq_accum, cu_seqlens_q, seqused_q, dlse, dtype, head_dim, head_dim_v,
                   m_block_size, row_max=None, scale_p=None, use_padded_offsets=True, nheads_major=False, pack_gqa=False,
                   qhead_per_kvhead=1, nheads_kv=1, softmax_scale=1.0, cu_total_m_blocks=None, hdim_multiple_of=32, o_lo=None,
                   *, fake_mode):
        unsupported = {"cu_seqlens_q": cu_seqlens_q, "seqused_q": seqused_q, "dlse": dlse, "row_max": row_max, "scale_p": scale_p,
                       "cu_total_m_blocks": cu_total_m_blocks, "o_lo": o_lo}
        asked = [n for n, v in unsupported.items() if v is not None]
        asked += [n for n, v in {"nheads_major": nheads_major, "pack_gqa": pack_gqa, "fake_mode": fake_mode}.items() if v]
        if not use_padded_offsets:
            asked.append("use_padded_offsets=False")
        if m_block_size != tile_m:
            asked.append(f"m_block_size={m_block_size} (the accumulator's tile is {tile_m})")
        if asked:
            raise RuntimeError(f"fused diagonal backward: FA4 asked its preprocess for what the replacement does not do: {asked}")
        launch(dpsum, lse_log2, dq_accum)

    return preprocess
