"""The target for the fast decoding loop: static caches for a batch of rows, decode steps as CUDA graphs.

After gpt-fast's ``model.py``/``generate.py``: the keys/values of every layer live in one buffer
preallocated for the longest context, ``[L, B, Hkv, C, D]``, written by index from a position tensor;
a decode step (``n`` = 1 token, or the ``k + 1`` tokens of a verify) is a fixed sequence of kernels over
fixed buffers, so on a GPU it is captured once per ``(batch, n)`` as a CUDA graph and replayed: the host
copies the new ids and positions in and launches one graph instead of ~15 kernels per layer.

Conventions (shared with ``models/target.py``): row ``b`` runs tokens at positions ``pos[b] .. pos[b]+n-1``;
they write cache slots at those positions and see every slot ``<=`` their own position, so rejected drafts
need no rollback (the next step writes over them before anything reads them). Layer id ``i`` = the output
of decoder layer ``i``.

Decode attention on a GPU is split-KV (``swa_kernels/decode_attention.py``, Triton flash-decoding): each KV head's
query rows read each visible key once, tiles past a row's newest position read nothing, and the kernel takes the raw
q/k/v projections (per-head norms, RoPE and the cache write inside it). Each layer's residual add is fused with the
next layer's input norm (the last one's with the final norm).
The fallback (CPU, no Triton) is two matrix products per layer (scores in fp32, softmax, probabilities x values)
over the cache up to its capacity, grouped by KV head so no key is read twice; its cost grows with the capacity,
which ``allocate`` sizes to what a generation needs. There, a step whose rows hold fewer real tokens than its width
(prompt lookup's shorter drafts, ``step``'s ``lengths``) runs only the real ones through the linears (``_packed_step``).
Prefill chunks and tree verification run row by row through SDPA with a dense mask
(``swa_kernels.attention.cached_attention``), not captured.

The weights are the Hugging Face model's own: q/k/v and gate/up are concatenated into one matrix each (the
HF parameters become views of it, so memory is not doubled and the HF model still runs as the reference).
"""

from __future__ import annotations

import functools
import gc
import math
import warnings
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from swa_kernels import argmax, skinny_gemm
from swa_kernels.attention import aligned_mask, cached_attention, grouped_attention, masked_softmax, prompt_sdpa, raise_recompile_limit
from swa_kernels.decode_attention import Rope
from swa_kernels.decode_attention import decode_attention as split_kv_attention
from models.sampling import greedy_accepted
from models.target import check_supported, decoder_layers, static_unsupported

DECODE_MAX_TOKENS = 64  # a forward of more tokens per row is a prefill chunk (row by row, SDPA)
TREE_KEY_BUCKET = 256  # tree verifies attend over the live keys rounded up to this (one captured graph per bucket)


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    wqkv: torch.Tensor  # [(Hq + 2 Hkv) D, H]
    bqkv: torch.Tensor | None
    q_norm: torch.Tensor | None  # Qwen3's per-head RMSNorm weights [D]
    k_norm: torch.Tensor | None
    wo: torch.Tensor
    bo: torch.Tensor | None
    post_norm: torch.Tensor
    w13: torch.Tensor  # gate and up, [2 I, H]
    b13: torch.Tensor | None
    w2: torch.Tensor
    b2: torch.Tensor | None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Hugging Face's Llama/Qwen RMSNorm, step for step (fp32 statistics, the weight applied in the input dtype)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE as Hugging Face applies it (``rotate_half``): x [..., D], cos/sin broadcastable to it."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def concat_linears(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight [sum of out_features, in] (and bias, zeros where a linear has none; None if none has one) for several
    linears of the same input: ``F.linear(x, weight, bias)`` is their outputs concatenated on the last dimension. Copies."""
    weight = torch.cat([lin.weight.data for lin in linears])
    biases = [lin.bias for lin in linears]
    bias = None if all(b is None for b in biases) else torch.cat(
        [b.data if b is not None else weight.new_zeros(lin.out_features) for b, lin in zip(biases, linears)])
    return weight, bias


def _fuse(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``concat_linears``, the linears' parameters then made views of the result (memory not doubled)."""
    weight, bias = concat_linears(linears)
    row = 0
    for i, lin in enumerate(linears):
        rows = lin.out_features
        lin.weight.data = weight[row:row + rows]
        if bias is not None and lin.bias is not None:
            lin.bias.data = bias[row:row + rows]
        row += rows
    return weight, bias


@dataclass(frozen=True)
class RowsPrepacked:
    """A mid-sized matrix kept twice (``prepacked_copy``): plain for products of fewer than ``PREPACK_MIN_ROWS`` rows,
    prepacked for more."""

    plain: torch.Tensor
    packed: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.plain.shape


def prepacked_linear(x: torch.Tensor, weight: "torch.Tensor | RowsPrepacked", bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear`` with ``weight`` prepacked by ``torch.ops.mkldnn._reorder_linear_weight`` (oneDNN's blocked layout):
    x [..., in] -> [..., out]. One core of the 2-core CPU machine, the reference target's linears (8 layers + head,
    fp32, weights 108 MB): 1 row 21 -> 18 ms, 8 rows 35 -> 18 ms, 64 rows (8 rows x 8 verified tokens) 112 -> 37 ms
    against MKL's sgemm on the plain matrices, which streams and repacks them every call. A matrix ``prepacked_copy``
    left plain (too small to gain) runs ``F.linear``; a ``RowsPrepacked`` one runs its copy for the row count."""
    if isinstance(weight, RowsPrepacked):
        weight = weight.packed if x.numel() >= PREPACK_MIN_ROWS * x.shape[-1] else weight.plain
    if not weight.is_mkldnn:
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


@functools.cache
def prepack_supported() -> bool:
    """Whether torch's oneDNN prepacking ops (private: ``torch.ops.mkldnn._reorder_linear_weight`` and
    ``_linear_pointwise``, checked with torch 2.13) exist here with the signature used and give ``F.linear``'s result on
    a small matrix. Checked once; where not, the CPU target runs the plain matrices and says so once."""
    try:
        w, x, b = torch.randn(8, 16), torch.randn(3, 16), torch.randn(8)
        got = torch.ops.mkldnn._linear_pointwise(x, torch.ops.mkldnn._reorder_linear_weight(w, None), b, "none", [], "")
        if torch.allclose(got, F.linear(x, w, b), atol=1e-4):
            return True
        reason = "a result different from F.linear"
    except (AttributeError, RuntimeError, TypeError) as error:
        reason = f"{type(error).__name__}: {error}"
    warnings.warn(f"torch {torch.__version__}: oneDNN's prepacked linear (torch.ops.mkldnn private ops) unusable ({reason}); "
                  "the CPU target runs its plain matrices (batched decoding is slower)", stacklevel=2)
    return False


# oneDNN's prepacked product costs ~30 µs a call whatever its size (one core of the 2-core AVX2 machine, fp32, F.linear
# against it, µs at 1 / 5 / 16 / 64 rows): [32 -> 64] 4.9/6.1/7.0/12.0 against 36/35/38/44; [512 -> 512] 41/111/179/542
# against 69/97/213/584 (a wash); [512 -> 1536] 120/356/571/1779 against 152/231/493/1787; [512 -> 2816] 223/941/1289/3357
# against 240/369/921/3290. So matrices under 2^19 elements stay plain: the tiny test and builtin targets' loops ran
# several times slower on prepacked 32 x 64 matrices than on F.linear.
PREPACK_MIN_ELEMENTS = 1 << 19
# Between 2^17 and 2^19 elements (the reference target's q|k|v [768, 512] and o [512, 512]) the answer depends on the rows:
# one core of a 2-core AVX-512 EPYC, µs at 1 / 8 / 16 / 32 / 64 rows, F.linear against prepacked: [512 -> 768]
# 35/111/182/326/602 against 48/54/87/177/313, [512 -> 512] 24/84/123/219/401 against 42/47/65/112/196. Such a matrix is
# kept both ways (``RowsPrepacked``, its bytes twice) and products of ``PREPACK_MIN_ROWS`` rows or more run prepacked:
# a batched verify's many rows, not batch 1's one-token steps. Only where torch runs AVX-512 kernels: on the AVX2 machine
# above prepacked [512 -> 512] was 8-19% slower at 16-64 rows, so there these matrices stay plain as before
PREPACK_BY_ROWS_MIN_ELEMENTS = 1 << 17
PREPACK_MIN_ROWS = 8


@functools.cache
def prepack_by_rows() -> bool:
    return torch.backends.cpu.get_cpu_capability() == "AVX512"


# ``_packed_step`` on the CPU: each row's real queries over its own keys (True), or one SDPA over the padded layout (False,
# the path before; kept for the A/B in BENCHMARKS.md and for the GPU, where the uncaptured packed step keeps it)
ROW_ATTENTION_ON_CPU = True


def prepacked_copy(m: torch.Tensor) -> torch.Tensor:
    """A copy of the matrix [out, in] in oneDNN's blocked layout, for ``prepacked_linear``; a matrix of fewer than
    ``PREPACK_MIN_ELEMENTS`` elements comes back as it is (``prepacked_linear`` runs ``F.linear`` on it), but for one of
    ``PREPACK_BY_ROWS_MIN_ELEMENTS`` or more on an AVX-512 CPU: both copies (``RowsPrepacked``)."""
    if m.numel() < PREPACK_BY_ROWS_MIN_ELEMENTS or (m.numel() < PREPACK_MIN_ELEMENTS and not prepack_by_rows()):
        return m
    if m.numel() < PREPACK_MIN_ELEMENTS:
        return RowsPrepacked(m, torch.ops.mkldnn._reorder_linear_weight(m, None))
    return torch.ops.mkldnn._reorder_linear_weight(m, None)


def prepack_by_default(device: torch.device, dtype: torch.dtype) -> bool:
    """Where the static models prepack their matrices unless told: the CPU in fp32, where the ops are usable."""
    return device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available() and prepack_supported()


def few_row_products(prepacked: bool, triton_products: bool):
    """The product the static models run (``linear(x, weight, bias)``): oneDNN's on prepacked matrices, the Triton
    few-row kernel where it has a measured tiling (``skinny_gemm.few_row_linear``, cuBLAS elsewhere), or ``F.linear``."""
    return prepacked_linear if prepacked else skinny_gemm.few_row_linear if triton_products else F.linear


def prepack_layer(w: LayerWeights) -> LayerWeights:
    """The layer's four matrices prepacked for ``prepacked_linear`` (copies; norms and biases as they are)."""
    return replace(w, wqkv=prepacked_copy(w.wqkv), wo=prepacked_copy(w.wo), w13=prepacked_copy(w.w13), w2=prepacked_copy(w.w2))


class StaticTarget:
    """The target LM over static per-row caches; ``step`` is the captured decode/verify forward.

    Args:
        model: a loaded HF causal LM (Llama/Qwen-style full-attention layers; ``static_unsupported``).
        feature_layer_ids: layer ids whose outputs are returned as features (may be empty).
        capture: replay decode steps as CUDA graphs (default: on CUDA devices).
        compile_layers: run the decoder layer under ``torch.compile`` inside the graphs (fuses the norms,
            RoPE and the MLP's activation; compiles once per step shape).
        decode_attention: ``split_kv`` (``swa_kernels.decode_attention``, Triton: each visible key read once, splits past a
            row's length skipped) or ``products`` (two cuBLAS products and a softmax over the whole capacity). Default:
            ``split_kv`` on CUDA where Triton imports (else ``products``, said once), ``products`` on the CPU.
        prepack: run the linears on copies of their matrices prepacked for oneDNN (``prepacked_linear``; default: on
            the CPU in fp32, without ``compile_layers``). Costs the linears' weights once more in memory.
        triton_products: steps of at most 16 rows run q|k|v, gate|up and the LM head through ``swa_kernels/skinny_gemm.py``
            where it has a measured tiling (``skinny_gemm.TUNED``: Qwen3-8B's widths), cuBLAS elsewhere (default: on
            CUDA where Triton imports).
    """

    def __init__(self, model: nn.Module, feature_layer_ids: list[int], capture: bool | None = None, compile_layers: bool = False,
                 decode_attention: str | None = None, prepack: bool | None = None, triton_products: bool | None = None):
        check_supported(model)
        if why := static_unsupported(model):
            raise ValueError(f"{why}: the static target runs Llama/Qwen-style full-attention layers; use CachedTarget "
                             "(infer.loading.decoding_target picks it)")
        self.model = model.eval().requires_grad_(False)
        config = model.config.get_text_config()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.scale = self.head_dim ** -0.5
        self.eps = config.rms_norm_eps
        self.embed_tokens = model.get_input_embeddings()
        self.lm_head = model.get_output_embeddings()
        self.norm = model.model.norm
        self.rotary_emb = model.model.rotary_emb
        self.feature_layer_ids = list(feature_layer_ids)
        self.weights = []
        for layer in decoder_layers(model):
            attn, mlp = layer.self_attn, layer.mlp
            wqkv, bqkv = _fuse([attn.q_proj, attn.k_proj, attn.v_proj])
            w13, b13 = _fuse([mlp.gate_proj, mlp.up_proj])
            self.weights.append(LayerWeights(
                layer.input_layernorm.weight, wqkv, bqkv,
                attn.q_norm.weight if hasattr(attn, "q_norm") else None, attn.k_norm.weight if hasattr(attn, "k_norm") else None,
                attn.o_proj.weight, attn.o_proj.bias, layer.post_attention_layernorm.weight, w13, b13,
                mlp.down_proj.weight, mlp.down_proj.bias))
        self.act = decoder_layers(model)[0].mlp.act_fn
        self.capture = self.device.type == "cuda" if capture is None else capture
        if self.capture and self.device.type != "cuda":
            raise ValueError(f"capture=True needs a CUDA device; the target is on {self.device}")
        # compiled: the pieces around attention (norms, RoPE, activation fused into few kernels) and the masked softmax;
        # the two attention products stay cuBLAS calls (inductor rewrote them into a kernel 30% slower at 32K)
        if compile_layers:
            raise_recompile_limit()  # one graph per step shape (n = 1, the verify block, EAGLE-3's chain lengths)
        maybe_compile = (lambda f, **kw: torch.compile(f, **kw)) if compile_layers else (lambda f, **kw: f)
        self.pre_attention = maybe_compile(self._pre_attention, dynamic=False)
        self.post_attention = maybe_compile(self._post_attention, dynamic=False)
        self.input_norm = maybe_compile(lambda x, weight: rms_norm(x, weight, self.eps), dynamic=False)  # layer 0's
        self.masked_softmax = maybe_compile(masked_softmax)  # the capacity varies: symbolic after its first change
        self.decode_attention = choose_decode_attention(decode_attention, self.device, self.head_dim)
        self.head_weight = self.lm_head.weight  # the logits: linear(norm(x), head_weight, lm_head.bias)
        if prepack is None:
            prepack = not compile_layers and prepack_by_default(self.device, self.dtype)
        elif prepack and not prepack_supported():
            raise ValueError(f"prepack=True: oneDNN's prepacked linear is not usable with torch {torch.__version__}; use prepack=False")
        self.prepacked = prepack
        if prepack:
            self.weights = [prepack_layer(w) for w in self.weights]
            self.head_weight = prepacked_copy(self.head_weight)
        self.triton_products = (self.device.type == "cuda" and skinny_gemm.available) if triton_products is None else triton_products
        self.linear = few_row_products(prepack, self.triton_products)
        self.k_cache: torch.Tensor | None = None  # [L, B, Hkv, C, D]
        self.v_cache: torch.Tensor | None = None
        self.cos = self.sin = None  # [C, D] RoPE tables, in the model's dtype (as HF casts them)
        self.graphs = CapturedSteps()  # one per (rows, tokens)

    def use_triton_products(self, on: bool) -> None:
        """Switch ``triton_products`` after construction (a benchmark's A/B): the steps are captured again, and the
        compiled layers compiled again, on their next call."""
        if self.prepacked:
            raise ValueError("use_triton_products: this target runs prepacked CPU matrices; the Triton products are for CUDA")
        self.triton_products = on
        self.linear = few_row_products(False, on)
        self.graphs.clear()

    # ------------------------------------------------------------------------------------------ buffers

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def capacity(self) -> int:
        return 0 if self.k_cache is None else self.k_cache.shape[3]

    @property
    def batch(self) -> int:
        return 0 if self.k_cache is None else self.k_cache.shape[1]

    def allocate(self, capacity: int, batch: int = 1, keep: int = 0) -> int:
        """Room for positions ``0 .. capacity-1`` in ``batch`` rows. A decode step reads the whole capacity, so the
        buffers (and the graphs captured on them) are kept only while they are at most twice (or 2048 positions
        more than) what is asked; new ones are rounded up to a multiple of 256.

        keep: positions ``0 .. keep-1`` of every row survive new buffers of the same batch (copied: a prefix reused by
        the next request, ``infer.generate``'s ``cached_ids``). Returns how many leading positions still hold what
        they held (the whole capacity when the buffers stay; 0 when they are new and nothing was kept)."""
        if batch == self.batch and capacity <= self.capacity <= max(2 * capacity, capacity + 2048):
            return self.capacity
        capacity = 256 * math.ceil(capacity / 256)
        old_k, old_v = self.k_cache, self.v_cache
        keep = min(keep, capacity, self.capacity) if batch == self.batch else 0
        self.k_cache = self.v_cache = None
        self.graphs.clear()
        shape = (len(self.weights), batch, self.num_kv_heads, capacity, self.head_dim)
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        if keep:
            self.k_cache[:, :, :, :keep] = old_k[:, :, :, :keep]
            self.v_cache[:, :, :, :keep] = old_v[:, :, :, :keep]
        positions = torch.arange(capacity, device=self.device)
        cos, sin = self.rotary_emb(self.k_cache.new_zeros(1, 1, self.head_dim), positions[None])
        self.cos, self.sin = cos[0], sin[0]
        return keep

    def set_feature_layers(self, layer_ids: list[int]) -> None:
        """Return these layers' outputs as features from now on (the captured steps are captured again)."""
        if list(layer_ids) != self.feature_layer_ids:
            self.feature_layer_ids = list(layer_ids)
            self.graphs.clear()

    # ------------------------------------------------------------------------------------------ decode step

    def _pre_attention(self, h, wqkv, bqkv, q_norm, k_norm, cos, sin):
        """The products path: normed rows h [B, n, H] -> queries grouped by KV head [B, Hkv, G*n, D] (rows (g, t)), keys
        and values [B, Hkv, n, D], normed and rotated. (Writing the cache in here, compiled, made inductor copy the
        cache: 32K decode 8.6 -> 15 ms per token.)"""
        b, n, _ = h.shape
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        q, k, v = self.linear(h, wqkv, bqkv).split([hq * d, hkv * d, hkv * d], dim=-1)
        q, k, v = q.view(b, n, hq, d), k.view(b, n, hkv, d), v.view(b, n, hkv, d)
        if q_norm is not None:
            q, k = rms_norm(q, q_norm, self.eps), rms_norm(k, k_norm, self.eps)
        q, k = rotate(q, cos[:, :, None], sin[:, :, None]), rotate(k, cos[:, :, None], sin[:, :, None])
        return q.transpose(1, 2).reshape(b, hkv, (hq // hkv) * n, d), k.transpose(1, 2), v.transpose(1, 2)

    def _post_attention(self, x, out, wo, bo, post_norm, w13, b13, w2, b2, next_norm):
        """The attention output [B, n, Hq, D] (a view is fine) through o_proj and the MLP, residuals included: the
        layer's output x [B, n, H] and ``next_norm`` applied to it (the next layer's input norm, or the final norm)."""
        b, n, _ = x.shape
        out = out.reshape(b, n, -1)
        x = x + self.linear(out, wo, bo)
        gate, up = self.linear(rms_norm(x, post_norm, self.eps), w13, b13).chunk(2, dim=-1)
        x = x + self.linear(self.act(gate) * up, w2, b2)
        return x, rms_norm(x, next_norm, self.eps)

    def _layer(self, x, h, w: LayerWeights, next_norm, k_cache, v_cache, cos, sin, index, pos, visible):
        """One decoder layer on rows x [B, n, H] whose input norm is h: attends over ``k/v_cache`` [B, Hkv, C, D] and
        writes its keys/values there (slot = position). Split-KV (``visible`` None): the raw q/k/v projections go to the
        kernel, which norms, rotates and writes; products: normed and rotated here, scattered at ``index`` (the
        positions, [B, Hkv, n, D]), attended under ``visible`` [B, 1, G*n, C]. Returns (x, next_norm(x)). Tensors go in
        as arguments so one compiled graph serves every layer."""
        if visible is None:
            b, n, _ = x.shape
            qkv = self.linear(h, w.wqkv, w.bqkv).view(b, n, self.num_heads + 2 * self.num_kv_heads, self.head_dim)
            q, k, v = qkv.split([self.num_heads, self.num_kv_heads, self.num_kv_heads], dim=2)
            rope = Rope(self.cos, self.sin, w.q_norm, w.k_norm, self.eps)
            out = split_kv_attention(q, k_cache, v_cache, pos, n, self.scale, k_new=k, v_new=v, rope=rope)  # [B, n, Hq, D]
        else:
            q, k, v = self.pre_attention(h, w.wqkv, w.bqkv, w.q_norm, w.k_norm, cos, sin)
            k_cache.scatter_(2, index, k)
            v_cache.scatter_(2, index, v)
            out = grouped_attention(q, k_cache, v_cache, visible, self.scale, softmax=self.masked_softmax)
            b, n = x.shape[:2]
            out = out.view(b, self.num_heads, n, self.head_dim).transpose(1, 2)  # rows (g, t) per KV head -> [B, n, Hq, D]
        return self.post_attention(x, out, w.wo, w.bo, w.post_norm, w.w13, w.b13, w.w2, w.b2, next_norm)

    def _step(self, input_ids: torch.Tensor, pos: torch.Tensor, depths: torch.Tensor | None = None,
              tree_mask: torch.Tensor | None = None, keys: int | None = None,
              float_logits: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        b, n = input_ids.shape
        positions = pos[:, None] + torch.arange(n, device=pos.device)  # [B, n] cache slots (and positions, but for trees)
        # keys attended: the whole capacity (fixed shapes for the graphs) or the caller's bucket (trees), on the CPU only up
        # to the furthest row's last position (reading it costs no sync there; batched, the capacity holds a whole
        # conversation, rows sit far below it)
        if pos.device.type == "cpu":
            keys = self._cpu_keys(pos, n)
        elif keys is None:
            keys = self.capacity
        if tree_mask is not None:  # token t at slot pos + t, RoPE position pos + depth; it sees the cache and its ancestors
            visible = self._tree_visible(positions, tree_mask, keys)
            rope_positions = pos[:, None] + depths
        else:
            visible = self._visible(positions, keys) if self.decode_attention == "products" else None
            rope_positions = positions
        index = self._cache_index(positions)
        cos, sin = self.cos[rope_positions], self.sin[rope_positions]  # [B, n, D]
        # rows gathered by indexing: nn.Embedding's index_select ran 16 rows in 9.1 µs on an H200 (its small-index
        # kernel), the gather ~1.5 (the same values); a subclass (a scaled embedding) runs its own forward
        x = self.embed_tokens.weight[input_ids] if type(self.embed_tokens) is nn.Embedding else self.embed_tokens(input_ids)
        h = self.input_norm(x, self.weights[0].input_norm)
        features = []
        for i, w in enumerate(self.weights):
            next_norm = self.weights[i + 1].input_norm if i + 1 < len(self.weights) else self.norm.weight
            x, h = self._layer(x, h, w, next_norm, self.k_cache[i, :b, :, :keys], self.v_cache[i, :b, :, :keys], cos, sin, index, pos, visible)
            if i in self.feature_layer_ids:
                features.append((self.feature_layer_ids.index(i), x))
        logits = self.linear(h, self.head_weight, self.lm_head.bias)  # h: the final norm of the last layer's output
        return logits.float() if float_logits else logits, self._ordered_features(features)

    def _cpu_keys(self, pos: torch.Tensor, n: int) -> int:
        """The cache slots a CPU step of ``n`` tokens a row at ``pos`` [B] reads: ``max(pos) + n`` (no sync there), or a
        one-line error where that runs past the capacity (was an IndexError from the RoPE tables or the cache write)."""
        keys = int(pos.max()) + n
        if keys > self.capacity:
            raise ValueError(f"step to position {keys} exceeds the KV cache capacity {self.capacity}; call allocate() first")
        return keys

    def _greedy_step(self, input_ids: torch.Tensor, pos: torch.Tensor, forced: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        # ``greedy_step``'s graph: the forward, the argmax of every row on the head's own dtype (the fp32 cast is exact,
        # so the argmax is the same), the accepted prefix and the token after it; on a GPU in two kernels
        # (``swa_kernels.argmax.greedy_values``: in torch ops they were a dozen, ~23 µs a step on an H200)
        logits, features = self._step(input_ids, pos, float_logits=False)
        if logits.is_cuda and argmax.available:
            return argmax.greedy_values(logits, input_ids, forced), features
        tokens = logits.argmax(-1)  # [B, n]
        accepted = greedy_accepted(input_ids[:, 1:], tokens[:, :-1])  # [B]
        accepted = torch.where(forced >= 0, forced, accepted)
        following = tokens.gather(1, accepted[:, None])  # [B, 1]
        return torch.cat([accepted[:, None], input_ids[:, 1:], following], dim=1), features

    def _visible(self, positions: torch.Tensor, keys: int) -> torch.Tensor:
        """The products path's mask [B, 1, G*n, keys]: query rows (g, t) at ``positions`` [B, n] see keys at or before them."""
        groups = self.num_heads // self.num_kv_heads
        return (torch.arange(keys, device=positions.device) <= positions[..., None])[:, None].repeat(1, 1, groups, 1)

    def _tree_visible(self, slots: torch.Tensor, tree_mask: torch.Tensor, keys: int) -> torch.Tensor:
        """The products path's mask [B, 1, G*n, keys] for trees at cache ``slots`` [B, n] (row b's from pos[b] on):
        every key before the tree, and among the tree's own slots those ``tree_mask`` [B, n, n] allows."""
        b, n = slots.shape
        groups = self.num_heads // self.num_kv_heads
        visible = (torch.arange(keys, device=slots.device) < slots[:, :1])[:, None].expand(b, n, keys).clone()
        visible.scatter_(2, slots[:, None].expand(b, n, n), tree_mask)
        return visible[:, None].repeat(1, 1, groups, 1)

    def _cache_index(self, positions: torch.Tensor) -> torch.Tensor:
        """Where [B, Hkv, n, D] keys/values at ``positions`` [B, n] scatter into a layer's cache (slot = position)."""
        b, n = positions.shape
        return positions[:, None, :, None].expand(b, self.num_kv_heads, n, self.head_dim)

    def _ordered_features(self, features: list[tuple[int, torch.Tensor]]) -> torch.Tensor | None:
        """(index in ``feature_layer_ids``, hidden) pairs -> [..., k*H] in ``feature_layer_ids`` order, or None."""
        return torch.cat([f for _, f in sorted(features, key=lambda t: t[0])], dim=-1) if features else None

    def _packed_step(self, input_ids: torch.Tensor, pos: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``_step`` (products, uncaptured) where row ``b`` holds ``lengths[b]`` real tokens and padding after them: the
        real tokens are packed into N rows for everything but attention (the linears are most of a CPU step: a batch of
        prompt-lookup blocks is about a third padding), attention runs over the padded [B, n] layout. The padding's
        queries, keys and values are zeros; its keys are written to the cache at positions past the row's last real
        token, which no real query sees (it attends to positions <= its own) and which the row's next step writes
        before any query at or past them reads them, as it does over rejected drafts. Padding's logits are zeros."""
        # input_ids: [B, n], pos: [B], lengths: [B] (1 .. n)
        b, n = input_ids.shape
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        steps = torch.arange(n, device=pos.device)
        positions = pos[:, None] + steps  # [B, n]
        real = (steps < lengths[:, None]).reshape(-1).nonzero()[:, 0]  # [N] indices of the real tokens in the B*n block
        keys = self._cpu_keys(pos, n) if pos.device.type == "cpu" else int(pos.max()) + n
        real_positions = positions.reshape(-1)[real]  # [N]
        per_row = pos.device.type == "cpu" and ROW_ATTENTION_ON_CPU
        if per_row:
            # Attention is per-row work (no weights to share), and over the padded [B, n] layout with every row's keys up
            # to the furthest row it was mostly padding: prompt lookup proposes 0 .. k drafts a row, rows sit at different
            # lengths. On the CPU each row's real queries attend over its own keys instead (one SDPA a row and layer,
            # the shapes batch 1 runs): a batch-4 prompt-lookup worker on one core spent 17% of its time in the padded
            # attention (BENCHMARKS.md "Prompt lookup's batched verify attends row by row on the CPU")
            groups = hq // hkv
            starts, counts = pos.tolist(), lengths.tolist()
            # each row's mask [G*m, p+m] (rows (g, t): token t's for every g), built once a step for every layer
            masks = [None if mask is None else mask.repeat(groups, 1)
                     for mask in (aligned_mask(m, p + m, True, None, pos.device) for p, m in zip(starts, counts))]
            real_rows = torch.arange(b, device=pos.device).repeat_interleave(lengths)  # [N]
            visible = index = None
        else:
            visible, index = self._visible(positions, keys), self._cache_index(positions)
        cos, sin = self.cos[real_positions][:, None], self.sin[real_positions][:, None]  # [N, 1, D]

        def padded(t):  # [N, ...] -> [B, n, ...], zeros at the padding
            return t.new_zeros(b * n, *t.shape[1:]).index_copy_(0, real, t).view(b, n, *t.shape[1:])

        def unpack(t):  # [N, heads, D] -> [B, heads, n, D], zeros at the padding
            return padded(t).transpose(1, 2)

        def attend(i, q, k, v):  # q [N, Hq, D], k/v [N, Hkv, D] normed and rotated -> the attention output [N, Hq, D]
            k_cache, v_cache = self.k_cache[i, :b, :, :keys], self.v_cache[i, :b, :, :keys]
            if per_row:  # the CPU: each row's real queries over its own keys, as batch 1 attends
                k_cache[real_rows, :, real_positions] = k
                v_cache[real_rows, :, real_positions] = v
                return torch.cat([self._row_attention(q_r, k_cache[r, :, :p + m], v_cache[r, :, :p + m], mask)
                                  for r, (q_r, p, m, mask) in enumerate(zip(q.split(counts), starts, counts, masks))])
            k_cache.scatter_(2, index, unpack(k))
            v_cache.scatter_(2, index, unpack(v))
            q = unpack(q).reshape(b, hkv, (hq // hkv) * n, d)  # rows (g, t) per KV head, as ``_pre_attention`` groups them
            out = grouped_attention(q, k_cache, v_cache, visible, self.scale, softmax=self.masked_softmax)  # [B, Hkv, G*n, D]
            return out.view(b, hq, n, d).transpose(1, 2).reshape(b * n, hq, d)[real]

        x = self.embed_tokens(input_ids.reshape(-1)[real])  # [N, H]
        features = []
        for i, w in enumerate(self.weights):
            x = self._eager_layer(i, x, w, cos, sin, attend)
            if i in self.feature_layer_ids:
                features.append((self.feature_layer_ids.index(i), x))
        logits = self.linear(rms_norm(x, self.norm.weight, self.eps), self.head_weight, self.lm_head.bias).float()  # [N, V]
        packed = self._ordered_features(features)  # [N, k*H] or None
        return padded(logits), None if packed is None else padded(packed)

    def _row_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """One row's m queries [m, Hq, D] over its keys/values [Hkv, K, D] (the queries at the last m positions), ``mask``
        [G*m, K] over rows (g, t) or None (all visible): [m, Hq, D], grouped per KV head as the batched path."""
        m, hq, d = q.shape
        qg = q.transpose(0, 1).reshape(1, k.shape[0], hq // k.shape[0] * m, d)
        out = grouped_attention(qg, k[None], v[None], mask, self.scale)  # [1, Hkv, G*m, D]; the CPU: SDPA, mask None = all
        return out.view(hq, m, d).transpose(0, 1)

    @torch.no_grad()
    def step(self, input_ids: torch.Tensor, pos: torch.Tensor,
             lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Decode/verify ``n`` tokens per row: ``input_ids`` [B, n] at positions ``pos[b] ..`` (``pos`` [B], on the device).

        Uncaptured, B may be fewer than the caches' rows: the first B rows step (batched decoding packs its live rows
        there, ``move_row``, rather than stepping finished ones). Captured, B is every row (one graph per shape).
        ``lengths`` [B] (1 .. n, on the device; None: all n): row ``b``'s first ``lengths[b]`` tokens are real, the rest
        padding (prompt lookup's shorter drafts). Uncaptured on the products path (the CPU), only the real tokens run
        through the linears (``_packed_step``); captured, every token runs (fixed shapes). Either way the padding's
        outputs mean nothing and its keys are written over before they are seen.
        Returns logits [B, n, V] fp32 and features [B, n, k*H] (None without feature layers). On a GPU these are the
        captured graph's output buffers: valid until the next ``step`` of the same shape.
        """
        b, n = input_ids.shape
        if b != self.batch and (self.capture or not 0 < b < self.batch):
            raise ValueError(f"step with {b} rows; the caches hold {self.batch} (allocate(capacity, batch={b}); fewer only uncaptured)")
        if n > DECODE_MAX_TOKENS:
            raise ValueError(f"step of {n} tokens per row; at most {DECODE_MAX_TOKENS} (longer runs are prefill chunks)")
        if not self.capture:
            if lengths is not None and self.decode_attention == "products" and int(lengths.min()) < n:
                return self._packed_step(input_ids, pos, lengths)
            return self._step(input_ids, pos)
        return self.graphs("step", self._step, input_ids, pos)

    @torch.no_grad()
    def greedy_step(self, input_ids: torch.Tensor, pos: torch.Tensor,
                    forced: torch.Tensor | None = None, borrowed: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``step`` and its greedy verification in one captured graph (no argmax, comparison or gather launched apart):
        ``input_ids`` [B, n] each row's newest token then its n-1 drafts (n = 1: a plain decode step) at ``pos`` [B].

        Returns ``values`` [B, n+1] int64: the accepted draft count a (the drafts' prefix equal to the target's greedy
        tokens), the n-1 drafts, and the target's token after the accepted ones (row a of its argmax); and the features as
        ``step``'s. ``forced`` [B] (benchmarks, ``generate(accept_per_step=)``): where >= 0, a is that count whatever the
        verification says (the same work per step). On a GPU the graph's output buffers, valid until its next replay.
        ``borrowed``: the three inputs are the caller's persistent buffers, read in place (``CapturedSteps``: no copies in;
        ``infer.generate`` hands a drafter graph's output here). The constant unforced count is read in place always."""
        b, n = input_ids.shape
        if b != self.batch or n > DECODE_MAX_TOKENS:
            raise ValueError(f"greedy_step of {b} rows x {n} tokens; expected {self.batch} rows of at most {DECODE_MAX_TOKENS}")
        if forced is None:  # a constant, kept: no fill kernel a step
            if self._unforced is None or self._unforced.shape[0] != b or self._unforced.device != input_ids.device:
                self._unforced = torch.full((b,), -1, dtype=torch.long, device=input_ids.device)
            forced = self._unforced
        if not self.capture:
            return self._greedy_step(input_ids, pos, forced)
        borrow = (0, 1, 2) if borrowed else (2,) if forced is self._unforced else ()
        return self.graphs("greedy_step", self._greedy_step, input_ids, pos, forced, borrowed=borrow)

    def chain_inputs(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Persistent device buffers for row 0's next verify of ``n`` tokens: ids [1, n] and position [1], the same
        tensors every call (per ``n``). A drafter's captured step writes them (``StaticDFlashDrafter.append_and_draft``)
        and the verify's graph reads them in place (``greedy_forward(at=)``): owned here, so every drafter object (a
        window's copy included) hands this target's one verify graph its inputs."""
        if self._chain_inputs is None or any(t.device != self.device for pair in self._chain_inputs.values() for t in pair):
            self._chain_inputs = {}
        if n not in self._chain_inputs:
            self._chain_inputs[n] = (torch.zeros(1, n, dtype=torch.long, device=self.device),
                                     torch.zeros(1, dtype=torch.long, device=self.device))
        return self._chain_inputs[n]

    def greedy_forward(self, input_ids: torch.Tensor, start: int, forced: torch.Tensor | None = None,
                       at: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``greedy_step`` for row 0 (``infer.generate``'s batch-1 loop): ``input_ids`` [n] at position ``start``;
        values [n+1] and features [n, k*H] (or None). ``at``: [1] on the device, holding ``start`` already (``chain_inputs``'
        position, its ids then ``input_ids``, and ``forced`` a constant): the graph reads the three in place (``borrowed``)."""
        n = input_ids.shape[0]
        if start + n > self.capacity:
            raise ValueError(f"forward to position {start + n} exceeds the KV cache capacity {self.capacity}; call allocate() first")
        if at is None:
            if self._pos is None or self._pos.device != self.device:
                self._pos = torch.zeros(1, dtype=torch.long, device=self.device)
            self._pos.fill_(start)
        values, features = self.greedy_step(input_ids[None], self._pos if at is None else at,
                                            None if forced is None else forced.reshape(1), borrowed=at is not None)
        return values[0], None if features is None else features[0]

    @torch.no_grad()
    def tree_step(self, input_ids: torch.Tensor, pos: torch.Tensor, depths: torch.Tensor,
                  tree_mask: torch.Tensor, keys: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Verify a draft tree per row: ``input_ids`` [B, n] (the root, then the nodes) written at cache slots
        ``pos[b] ..``, at RoPE positions ``pos[b] + depths[b]`` (``depths`` [B, n], 0 for the root), token t seeing the
        row's keys before ``pos[b]`` and the tree tokens ``tree_mask[b, t]`` [B, n, n] allows (its ancestors and itself).
        Always the products path (the split-KV kernel has no tree mask). The accepted path's keys are then moved into
        place (``move_paths``). Returns ``step``'s logits and features (captured: the graph's buffers).

        keys: on a GPU, a bound the caller knows on the host for ``max(pos) + n``; the products then run over that many
        cache slots rounded up to a multiple of ``TREE_KEY_BUCKET`` (one graph per bucket) instead of the capacity, which
        a batched evaluation sizes for a whole conversation (SmolLM2 at batch 16 on an H100: a 385-node tree's verify
        took 21.1 ms over the capacity and 17.9 over the live keys). A bound below ``max(pos) + n`` is an error on the
        device (the cache write's index). The CPU attends exactly up to ``max(pos) + n`` whatever is given."""
        bucket = self._tree_bucket("tree_step", input_ids, keys)
        if not self.capture:
            return self._step(input_ids, pos, depths, tree_mask, keys=bucket)
        return self.graphs(("tree", bucket), functools.partial(self._step, keys=bucket), input_ids, pos, depths, tree_mask)

    @torch.no_grad()
    def tree_greedy(self, input_ids: torch.Tensor, pos: torch.Tensor, depths: torch.Tensor,
                    tree_mask: torch.Tensor, keys: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``tree_step`` for greedy acceptance (trees are greedy only): every node's target token [B, n], the argmax
        taken inside the graph over the head's own dtype (the fp32 cast is exact: the same tokens), and the features. A
        graph per key bucket keeps [B, n] ids for output where ``tree_step``'s keeps [B, n, V] fp32 logits (SmolLM2 at
        batch 16 with a 385-node tree: ~1.2 GB a bucket, the buckets up to the capacity's / 256)."""
        bucket = self._tree_bucket("tree_greedy", input_ids, keys)
        if not self.capture:
            return self._tree_tokens(input_ids, pos, depths, tree_mask, keys=bucket)
        return self.graphs(("tree_greedy", bucket), functools.partial(self._tree_tokens, keys=bucket), input_ids, pos, depths, tree_mask)

    def _tree_tokens(self, input_ids, pos, depths, tree_mask, keys):
        logits, features = self._step(input_ids, pos, depths, tree_mask, keys=keys, float_logits=False)
        return logits.argmax(-1), features

    def _tree_bucket(self, name: str, input_ids: torch.Tensor, keys: int | None) -> int | None:
        b, n = input_ids.shape
        if b != self.batch:
            raise ValueError(f"{name} with {b} rows; the caches hold {self.batch}")
        if keys is None or self.device.type == "cpu":
            return None
        if not n <= keys <= self.capacity:
            raise ValueError(f"{name} keys={keys}: expected {n} .. the capacity {self.capacity}")
        return min(self.capacity, -(-keys // TREE_KEY_BUCKET) * TREE_KEY_BUCKET)

    def move_paths(self, path: torch.Tensor, pos: torch.Tensor) -> None:
        """Every row's accepted tree path into place: row b's keys/values at slots ``pos[b] + path[b, j]`` move to
        ``pos[b] + 1 + j`` (``path`` [B, d]; a path is deeper than it is long only where it holds j + 1: no move).
        All read before any is written."""
        L, b, h, _, d = self.k_cache.shape
        src = (pos[:, None] + path)[None, :, None, :, None].expand(L, b, h, path.shape[1], d)
        dst = (pos[:, None] + 1 + torch.arange(path.shape[1], device=pos.device))[None, :, None, :, None].expand_as(src)
        for cache in (self.k_cache, self.v_cache):
            cache.scatter_(3, dst, cache.gather(3, src))

    def move_row(self, src: int, dst: int, length: int) -> None:
        """Row ``src``'s cached keys and values at positions ``< length`` into row ``dst`` (what ``dst`` held is gone)."""
        self.k_cache[:, dst, :, :length] = self.k_cache[:, src, :, :length]
        self.v_cache[:, dst, :, :length] = self.v_cache[:, src, :, :length]

    # ------------------------------------------------------------------------------------------ prefill, trees

    def _eager_layer(self, i: int, x: torch.Tensor, w: LayerWeights, cos: torch.Tensor, sin: torch.Tensor, attend) -> torch.Tensor:
        """Decoder layer ``i`` in eager ops for prompt runs (``prefill``, ``prefill_rows``) and packed verify tokens
        (``_packed_step``): x [..., n, H] -> [..., n, H].
        ``attend(i, q, k, v)`` gets the queries, keys and values [..., n, heads, D] (normed and rotated), writes the
        layer's cache and returns the attention output [..., n, Hq, D]."""
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        lead = x.shape[:-1]
        h = rms_norm(x, w.input_norm, self.eps)
        q, k, v = self.linear(h, w.wqkv, w.bqkv).split([hq * d, hkv * d, hkv * d], dim=-1)
        q, k, v = q.view(*lead, hq, d), k.view(*lead, hkv, d), v.view(*lead, hkv, d)
        if w.q_norm is not None:
            q, k = rms_norm(q, w.q_norm, self.eps), rms_norm(k, w.k_norm, self.eps)
        out = attend(i, rotate(q, cos, sin), rotate(k, cos, sin), v)
        x = x + self.linear(out.reshape(*lead, hq * d), w.wo, w.bo)
        h = rms_norm(x, w.post_norm, self.eps)
        gate, up = self.linear(h, w.w13, w.b13).chunk(2, dim=-1)
        return x + self.linear(self.act(gate) * up, w.w2, w.b2)

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, row: int, start: int, last_logits_only: bool = False,
                positions: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Row ``row``'s tokens ``input_ids`` [n] at positions ``start ..`` (eager, SDPA): prompt chunks and tree verification.

        ``positions`` [n] (RoPE positions, tree: ``start + depth``) and ``mask`` [n, n] (which new tokens each sees) are
        as in ``CachedTarget.forward``. Returns logits [n, V] (or [1, V]) fp32 and features [n, k*H] or None.
        """
        n = input_ids.shape[0]
        end = start + n
        if end > self.capacity:
            raise ValueError(f"forward to position {end} exceeds the KV cache capacity {self.capacity}; call allocate() first")
        if positions is None:
            positions = torch.arange(start, end, device=self.device)
        if mask is not None:
            mask = torch.cat([torch.ones(n, start, dtype=torch.bool, device=self.device), mask.to(self.device)], dim=1)
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # [n, 1, D]

        def attend(i, q, k, v):  # q/k/v [n, heads, D]
            self.k_cache[i, row, :, start:end] = k.transpose(0, 1)
            self.v_cache[i, row, :, start:end] = v.transpose(0, 1)
            return cached_attention(q, self.k_cache[i, row, :, :end].transpose(0, 1), self.v_cache[i, row, :, :end].transpose(0, 1),
                                    causal=True, window=None, scale=self.scale, mask=mask)

        x = self.embed_tokens(input_ids)  # [n, H]
        features = {}
        for i, w in enumerate(self.weights):
            x = self._eager_layer(i, x, w, cos, sin, attend)
            if i in self.feature_layer_ids:
                features[i] = x
        if last_logits_only:
            x = x[-1:]
        logits = self.linear(self.norm(x), self.head_weight, self.lm_head.bias).float()
        if not features:
            return logits, None
        return logits, torch.cat([features[i] for i in self.feature_layer_ids], dim=-1)

    @torch.no_grad()
    def prefill_rows(self, prompts: list[torch.Tensor], rows: list[int], starts: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Prompts into several rows in one forward (eager, SDPA): ``prompts[j]`` [n_j] into row ``rows[j]`` at positions
        ``starts[j] ..`` (default 0: whole prompts). A start past 0 continues a prefix the row's cache already holds
        (keys and values at positions ``< starts[j]``, which the new tokens attend to): a conversation's next turn
        after its earlier turns and answers (``infer.batch``). The prompts are right-padded to the longest; from
        position 0 a row's padded positions write keys past its prompt, which no query sees before the row's own
        decoding writes them (a step writes its keys before attending); past a prefix, only real tokens are written.

        One forward for m prompts launches the kernels of one: a small target's prefill is launch-bound, so batching
        the rows that start together is what keeps many rows in flight fast (``infer.batch``).

        Returns the last prompt token's logits [m, V] fp32 and features [m, L, k*H] (row j's first n_j valid) or None.
        """
        m, lengths = len(prompts), [int(p.shape[0]) for p in prompts]
        starts = [0] * m if starts is None else list(starts)
        length = max(lengths)
        end = max(s + n for s, n in zip(starts, lengths))
        if max(length, end) > self.capacity:
            raise ValueError(f"prefill to position {max(length, end)} exceeds the KV cache capacity {self.capacity}; call allocate() first")
        ids = torch.zeros(m, length, dtype=torch.long, device=self.device)
        for j, p in enumerate(prompts):
            ids[j, :lengths[j]] = p
        row_index = torch.as_tensor(rows, device=self.device)
        groups = self.num_heads // self.num_kv_heads
        if any(starts):
            # positions [m, L]: a row's padding repeats its last real position (RoPE only; its keys are not written)
            steps = torch.arange(length, device=self.device)
            start_t, length_t = torch.as_tensor(starts, device=self.device), torch.as_tensor(lengths, device=self.device)
            positions = start_t[:, None] + torch.minimum(steps, length_t[:, None] - 1)
            real = steps < length_t[:, None]  # [m, L]
            write_rows, write_pos = row_index[:, None].expand(m, length)[real], positions[real]  # [N]
            # query t of row j sees the row's keys 0 .. starts[j] + t (its cached prefix, then its own tokens causally)
            visible = (torch.arange(end, device=self.device) <= positions[..., None])[:, None]  # [m, 1, L, end]
            cos, sin = self.cos[positions][:, :, None], self.sin[positions][:, :, None]  # [m, L, 1, D]

            def attend(i, q, k, v):  # q/k/v [m, L, heads, D]
                self.k_cache[i, write_rows, :, write_pos] = k[real]
                self.v_cache[i, write_rows, :, write_pos] = v[real]
                keys, values = self.k_cache[i, row_index, :, :end], self.v_cache[i, row_index, :, :end]  # [m, Hkv, end, D]
                out = prompt_sdpa(q.transpose(1, 2), keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1),
                                  attn_mask=visible, scale=self.scale)
                return out.transpose(1, 2)
        else:
            cos, sin = self.cos[:length][:, None], self.sin[:length][:, None]  # [L, 1, D]

            def attend(i, q, k, v):  # q/k/v [m, L, heads, D]
                q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [m, heads, L, D]
                self.k_cache[i, row_index, :, :length] = k
                self.v_cache[i, row_index, :, :length] = v
                out = prompt_sdpa(q, k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1),
                                  is_causal=True, scale=self.scale)  # right padding: causal is exact for real queries
                return out.transpose(1, 2)

        x = self.embed_tokens(ids)  # [m, L, H]
        features = {}
        for i, w in enumerate(self.weights):
            x = self._eager_layer(i, x, w, cos, sin, attend)
            if i in self.feature_layer_ids:
                features[i] = x
        last = x[torch.arange(m, device=self.device), torch.as_tensor(lengths, device=self.device) - 1]  # [m, H]
        logits = self.linear(self.norm(last), self.head_weight, self.lm_head.bias).float()
        if not features:
            return logits, None
        return logits, torch.cat([features[i] for i in self.feature_layer_ids], dim=-1)

    def move(self, slots: torch.Tensor, dest: int, row: int = 0) -> None:
        """Copy row ``row``'s keys/values of cache ``slots`` [m] to slots ``dest .. dest+m-1`` (an accepted tree path)."""
        m = slots.shape[0]
        self.k_cache[:, row, :, dest:dest + m] = self.k_cache[:, row, :, slots]
        self.v_cache[:, row, :, dest:dest + m] = self.v_cache[:, row, :, slots]

    # ------------------------------------------------------------------------------------------ batch-1 loop interface

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, start: int, last_logits_only: bool = False, positions: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``CachedTarget.forward`` for row 0 (what ``infer.generate.generate`` calls): short runs are captured steps."""
        n = input_ids.shape[0]
        if last_logits_only or positions is not None or mask is not None or n > DECODE_MAX_TOKENS or self.batch != 1:
            return self.prefill(input_ids, 0, start, last_logits_only, positions, mask)
        if start + n > self.capacity:
            raise ValueError(f"forward to position {start + n} exceeds the KV cache capacity {self.capacity}; call allocate() first")
        if self._pos is None or self._pos.device != self.device:
            self._pos = torch.zeros(1, dtype=torch.long, device=self.device)
        self._pos.fill_(start)
        logits, features = self.step(input_ids[None], self._pos)
        return logits[0], None if features is None else features[0]

    _pos: torch.Tensor | None = None
    _unforced: torch.Tensor | None = None  # ``greedy_step``'s forced counts when none are given: -1 a row
    _chain_inputs: dict | None = None  # ``chain_inputs``' buffers by block length


def choose_decode_attention(name: str | None, device: torch.device, head_dim: int) -> str:
    """``split_kv`` or ``products`` (see ``StaticTarget``): by default the kernel on a GPU with Triton and a power-of-two
    head dimension >= 16 (``tl.dot`` over it), the products elsewhere; an explicit ``split_kv`` that cannot run is an
    error."""
    from swa_kernels import decode_attention

    if name not in (None, "split_kv", "products"):
        raise ValueError(f"decode_attention={name!r}; expected 'split_kv' or 'products'")
    shaped = decode_attention.takes_head_dim(head_dim)
    if name == "split_kv" and not (decode_attention.available() and shaped):
        raise ValueError(f"decode_attention='split_kv' needs Triton (pip install triton) and a power-of-two head_dim of at "
                         f"least 16 (this target's: {head_dim}); use 'products'")
    if name is not None:
        return name
    if device.type != "cuda":
        return "products"
    if not decode_attention.available():
        warnings.warn("Triton is not importable: decode attention falls back to two products over the whole cache "
                      "(slower at long contexts)", stacklevel=3)
        return "products"
    if not shaped:  # e.g. head_dim 80 or 96: the kernel would refuse it at the first step
        warnings.warn(f"head_dim {head_dim} is not a power of two >= 16: decode attention runs as two products over the "
                      "whole cache (slower at long contexts)", stacklevel=3)
        return "products"
    return "split_kv"


def move_kept_positions(new_pos: torch.Tensor, new_k: torch.Tensor, new_v: torch.Tensor, old_pos: torch.Tensor, old_k: torch.Tensor,
                        old_v: torch.Tensor, keep: int) -> None:
    """The static drafters' slot caches grown with a kept prefix: every row's entries at positions ``< keep`` of the old
    cache (slot positions ``[B, S]``, keys/values ``[B, Hkv, S + scratch, D]``) into the new one's slots (position mod
    its S; a shorter ring takes the last S of them)."""
    rows, old_slots = ((old_pos >= max(0, keep - new_pos.shape[1])) & (old_pos < keep)).nonzero(as_tuple=True)
    positions = old_pos[rows, old_slots]
    new_slots = positions % new_pos.shape[1]
    new_pos[rows, new_slots] = positions
    new_k[rows, :, new_slots], new_v[rows, :, new_slots] = old_k[rows, :, old_slots], old_v[rows, :, old_slots]


class CapturedSteps:
    """Step functions captured as CUDA graphs on first use and replayed after: one graph per key (a name and the
    inputs' shapes), all in one memory pool. ``clear`` when the buffers they were captured on are replaced; the next
    capture starts a fresh pool (a pool outliving its graphs cannot be reused). Used by the target and the static
    drafters.

    ``borrowed``: the indices of inputs the graph reads in place, neither cloned at capture nor copied in at a call: the
    caller's own persistent buffers (another graph's outputs, a loop's device positions), which hand one graph's results
    to the next with no copy kernel between them. Their addresses, shapes, strides and dtypes are part of the key (a new
    buffer captures a new graph), so a borrowed input must be the same buffer call after call; a step may update one in
    place (the capture's warm-up runs on copies of them).

    At most ``max_borrowed_variants`` graphs of one name and shapes over different borrowed buffers are kept, the least
    recently replayed dropped for a new one: a borrowed buffer can go stale while its graph stays (the static DFlash
    drafter's step borrows the target's verify outputs, which a target that grows its caches captures anew; 8 such
    growths made the 9th generation fail). A caller that captures that many in a row with no replay between them is
    taken for a mistake (a fresh tensor each call would capture a graph each call: slow, the pool growing without
    bound): ValueError."""

    def __init__(self):
        self.graphs: dict[tuple, CapturedStep] = {}  # in order of last use (a replay moves its key to the end)
        self.fresh: dict[tuple, int] = {}  # captures of borrowed variants in a row, per name and shapes, since a replay
        self.pool = None

    def clear(self) -> None:
        self.graphs.clear()
        self.fresh.clear()

    max_borrowed_variants = 8

    def __call__(self, name, fn, *inputs: torch.Tensor, borrowed: tuple[int, ...] = ()):
        shapes = (name,) + tuple(t.shape for t in inputs)
        key = shapes + tuple((i, inputs[i].data_ptr(), inputs[i].stride(), inputs[i].dtype) for i in borrowed)
        graph = self.graphs.pop(key, None)
        if graph is None:
            variants = [k for k in self.graphs if k[:len(shapes)] == shapes] if borrowed else []
            if len(variants) >= self.max_borrowed_variants:
                if self.fresh.get(shapes, 0) >= self.max_borrowed_variants:
                    raise ValueError(f"captured step {name!r}: {self.max_borrowed_variants} graphs captured in a row, each over "
                                     f"other buffers for the borrowed inputs {list(borrowed)}; a borrowed input must be the "
                                     f"caller's same buffer every call (copy into one, or do not borrow it)")
                del self.graphs[variants[0]]  # the least recently replayed
            if not self.graphs:
                self.pool = torch.cuda.graph_pool_handle()
            graph = CapturedStep(fn, *inputs, pool=self.pool, borrowed=borrowed)
            if borrowed:
                self.fresh[shapes] = self.fresh.get(shapes, 0) + 1
        elif borrowed:
            self.fresh[shapes] = 0
        self.graphs[key] = graph
        return graph(*inputs)


class CapturedStep:
    """One step shape as a CUDA graph: static input buffers (copies of the first call's; the ``borrowed`` ones the
    caller's own, read in place: ``CapturedSteps``), warmed up on a side stream, then captured; a call copies the other
    inputs in and replays. Outputs are the graph's own buffers."""

    def __init__(self, fn, *inputs: torch.Tensor, pool, warmup: int = 2, borrowed: tuple[int, ...] = ()):
        self.copied = [i for i in range(len(inputs)) if i not in borrowed]
        self.inputs = [t if i in borrowed else t.clone() for i, t in enumerate(inputs)]
        # the warm-up on copies of the borrowed buffers: a step may update one of them in place (a loop's position),
        # which must happen once a replay, not once more per warm-up run
        warm = [t.clone() if i in borrowed else t for i, t in enumerate(self.inputs)]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):  # cuBLAS workspaces, compiled kernels, allocator pools: outside the capture
                fn(*warm)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        # no cyclic garbage collection while capturing: a dead cycle holding an older graph (a dropped static target or
        # drafter: they hold cycles) collected mid-capture destroys that graph and frees its pool, calls a capture
        # forbids, and the capture fails ("operation failed due to a previous error during capture") with the process's
        # CUDA state left broken for every later capture and random draw (torch.cuda.graph no longer collects first)
        collecting = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.graph(self.graph, pool=pool):
                self.out = fn(*self.inputs)
        finally:
            if collecting:
                gc.enable()

    def __call__(self, *inputs: torch.Tensor):
        for i in self.copied:
            self.inputs[i].copy_(inputs[i])
        self.graph.replay()
        return self.out
