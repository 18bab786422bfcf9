"""One attention entry point: flex_attention for a ``BlockMask``, SDPA for a dense boolean mask,
FlashAttention-4 with per-row key intervals for a ``KeyIntervalMask`` (``swa_kernels.key_intervals``).

Shapes: q [B, Hq, Q, D], k/v [B, Hkv, K, D] (grouped-query attention when Hq > Hkv); returns
[B, Hq, Q, D]. The backend follows the mask type, so the caller picks it once when it builds masks
(flex on CUDA, dense SDPA on CPU; tests may force either).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from swa_kernels.key_intervals import KeyIntervalMask


FLASH_KERNELS = {"BACKEND": "FLASH"}  # flex_attention's kernel_options: run the block mask on FlashAttention-4's kernels


@dataclass(frozen=True)
class PackedQueryMask:
    """A flex ``BlockMask`` over query rows packed by KV group: row (n, g, k) is slot k of query
    block n under query head g of its KV head; every ``rows`` consecutive queries form a block."""

    block_mask: object
    groups: int  # query heads per KV head
    rows: int  # queries per block (the packing keeps a block's rows together)
    kernel_options: dict | None = None  # flex_attention's, e.g. {"BACKEND": "FLASH"} (FlashAttention-4)


def _pack_queries(q: torch.Tensor, groups: int, rows: int) -> torch.Tensor:
    """[B, Hkv*G, N*R, D] -> [B, Hkv, N*G*R, D], rows ordered (block, head in group, row)."""
    b, hq, q_len, d = q.shape
    return q.reshape(b, hq // groups, groups, q_len // rows, rows, d).transpose(2, 3).reshape(b, hq // groups, -1, d)


def _unpack_queries(x: torch.Tensor, groups: int, rows: int) -> torch.Tensor:
    b, hkv, packed, d = x.shape
    return x.reshape(b, hkv, packed // (groups * rows), groups, rows, d).transpose(2, 3).reshape(b, hkv * groups, -1, d)


def raise_recompile_limit(limit: int = 64) -> None:
    """One compiled kernel per shape: EAGLE-3's training-time test alone has 7 key lengths (x2 for
    eval batches, x2 layer types); past dynamo's default limit of 8 compiled code silently falls
    back to eager (for flex: scores materialised, peak memory 5 -> 13 GiB on the reference target)."""
    import torch._dynamo

    config = torch._dynamo.config
    if not hasattr(config, "recompile_limit"):  # torch 2.7's name (cache_size_limit before); pyproject asks for >= 2.11
        raise RuntimeError(f"torch {torch.__version__}: torch._dynamo.config has no recompile_limit; expected torch >= 2.11")
    config.recompile_limit = max(config.recompile_limit, limit)


@functools.cache
def compiled_flex_attention():
    from torch.nn.attention.flex_attention import flex_attention

    raise_recompile_limit()
    # flex_attention only reaches kernel speed compiled; compiled once per process.
    return torch.compile(flex_attention, dynamic=False)


def block_mask_from_tiles(kept: torch.Tensor, full: torch.Tensor, mask_mod, q_len: int, kv_len: int, q_rows: int, kv_tile: int):
    """A flex ``BlockMask`` from [Bsz, Qt, Kt] kept / full tiles: partial tiles run ``mask_mod``, full ones skip it."""
    from torch.nn.attention.flex_attention import BlockMask

    def as_lists(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        count = tiles.sum(-1, dtype=torch.int32)[:, None]  # [Bsz, 1, Qt]
        order = torch.argsort((~tiles).to(torch.int8), dim=-1, stable=True).to(torch.int32)[:, None]  # kept tiles first, in order
        return count, order

    partial = kept & ~full
    return BlockMask.from_kv_blocks(*as_lists(partial), *as_lists(full), BLOCK_SIZE=(q_rows, kv_tile), mask_mod=mask_mod,
                                    seq_lengths=(q_len, kv_len))


def triton_flex_options(head_dim: int, backward: bool = False) -> dict | None:
    """flex_attention's Triton tile sizes for the trainers' masks. At head_dim 64 (the reference target) the default
    forward ran 7.6 ms per layer against 0.78 ms with 64 x 64 tiles, and forward + backward 10.6 against 3.2 ms
    (benchmarks/probe_flex_dflash.py, H100, 16 rows x 2048 tokens, 256 anchors; BENCHMARKS.md). EAGLE-3's
    TTT masks take the same (measured in training throughput). Larger heads keep flex's defaults (not measured here).
    ``backward`` (DFlash's packed masks): also the backward's tiles, 64 on every side with 4 warps and 2 stages
    (BLOCK_M1..N2 and the bwd_-prefixed options reach only the backward): 2.26 ms a layer against 2.56 ms with the sm90
    default (M1 64, N1 128, M2 128, N2 64, 8 warps, 3 stages), a whole training step 52.9 against 55.4 ms
    (probe_flex_dflash.py --variants bwd, train_throughput.py; H100; BENCHMARKS.md)."""
    if head_dim > 64:
        return None
    options = {"BLOCK_M": 64, "BLOCK_N": 64}
    if backward:
        options.update(BLOCK_M1=64, BLOCK_N1=64, BLOCK_M2=64, BLOCK_N2=64, bwd_num_warps=4, bwd_num_stages=2)
    return options


# cuDNN's fused attention, torch's first choice for bf16 prompts on Hopper, builds an execution plan for every new
# shape: a 30-layer prefill of SmolLM2's shape took 62-116 ms at each new length against 18-42 ms for the same shape
# again, where the memory-efficient kernel took 19-34 ms either way (H200, torch 2.11, cuDNN 9.19;
# benchmarks/profile_prefill_rows.py, seventeenth session). Inference's prompts change length every call (regeneration
# waves, prompt chunks, drafters' prefills), so their attention leaves cuDNN out; the caller's other backends stay as
# they are. (Few queries over a cache take the two-product path on a GPU, no SDPA: ``cached_attention``.) Benchmarks
# set PROMPT_SDPA_SKIPS_CUDNN False to time torch's own choice. Checked on an H200 after the change (eighteenth
# session): 22 / 34 ms a wave at a new length each call against torch's choice's 72 / 87 ms, and SmolLM2's 6-turn
# regeneration in 6.7 min where an H100 took 17.5 before it.
PROMPT_SDPA_SKIPS_CUDNN = True


def prompt_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """``F.scaled_dot_product_attention(q, k, v, **kwargs)`` for attention whose shapes change call by call, with
    cuDNN's backend off for the call (above). Under torch.compile (fixed shapes: a plan built once) as it is. The one
    flag is turned off and back on, ~1.5 µs a call where ``sdpa_kernel``'s context took ~10 (a CPU decode step's every
    layer comes through here)."""
    if not PROMPT_SDPA_SKIPS_CUDNN or torch.compiler.is_compiling() or not torch.backends.cuda.cudnn_sdp_enabled():
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, scale: float | None = None,
              kernel_options: dict | None = None) -> torch.Tensor:
    """Masked attention; ``mask`` is a flex ``BlockMask``, a ``PackedQueryMask``, or a bool tensor
    broadcastable to [B, Hq, Q, K]. ``kernel_options`` go to flex_attention."""
    if isinstance(mask, torch.Tensor) or mask is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    if isinstance(mask, KeyIntervalMask):  # FlashAttention-4's kernels with per-row key intervals (GPU)
        return mask.attend(q, k, v, scale)
    from torch.nn.attention.flex_attention import flex_attention

    flex = compiled_flex_attention() if q.is_cuda else flex_attention  # eager flex: CPU tests only
    if isinstance(mask, PackedQueryMask):
        if q.shape[1] != k.shape[1] * mask.groups:
            raise ValueError(f"a mask packed for {mask.groups} query heads per KV head got {q.shape[1]} / {k.shape[1]}")
        out = flex(_pack_queries(q, mask.groups, mask.rows), k, v, block_mask=mask.block_mask, scale=scale,
                   kernel_options=kernel_options or mask.kernel_options)
        return _unpack_queries(out, mask.groups, mask.rows)
    return flex(q, k, v, block_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1], kernel_options=kernel_options)


def masked_softmax(scores: torch.Tensor, visible: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """softmax(scale * scores) over the visible keys: fp32 scores in, probabilities out in ``dtype`` (compiled, the
    cast is fused: at 32K keys the fp32 probabilities' extra round trip was a third of a 16-token verify)."""
    return torch.softmax((scores * scale).masked_fill(~visible, float("-inf")), dim=-1).to(dtype)


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float,
                      softmax=masked_softmax) -> torch.Tensor:
    """Softmax attention of few queries over a long cache, as two batched matrix products (cuBLAS reads each key once).

    q [B, Hkv, M, D] (the M query rows of one KV head's group), k/v [B, Hkv, C, D], visible [B, 1 or Hkv, M, C] bool.
    Scores and softmax in fp32 (bf16 inputs: ``bmm(..., out_dtype=float32)``, fp32 accumulation as in flash kernels);
    probabilities cast to the values' dtype for the second product. Every row must see at least one key.
    Returns [B, Hkv, M, D] in q's dtype.

    On the CPU with the plain softmax: SDPA with ``visible`` as its mask instead (one fused kernel, no fp32 score
    matrix written and read back: a batch-8 × 8-token prompt-lookup verify over 708 keys, one layer, 2 threads, 1.4 ms
    against 2.1 ms). A custom ``softmax`` (DFlash's over slots) keeps the two products.
    """
    if not q.is_cuda and softmax is masked_softmax:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale)
    b, h, m, d = q.shape
    c = k.shape[2]
    q3, k3 = q.reshape(b * h, m, d), k.reshape(b * h, c, d)
    if q.dtype == torch.float32:
        scores = torch.bmm(q3, k3.transpose(1, 2))
    elif q.is_cuda:
        scores = torch.bmm(q3, k3.transpose(1, 2), out_dtype=torch.float32)
    else:  # CPU low precision: no fp32-output bmm there
        scores = torch.bmm(q3.float(), k3.float().transpose(1, 2))
    probs = softmax(scores.view(b, h, m, c), visible, scale, v.dtype)
    return torch.bmm(probs.view(b * h, m, c), v.reshape(b * h, c, d)).view(b, h, m, d)


SMALL_QUERY = 64  # at most this many queries over a cache: the two-product path on CUDA (decode, verify, draft blocks)


# --- Attention over a cache whose keys sit at consecutive positions (inference) -------------------
#
# Layout shared by the target's KV cache and the drafter's context cache: the keys are positions
# k0 .. k0 + K - 1 and the Q queries are the last Q of those positions (bottom-right alignment, as
# FlashInfer aligns a causal mask when kv_len > qo_len). One window convention (Hugging Face
# ``sliding_window``): W keys visible, the query itself included; FlashInfer's window_left is W - 1.


def aligned_visible(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool, window: int | None) -> torch.Tensor:
    """True where the query at ``q_pos`` sees the key at ``k_pos`` (broadcasting position tensors).

    causal: keys up to the query's own position; non-causal: every key. A window keeps keys with
    ``q - W < k`` and, non-causal, ``k < q + W`` (a symmetric band, z-lab's DFlash rule).
    """
    visible = k_pos <= q_pos if causal else torch.ones_like(k_pos <= q_pos)
    if window is not None:
        visible = visible & (k_pos > q_pos - window)
        if not causal:
            visible = visible & (k_pos < q_pos + window)
    return visible


def aligned_mask(q_len: int, k_len: int, causal: bool, window: int | None, device: torch.device) -> torch.Tensor | None:
    """[Q, K] bool mask for ``aligned_visible`` with the queries at the last Q key positions; None when all visible."""
    if not causal and (window is None or window >= k_len):
        return None
    if causal and q_len == 1 and (window is None or window >= k_len):
        return None
    k_pos = torch.arange(k_len, device=device)
    q_pos = k_pos[k_len - q_len:, None]
    return aligned_visible(q_pos, k_pos[None], causal, window)


def cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, window: int | None,
                     scale: float, backend: str = "sdpa", mask: torch.Tensor | None = None,
                     sinks: torch.Tensor | None = None, sink_slot: bool = False) -> torch.Tensor:
    """Attention of Q queries over K cached keys at consecutive positions, queries aligned at the end.

    Args:
        q: [Q, Hq, D] queries (positions K-Q .. K-1 relative to the first key).
        k, v: [K, Hkv, D] keys/values (NHD, the caches' layout; a slice of a larger buffer is fine).
        causal, window: see ``aligned_visible``.
        backend: ``sdpa`` (any device) or ``flashinfer`` (CUDA; ``window_left = W - 1``).
        mask: optional [Q, K] bool (True = visible) replacing ``causal``/``window`` (tree attention).
        sinks: optional [Hq] attention-sink logits (gpt-oss): one more term ``exp(sink)`` in each head's softmax
            denominator, attached to no value (``attention_with_sinks``). SDPA only.
        sink_slot: with ``sinks``, k and v carry one more row after the K keys, all zeros (the caller's spare cache
            slot), which serves as the sink's key instead of a copy of k and v with a zero row appended.

    Returns:
        [Q, Hq, D].
    """
    if sinks is not None:
        if backend != "sdpa":
            raise ValueError(f"attention backend {backend!r}: attention sinks (gpt-oss) run on 'sdpa' only")
        if mask is None:
            mask = aligned_mask(q.shape[0], k.shape[0] - sink_slot, causal, window, q.device)
        return attention_with_sinks(q, k, v, mask, scale, sinks, zero_row=sink_slot)
    if backend == "flashinfer":
        import flashinfer

        if mask is None and not causal and window is not None and window < q.shape[0]:
            # FlashInfer's window bounds the left side only (kv_idx + qo_len + window_left >= kv_len + qo_idx in its
            # variants.cuh): a non-causal band narrower than the queries (a bidirectional sliding layer with W under
            # the block size) needs its right edge k < q + W as a mask
            mask = aligned_mask(q.shape[0], k.shape[0], causal, window, q.device)
        if mask is not None:
            return flashinfer.single_prefill_with_kv_cache(q, k, v, custom_mask=mask, sm_scale=scale)
        return flashinfer.single_prefill_with_kv_cache(
            q, k, v, causal=causal, window_left=-1 if window is None else window - 1, sm_scale=scale)
    if backend != "sdpa":
        raise ValueError(f"attention backend {backend!r}; expected 'sdpa' or 'flashinfer'")
    q_len, k_len = q.shape[0], k.shape[0]
    if q.is_cuda and q_len <= SMALL_QUERY:
        # few queries over a long cache: SDPA's masked kernels tile over queries (a handful of blocks for one token)
        # or copy the keys per query head; two products read each key once
        hq, hkv, d = q.shape[1], k.shape[1], q.shape[2]
        groups = hq // hkv
        if mask is None:
            mask = aligned_mask(q_len, k_len, causal, window, q.device)
        visible = torch.ones(1, 1, 1, k_len, dtype=torch.bool, device=q.device) if mask is None else mask.repeat(groups, 1)[None, None]
        out = grouped_attention(q.permute(1, 0, 2).reshape(1, hkv, groups * q_len, d), k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                visible, scale)
        return out[0].reshape(hq, q_len, d).transpose(0, 1)
    # a causal square without a window is SDPA's own is_causal (its fast kernels take no mask)
    square_causal = causal and q_len == k_len > 1 and (window is None or window >= k_len)
    if mask is None:
        mask = None if square_causal else aligned_mask(q_len, k_len, causal, window, q.device)
    else:
        square_causal = False
    out = prompt_sdpa(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        attn_mask=mask, is_causal=square_causal, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return out[0].transpose(0, 1)


def attention_with_sinks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor | None, scale: float,
                         sinks: torch.Tensor, zero_row: bool = False) -> torch.Tensor:
    """Softmax attention with per-head sink logits, as gpt-oss's ``eager_attention_forward`` computes it:
    ``softmax([scale * q.k for each visible key] + [sink_h])`` with the sink's share dropped, i.e. each head's
    denominator gains ``exp(sink_h)``. Done as SDPA over one extra key that is all zeros (score 0) with a zero value,
    the sink added to that key's score through a float mask: exact, no scores materialised by hand.

    q [Q, Hq, D], k/v [K, Hkv, D] (``zero_row``: [K + 1, Hkv, D], the last row zeros already), visible [Q, K] bool or
    None (all visible), sinks [Hq]. Returns [Q, Hq, D].
    The mask is per head ([Hq, rows, K + 1]), so the queries go through in chunks of at most ``SINK_MASK_BYTES`` of it
    (a 4,096-token prefill chunk over 32K keys with gpt-oss-20b's 64 heads would otherwise hold 17 GB of bf16 mask)."""
    q_len, hq, _ = q.shape
    if not zero_row:
        zero = k.new_zeros(1, *k.shape[1:])
        k, v = torch.cat([k, zero]), torch.cat([v, zero])
    k_len = k.shape[0] - 1
    k1, v1 = k.transpose(0, 1)[None], v.transpose(0, 1)[None]  # [1, Hkv, K + 1, D]
    rows = max(1, SINK_MASK_BYTES // (hq * (k_len + 1) * q.element_size()))
    outs = []
    for lo in range(0, q_len, rows):
        hi = min(q_len, lo + rows)
        bias = q.new_zeros(1, hq, hi - lo, k_len + 1)  # SDPA takes a float mask in the queries' dtype
        if visible is not None:
            bias[..., :k_len].masked_fill_(~visible[lo:hi], float("-inf"))
        bias[..., k_len] = sinks.to(bias.dtype)[:, None]
        outs.append(F.scaled_dot_product_attention(q[lo:hi].transpose(0, 1)[None], k1, v1, attn_mask=bias, scale=scale,
                                                   enable_gqa=hq != k.shape[1])[0].transpose(0, 1))
    return outs[0] if len(outs) == 1 else torch.cat(outs)


SINK_MASK_BYTES = 256 << 20  # attention_with_sinks' per-head float mask, at most this much a chunk of queries
