"""EAGLE-3 training (``drafter.kind=eagle3``): the drafter it builds, the training-time test (TTT) and
its masks, and its step (its config schema, ``Eagle3Config``, is in ``train/config.py``).

Index t of a sequence holds the target's features at position t and, at step j, the ground-truth
token x_{t+j+1} (teacher forcing); step 0 reads ``fc(features)``, step j > 0 the drafter's own
output of step j - 1 at the same index (``Eagle3DraftModel.next_hidden``). Step j's output at index
t predicts x_{t+j+2}: its target is the target model's distribution at position t+j+1, restricted
to the draft vocabulary and renormalised (soft labels), weighted 0.8^j. A label counts when
x_{t+j+2} is a real token in the loss mask.

Statistics per step j: accuracy (the draft's argmax, mapped to a target id, equals the target's
argmax over its whole vocabulary, i.e. greedy acceptance) and the simulated acceptance length
``sim_tau`` = 1 + mean over start indices of the run of leading correct steps: with teacher forcing
the drafter sees exactly what greedy chain drafting would feed it while it is right.

TTT masks. Step j (0-based) of the unrolled drafter runs T queries, one per index t, and writes T new keys.
Its queries see the keys of steps 0..j laid side by side:

    keys     kv = s * T + u          step s, index u        (K = (j + 1) * T)
    position index u at step s sits at RoPE position u + 1 + s (models/eagle3.py)

A query (index t, step j, position p = t + 1 + j) sees
    step-0 keys   u <= t (causal), u a real token or u == t          -- the context cache
    step-s keys   u == t for 1 <= s <= j (the diagonal)               -- its own earlier drafts
and in a sliding layer only keys at positions > p - W (W keys counting the query itself), the
window the same query has at inference: the context cache's last positions and the draft chain.
Every query sees itself (step j, index t), so no softmax row is empty (padding rows included).

``ttt_visible`` uses tensor ops only: it fills a dense boolean mask for SDPA (CPU) and is the
flex_attention ``mask_mod`` (GPU), whose block mask skips every tile the window rules out.
"""

from __future__ import annotations


import contextlib
import functools
import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from swa_kernels.attention import attention, block_mask_from_tiles, triton_flex_options
from swa_kernels.window_attention import band_ops, cudnn_band_available, cudnn_ops, default_ops, fa4_available, window_attention
from models.eagle3 import Eagle3DraftModel, build_draft_vocab, make_eagle3_config
from models.target import TargetModel, default_layer_ids

from .config import Eagle3Config, TrainConfig  # noqa: F401  (Eagle3Config: the schema, in the light config module)
from .loop_eval import tau_summaries, walk_segments

log = logging.getLogger(__name__)

NAME = "EAGLE-3"

# Legend: Bsz batch, T indices per step, j step, K = (j + 1) * T keys, H hidden, Vd draft vocabulary.


def feature_layer_ids(d: Eagle3Config, num_layers: int) -> list[int]:
    """The target layers read when ``drafter.target_layer_ids`` is null: low, mid, high."""
    return default_layer_ids("eagle3", num_layers)


def fastest_gpu_backend(cfg: TrainConfig, drafter: Eagle3DraftModel) -> str:
    """What ``trainer.attention_backend=auto`` runs on the GPU.

    The window in one kernel + the fused diagonal keys, over the whole TTT at 32K, W=2048 on the H100:
    FlashAttention-4 1.9x, cuDNN's band 1.7x flex's attention (BENCHMARKS.md, issue 8); they need W >= TTT length.
    The whole step of the small recipe on an H200 (FA4's calls as custom ops): FA4 273 ms, flex 299 ms."""
    window = cfg.drafter.sliding_window
    if cfg.data.pack_documents or (window is not None and window < cfg.drafter.ttt_length):
        return "flex"  # the window kernels have no document boundaries, nor a window shorter than the unroll
    if fa4_available():
        return "fa4"
    return "cudnn" if cudnn_band_available() else "flex"


def loss_token_counts(rows, vocab_size: int) -> torch.Tensor:
    """[V] how often each token id appears under the loss mask (the tokens a drafter must predict)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for row in rows:
        ids = torch.as_tensor(row["input_ids"])[torch.as_tensor(row["loss_mask"], dtype=torch.bool)]
        counts += torch.bincount(ids, minlength=vocab_size)[:vocab_size]
    return counts


def build_drafter(cfg: TrainConfig, target: TargetModel, layer_ids: list[int], train_ds) -> Eagle3DraftModel:
    """EAGLE-3 drafter: draft vocabulary from the training data's loss-masked token counts, the
    target's embedding (frozen) and its LM-head rows for the draft vocabulary as the head's start."""
    d = cfg.drafter
    config = make_eagle3_config(
        target.config, num_hidden_layers=d.num_hidden_layers, target_layer_ids=layer_ids, layer_types=d.resolved_layer_types(),
        sliding_window=d.sliding_window, draft_vocab_size=d.draft_vocab_size, ttt_length=d.ttt_length, fc_norm=d.fc_norm,
        norm_output=d.norm_output, norm_before_fc=d.norm_before_fc,
    )
    torch.manual_seed(cfg.trainer.seed)
    drafter = Eagle3DraftModel(config)
    counts = loss_token_counts(train_ds, target.vocab_size)
    d2t, t2d = build_draft_vocab({i: int(c) for i, c in enumerate(counts.tolist()) if c}, target.vocab_size, config.draft_vocab_size)
    drafter.set_draft_vocab(d2t, t2d)
    with torch.no_grad():
        drafter.embed_tokens.weight.copy_(target.embed_tokens.weight.float())
        drafter.lm_head.weight.copy_(target.lm_head.weight.float()[drafter.draft_ids_in_target().to(target.lm_head.weight.device)].cpu())
    kept = float(counts[t2d].sum() / counts.sum().clamp(min=1))
    log.info("EAGLE-3 draft vocabulary: %d of %d target tokens, covering %.1f%% of loss-masked training tokens",
             config.draft_vocab_size, target.vocab_size, 100 * kept)
    return drafter


# ----------------------------------------------------------------------------- the step

class Eagle3Step:
    """One EAGLE-3 training step's pieces, fixed at start-up: ``plan`` (nothing random), ``num_labels``,
    ``forward`` (target features -> the TTT unroll -> soft CE and stats) and ``evaluate_batch``. ``ctx``
    is the trainer's ``StepContext`` (device, attention backend, precision, target features)."""

    def __init__(self, ctx, drafter: Eagle3DraftModel):
        self.ctx, self.cfg, self.drafter = ctx, ctx.cfg, drafter
        self.steps = self.cfg.drafter.ttt_length
        self.chunk_rows = soft_ce_chunk_rows(drafter.config.draft_vocab_size)
        window = self.cfg.drafter.sliding_window
        self.uniform_keys = self.cfg.trainer.ttt_uniform_keys
        if self.uniform_keys and ctx.backend not in ("flex", "sdpa"):  # "auto" resolved to a window kernel
            raise ValueError(f"trainer.ttt_uniform_keys=true needs the flex or sdpa attention backend; "
                             f"trainer.attention_backend resolved to {ctx.backend} (set flex on a GPU)")
        if ctx.backend in WINDOW_BACKENDS and window is not None and window < self.steps:
            raise ValueError(f"trainer.attention_backend={ctx.backend} needs drafter.sliding_window >= drafter.ttt_length "
                             f"({window} < {self.steps}); use flex")
        # trainer.compile_scope=step on a GPU: the TTT unroll and its loss as one compiled function (one graph forward,
        # one backward; FA4's calls are custom ops, flex's block masks are built outside it). Eager, each step's
        # layers, masks and soft-CE chunks launch thousands of small kernels: the small-target step was host-bound
        # (BENCHMARKS.md, "EAGLE-3's training step compiled whole"). Evaluation stays eager.
        self.unroll_and_loss = unroll_and_loss
        trainer_cfg = self.cfg.trainer
        if trainer_cfg.compile_drafter and trainer_cfg.compile_scope == "step" and ctx.device.type == "cuda":
            if trainer_cfg.activation_checkpointing:
                # Dynamo cannot trace the unroll's key lists growing inside a checkpointed step: eager, said once
                log.warning("EAGLE-3 with trainer.activation_checkpointing=true: the training step runs eager "
                            "(trainer.compile_scope=step compiles only steps without checkpointed TTT steps)")
                return
            from swa_kernels.attention import raise_recompile_limit

            raise_recompile_limit()  # one graph per padded length (trainer.pad_multiple)
            self.unroll_and_loss = torch.compile(unroll_and_loss, dynamic=False)

    @contextlib.contextmanager
    def eager(self):
        """The step with the compiled function off (module hooks fire: FLOP counting)."""
        compiled, self.unroll_and_loss = self.unroll_and_loss, unroll_and_loss
        try:
            yield self
        finally:
            self.unroll_and_loss = compiled

    def plan(self, batch: dict[str, torch.Tensor], generator: torch.Generator) -> None:
        return None  # nothing random: every index is a start

    def num_labels(self, batch: dict[str, torch.Tensor], plan) -> torch.Tensor:
        return label_mask(batch["input_ids"], batch["loss_mask"], batch["attention_mask"], 0, batch.get("doc_start")).sum()  # no host sync

    @torch.no_grad()
    def evaluate_batch(self, batch: dict[str, torch.Tensor]) -> TTTStats:
        """Held-out stats and the loop replayed over each assistant turn (``block_tau``): the chain
        started at index t is the loop's step anchored at position t + 1 (the bonus token there)."""
        stats, per_start = self.forward(batch, per_start=True)
        by_anchor = torch.full_like(per_start, -1)
        by_anchor[:, 1:] = per_start[:, :-1]
        tokens, steps = walk_segments(by_anchor.cpu(), batch["loss_mask"].cpu())
        stats.walk_tokens += tokens
        stats.walk_steps += steps
        return stats

    def forward(self, batch: dict[str, torch.Tensor], plan=None, per_start: bool = False):
        input_ids = batch["input_ids"].to(self.ctx.device)
        attention_mask = batch["attention_mask"].to(self.ctx.device)
        loss_mask = batch["loss_mask"].to(self.ctx.device)
        captured = self.ctx.target_features(batch, with_final_hidden=True)
        labels = target_labels(self.drafter.draft_ids_in_target(), captured.final_hidden, self.ctx.target.lm_head)
        features = captured.features
        del captured  # the final hidden state is no longer needed
        ctx_valid = attention_mask.bool()
        backend = self.ctx.backend
        doc_start = batch.get("doc_start")  # packed documents (data.pack_documents): masks and labels stop at their starts
        if doc_start is not None:  # the window kernels refuse it (unroll; the config before that)
            doc_start = doc_start.to(self.ctx.device)
        # flex's block masks are built here, outside the compiled function (their tile structure has its own)
        masks = None if backend in WINDOW_BACKENDS else step_masks(ctx_valid, self.drafter.layer_types, self.drafter.sliding_window,
                                                                   self.steps, backend, doc_start, uniform_keys=self.uniform_keys)
        fn = self.unroll_and_loss if torch.is_grad_enabled() and not per_start else unroll_and_loss
        # byte-sized soft-CE chunks only where the step is compiled (each chunk a region it traces); eager steps and
        # evaluation keep 4,096-row chunks, whose unfused temporaries (~16 bytes a logit) stay a fraction of a 2 GiB chunk's
        chunks = {"chunk_rows": self.chunk_rows} if fn is not unroll_and_loss else {}
        with self.ctx.autocast():
            return fn(self.drafter, features, input_ids, ctx_valid, loss_mask, attention_mask, labels, self.steps, backend, masks,
                      self.cfg.trainer.activation_checkpointing, per_start, doc_start=doc_start, **chunks)


def unroll_and_loss(model: Eagle3DraftModel, features: torch.Tensor, input_ids: torch.Tensor, ctx_valid: torch.Tensor,
                    loss_mask: torch.Tensor, attention_mask: torch.Tensor, labels: tuple[torch.Tensor, torch.Tensor], steps: int,
                    backend: str, masks: list[dict] | None, checkpoint_steps: bool, per_start: bool = False, chunk_rows: int = 4096,
                    doc_start: torch.Tensor | None = None):
    """The TTT unroll and its loss (``unroll`` then ``ttt_loss``): ``trainer.compile_scope=step`` compiles it whole
    (the soft CE's checkpointed chunks included; not ``checkpoint_steps``, whose key lists grow inside the checkpoint)."""
    outputs = unroll(model, features, input_ids, ctx_valid, steps, backend, masks=masks, checkpoint_steps=checkpoint_steps, doc_start=doc_start)
    return ttt_loss(model, outputs, None, input_ids, loss_mask, attention_mask, chunk_rows, labels=labels, per_start=per_start,
                    doc_start=doc_start)


# ----------------------------------------------------------------------------- the training-time test

STEP_DECAY = 0.8


def shift_left(x: torch.Tensor, n: int, fill) -> torch.Tensor:
    """x[:, n:] padded on the right with ``fill`` back to x's length ([Bsz, T, ...])."""
    if n == 0:
        return x
    pad = torch.full_like(x[:, :n], fill)
    return torch.cat([x[:, n:], pad], dim=1)


def window_kernels(backend: str, on_gpu: bool = True):
    """The kernels of ``swa_kernels.window_attention`` for ``trainer.attention_backend`` fa4 or cudnn
    (off the GPU: its PyTorch pieces, which the CPU tests check against the dense masks)."""
    if not on_gpu:
        return default_ops(False)
    return band_ops("fa4-band") if backend == "fa4" else cudnn_ops()


WINDOW_BACKENDS = ("fa4", "cudnn")


def step_masks(ctx_valid: torch.Tensor, layer_types: list[str], sliding_window: int | None, steps: int, backend: str,
               doc_start: torch.Tensor | None = None, uniform_keys: bool = False) -> list[dict]:
    """Per step j, layer type -> mask over the keys of steps 0..j (the TTT masks below).

    ``uniform_keys``: every step's mask spans the last step's ``steps * T`` keys (the keys of later steps never visible),
    and ``unroll`` pads each step's keys with zeros to the mask's length. Same outputs; what it buys is one flex kernel
    pair for every step where the compiled step held one per step (flex's template bakes the key length, and each mask's
    step is then a tensor, not a constant): a cold compile's share, measured by benchmarks/eagle3_step_compile.py
    ``--uniform-keys``. Off by default; flex and sdpa only."""
    if doc_start is not None and backend not in ("flex", "sdpa"):
        raise ValueError(f"packed documents (data.pack_documents) train on the flex or sdpa attention backend, not {backend}")
    if uniform_keys and backend not in ("flex", "sdpa"):
        raise ValueError(f"uniform key lengths are for the flex and sdpa attention backends, not {backend}")
    kv_steps = steps if uniform_keys else None
    if backend == "flex":
        return [{t: ttt_flex_block_mask(ctx_valid, j, sliding_window if t == "sliding_attention" else None, doc_start=doc_start,
                                        kv_steps=kv_steps)
                 for t in set(layer_types)} for j in range(steps)]
    return [{t: ttt_dense_mask(ctx_valid, j, sliding_window if t == "sliding_attention" else None, doc_start, kv_steps)
             for t in set(layer_types)} for j in range(steps)]


def mask_key_length(mask) -> int | None:
    """The key length a TTT mask spans: a dense mask's last dimension, a flex ``BlockMask``'s ``seq_lengths[1]``."""
    if isinstance(mask, torch.Tensor):
        return mask.shape[-1]
    lengths = getattr(mask, "seq_lengths", None)
    return None if lengths is None else lengths[1]


def unroll(model: Eagle3DraftModel, features: torch.Tensor, input_ids: torch.Tensor, ctx_valid: torch.Tensor, steps: int,
           backend: str = "sdpa", masks: list[dict] | None = None, checkpoint_steps: bool = False,
           doc_start: torch.Tensor | None = None) -> list[torch.Tensor]:
    """The TTT forward: ``steps`` drafting steps over every index at once.

    With ``backend="fa4"`` or ``"cudnn"`` step j's attention is ``swa_kernels.window_attention``: a window of W - j
    over the step-0 keys plus the j diagonal keys, the rule of the TTT masks below for every
    real row (right padding: a padding row may also see padding keys, which no real row sees, so
    real outputs and all gradients are unchanged).

    Args:
        features: [Bsz, T, k*H] target features at ``model.target_layer_ids``.
        input_ids: [Bsz, T] the sequence's tokens x_0 .. x_{T-1}.
        ctx_valid: [Bsz, T] bool, True on real tokens.
        backend: ``sdpa`` (dense masks), ``flex`` (block masks, GPU), ``fa4`` or ``cudnn`` (see above).
        checkpoint_steps: keep no activations inside a step's layers; the backward recomputes them
            (each step's keys and values stay: later steps attend to them).
        doc_start: [Bsz, T] packed documents (``ttt_visible``): with ``masks`` None, the masks stop at their starts.

    Returns:
        per step j, [Bsz, T, H] the drafter's output before the final norm (``model.logits``).
    """
    bsz, seq_len = input_ids.shape
    kernels = window_kernels(backend, features.is_cuda) if backend in WINDOW_BACKENDS else None
    if kernels is not None and doc_start is not None:
        raise ValueError(f"attention backend {backend}: its window kernel has no document boundaries (data.pack_documents)")
    if masks is None and kernels is None:
        masks = step_masks(ctx_valid, model.layer_types, model.sliding_window, steps, backend, doc_start)
    layer_types = model.layer_types
    scale = model.layers[0].self_attn.scaling
    flex_options = triton_flex_options(model.config.head_dim) if backend == "flex" else None
    keys: list[list[torch.Tensor]] = [[] for _ in model.layers]
    values: list[list[torch.Tensor]] = [[] for _ in model.layers]
    hidden = model.project_features(features)
    outputs = []
    for j in range(steps):
        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, j: int = j) -> torch.Tensor:
            if len(keys[i]) > j:  # the backward recomputing step j (checkpoint_steps): same values
                keys[i][j], values[i][j] = k, v
            else:
                keys[i].append(k)
                values[i].append(v)
            step_keys, step_values = keys[i][: j + 1], values[i][: j + 1]
            if kernels is not None:
                window = model.sliding_window if layer_types[i] == "sliding_attention" else None
                diag_k, diag_v = (torch.stack(step_keys[1:]), torch.stack(step_values[1:])) if j else (None, None)
                return window_attention(q, step_keys[0], step_values[0], None if window is None else window - j, scale, diag_k, diag_v,
                                        ops=kernels)
            mask = masks[j][layer_types[i]]
            pad = (mask_key_length(mask) or 0) - (j + 1) * seq_len  # step_masks(uniform_keys=True): zero keys, never visible
            if pad > 0:
                step_keys = [*step_keys, k.new_zeros(*k.shape[:2], pad, k.shape[3])]
                step_values = [*step_values, v.new_zeros(*v.shape[:2], pad, v.shape[3])]
            return attention(q, torch.cat(step_keys, dim=2), torch.cat(step_values, dim=2), mask, scale=scale,
                             kernel_options=flex_options)

        ids = shift_left(input_ids, j + 1, 0)  # x_{t+j+1}
        positions = (torch.arange(seq_len, device=input_ids.device) + 1 + j).expand(bsz, -1)
        if checkpoint_steps and torch.is_grad_enabled():
            h = torch.utils.checkpoint.checkpoint(model, ids, hidden, positions, attend, use_reentrant=False)
        else:
            h = model(ids, hidden, positions, attend)
        outputs.append(h)
        hidden = model.next_hidden(h)
    return outputs


@dataclass
class TTTStats:
    """Sums over a batch; add them up over batches, then call ``summary``."""

    loss_sum: torch.Tensor  # step-weighted soft CE summed over labels
    num_labels: torch.Tensor  # labels of step 0 (the normaliser)
    step_loss: torch.Tensor  # [S] unweighted CE sums per step
    step_correct: torch.Tensor  # [S]
    step_count: torch.Tensor  # [S]
    accepted_sum: torch.Tensor  # leading correct steps, summed over start indices
    num_starts: torch.Tensor  # start indices with a step-0 label
    walk_tokens: torch.Tensor  # the loop replayed over whole assistant turns (evaluation only, else 0)
    walk_steps: torch.Tensor

    def __add__(self, other: "TTTStats") -> "TTTStats":
        return TTTStats(*(a + b for a, b in zip(vars(self).values(), vars(other).values())))

    def summary(self, prefix: str) -> dict[str, float]:
        count = self.step_count.clamp(min=1)
        acc = (self.step_correct / count).tolist()
        out = {
            f"{prefix}/loss": float(self.loss_sum / self.num_labels.clamp(min=1)),
            f"{prefix}/acc": acc[0],
            f"{prefix}/sim_tau": float(1 + self.accepted_sum / self.num_starts.clamp(min=1)),  # = anchor_tau
            **tau_summaries(prefix, self.accepted_sum, self.num_starts, self.walk_tokens, self.walk_steps),
        }
        out.update({f"{prefix}/acc_step_{j}": a for j, a in enumerate(acc)})
        out.update({f"{prefix}/loss_step_{j}": float(x) for j, x in enumerate(self.step_loss / count)})
        return out


def label_mask(input_ids: torch.Tensor, loss_mask: torch.Tensor, attention_mask: torch.Tensor, step: int,
               doc_start: torch.Tensor | None = None) -> torch.Tensor:
    """[Bsz, T] bool: step ``step`` at index t has a label (x_{t+step+2} real and in the loss mask, and with
    ``doc_start``, packed documents, in t's document)."""
    labelled = shift_left(loss_mask.bool() & attention_mask.bool(), step + 2, False)
    if doc_start is not None:
        labelled = labelled & (shift_left(doc_start, step + 2, -1) == doc_start)
    return labelled


def _soft_ce_rows(model: Eagle3DraftModel, h: torch.Tensor, target_draft: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits = model.logits(h).float()
    soft = F.softmax(target_draft.float(), dim=-1)
    return -(soft * F.log_softmax(logits, dim=-1)).sum(-1), logits.argmax(-1)


# The compiled step's soft-CE row chunks hold about this many bytes of fp32 logits each (Eagle3Step.forward; eager
# steps keep 4,096-row chunks). Sized by bytes, not rows: a compiled step traces every chunk as its own checkpointed
# region, and the regions made most of the cold compile (a CPU proxy of SmolLM2's step, TTT 10, 6,144 rows: the first
# step 264 s with 8 chunks a TTT step, 102 s with 1; benchmarks/eagle3_step_compile.py, BENCHMARKS.md, "The soft CE's
# chunks and the cold compile"). 16 x 2,048 rows at a 16K draft vocabulary are one chunk; a 32K vocabulary at 32K tokens
# two. The cost: each chunk's logits exist while it is computed and recomputed, 2 GiB instead of 0.5 at a 32K vocabulary.
SOFT_CE_CHUNK_BYTES = 2 << 30


def soft_ce_chunk_rows(draft_vocab_size: int) -> int:
    """The rows of one soft-CE chunk (``soft_cross_entropy``) at this draft vocabulary: SOFT_CE_CHUNK_BYTES of fp32 logits."""
    return max(1, SOFT_CE_CHUNK_BYTES // (4 * draft_vocab_size))


# Up to this many rows keep their logits for the backward (no recompute); more are checkpointed chunk by chunk
SOFT_CE_KEPT_ROWS = 4096


def soft_cross_entropy(model: Eagle3DraftModel, h: torch.Tensor, target_draft: torch.Tensor, chunk_rows: int = 4096):
    """Per-row soft CE of the draft head on ``h`` [Bsz, T, H] against softmax(``target_draft``)
    [Bsz, T, Vd], and the draft argmax; ``chunk_rows`` rows at a time. With gradients on, past
    SOFT_CE_KEPT_ROWS rows (or in more than one chunk) each chunk is recomputed in the backward
    (activation checkpointing), so no full [Bsz, T, Vd] logits are ever kept: at 32K tokens and a 32K
    draft vocabulary those are 4 GiB per tensor and per TTT step."""
    rows = h.shape[0] * h.shape[1]
    checkpointed = torch.is_grad_enabled() and rows > min(chunk_rows, SOFT_CE_KEPT_ROWS)
    if rows <= chunk_rows and not checkpointed:
        return _soft_ce_rows(model, h, target_draft)
    flat_h, flat_t = h.flatten(0, 1), target_draft.flatten(0, 1)
    ces, argmaxes = [], []
    for start in range(0, rows, chunk_rows):
        piece = (flat_h[start:start + chunk_rows], flat_t[start:start + chunk_rows])
        if checkpointed:
            ce, top = torch.utils.checkpoint.checkpoint(_soft_ce_rows, model, *piece, use_reentrant=False)
        else:
            ce, top = _soft_ce_rows(model, *piece)
        ces.append(ce)
        argmaxes.append(top)
    return torch.cat(ces).view(h.shape[:2]), torch.cat(argmaxes).view(h.shape[:2])


@torch.no_grad()
def target_labels(draft_ids: torch.Tensor, final_hidden: torch.Tensor, lm_head: torch.nn.Module, chunk_rows: int = 4096):
    """The target's greedy ids over its whole vocabulary [Bsz, T] and its logits restricted to the
    draft vocabulary [Bsz, T, Vd], from its normed last hidden state, ``chunk_rows`` rows at a time:
    the full-vocabulary logits never exist at once."""
    flat = final_hidden.flatten(0, 1)
    greedy, draft = [], []
    for start in range(0, flat.shape[0], chunk_rows):
        logits = lm_head(flat[start:start + chunk_rows])
        greedy.append(logits.argmax(-1))
        draft.append(logits.index_select(-1, draft_ids))
    shape = final_hidden.shape[:2]
    return torch.cat(greedy).view(shape), torch.cat(draft).view(*shape, -1)


def ttt_loss(model: Eagle3DraftModel, outputs: list[torch.Tensor], target_logits: torch.Tensor | None, input_ids: torch.Tensor,
             loss_mask: torch.Tensor, attention_mask: torch.Tensor, chunk_rows: int = 4096, labels=None,
             per_start: bool = False, doc_start: torch.Tensor | None = None) -> TTTStats | tuple[TTTStats, torch.Tensor]:
    """Soft CE against the target restricted to the draft vocabulary, and acceptance stats.

    target_logits: [Bsz, T, V] the target's logits over its whole vocabulary, or None with
    ``labels`` = (greedy ids [Bsz, T], draft-vocabulary logits [Bsz, T, Vd]) from ``target_labels``.
    The target logits stay in their dtype (bf16 on the GPU); each chunk is upcast for its softmax.
    ``per_start``: also return [Bsz, T] the leading correct steps at each index (-1 where no start).
    ``doc_start``: packed documents; a label past the index's document is none (``label_mask``).
    """
    steps = len(outputs)
    if labels is None:
        labels = target_logits.argmax(-1), target_logits.index_select(-1, model.draft_ids_in_target())
    target_greedy, target_draft = labels  # [Bsz, T], [Bsz, T, Vd]
    seq_len = target_draft.shape[1]
    device = target_draft.device
    loss_sum = torch.zeros((), device=device)
    step_loss, step_correct, step_count = (torch.zeros(steps, device=device) for _ in range(3))
    leading = None
    for j, h in enumerate(outputs):
        labelled = label_mask(input_ids, loss_mask, attention_mask, j, doc_start)
        # index t at step j learns the target's distribution at t + j + 1; the last j + 1 indices have
        # none (never labelled): views, not shifted copies, so no per-step copy of the soft labels
        # none at all on a row no longer than j + 1 (a slice to a negative length would count from the end)
        kept = max(seq_len - (j + 1), 0)
        ce, draft_top = soft_cross_entropy(model, h[:, :kept], target_draft[:, j + 1:], chunk_rows)
        ce, draft_top = F.pad(ce, (0, seq_len - kept)), F.pad(draft_top, (0, seq_len - kept))  # [Bsz, T]
        ce = torch.where(labelled, ce, torch.zeros_like(ce))
        loss_sum = loss_sum + STEP_DECAY**j * ce.sum()
        correct = (model.draft_to_target(draft_top) == shift_left(target_greedy, j + 1, -1)) & labelled
        step_loss[j] = ce.sum().detach()
        step_correct[j] = correct.sum()
        step_count[j] = labelled.sum()
        leading = correct if leading is None else leading & correct
        if j == 0:
            starts = labelled
            accepted = correct.long()
        else:
            accepted = accepted + leading.long()
    stats = TTTStats(loss_sum=loss_sum, num_labels=starts.sum().float(), step_loss=step_loss, step_correct=step_correct,
                     step_count=step_count, accepted_sum=(accepted * starts).sum().float(), num_starts=starts.sum().float(),
                     walk_tokens=torch.zeros((), device=device), walk_steps=torch.zeros((), device=device))
    return (stats, torch.where(starts, accepted, -1)) if per_start else stats


# ----------------------------------------------------------------------------- TTT masks

def ttt_visible(b: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor, step: int | torch.Tensor, ctx_valid: torch.Tensor,
                window: int | None, doc_start: torch.Tensor | None = None) -> torch.Tensor:
    """True where query ``q_idx`` of step ``step`` may attend to key ``kv_idx`` (broadcasting).

    Args:
        b, q_idx, kv_idx: integer tensors, broadcastable to each other.
        step: j, the drafting step the queries belong to (a 0-dim tensor in a uniform-length flex mask's ``mask_mod``).
        ctx_valid: [Bsz, T] bool, True on real tokens.
        window: W keys visible counting the query itself, or None (full attention).
        doc_start: [Bsz, T] packed documents (``data.pack_documents``): the index each index's document starts at; a
            context key must be in the query's document (its diagonal keys, at its own index, always are). None: one.
    """
    seq_len = ctx_valid.shape[1]
    key_step = kv_idx // seq_len
    u = kv_idx % seq_len
    context = (key_step == 0) & (u <= q_idx) & (ctx_valid[b, u] | (u == q_idx))
    if doc_start is not None:
        context = context & (u >= doc_start[b, q_idx])
    diagonal = (key_step >= 1) & (key_step <= step) & (u == q_idx)
    visible = context | diagonal
    if window is not None:
        query_pos = q_idx + step
        key_pos = u + key_step
        visible = visible & (key_pos > query_pos - window)
    return visible


def ttt_dense_mask(ctx_valid: torch.Tensor, step: int, window: int | None, doc_start: torch.Tensor | None = None,
                   kv_steps: int | None = None) -> torch.Tensor:
    """Boolean SDPA mask [Bsz, 1, T, (step + 1) * T] (True = attend) from ``ttt_visible``; with ``kv_steps`` over
    ``kv_steps * T`` keys (``step_masks(uniform_keys=True)``: the later steps' keys never visible)."""
    bsz, seq_len = ctx_valid.shape
    device = ctx_valid.device
    b = torch.arange(bsz, device=device)[:, None, None]
    q = torch.arange(seq_len, device=device)[None, :, None]
    kv = torch.arange((kv_steps or step + 1) * seq_len, device=device)[None, None, :]
    return ttt_visible(b, q, kv, step, ctx_valid, window, doc_start)[:, None]


def ttt_tile_structure(ctx_valid: torch.Tensor, step: int, window: int | None, tile: int,
                       doc_start: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Which (query tile, key tile) pairs of ``ttt_visible`` at ``step`` hold a visible pair (kept) and which hold only
    visible pairs (full), [Bsz, T / tile, (step + 1) T / tile] bool each, from the rule's shape alone: step 0's keys are
    a causal band [q + step - W + 1, q] over real keys (and the query's own, real or not), each later step's keys the
    diagonal u = q (when step - s < W). Exact for right-padded rows (``ctx_valid`` a prefix); with gaps, kept tiles are a
    superset (flex still applies the rule inside them). No [T, (step + 1) T] mask is evaluated, and nothing is compiled:
    compiling flex's ``create_block_mask`` took ~50 s per key length at 16 x 2048 tokens on the H100.
    With ``doc_start`` (packed documents, non-decreasing along a row) step 0's tiles are read query by query: a query q
    sees u in [max(doc_start[q], q + band, 0), min(q, last real key)] and its own key, and a tile is kept where one of its
    queries' ranges meets the tile's keys; full tiles also need every key at or after the tile's last query's start."""
    bsz, seq_len = ctx_valid.shape
    device = ctx_valid.device
    kv_len = (step + 1) * seq_len
    q0 = torch.arange(0, seq_len, tile, device=device)[:, None]  # [Qt, 1]
    q1 = (q0 + tile).clamp(max=seq_len)
    k0 = torch.arange(0, kv_len, tile, device=device)  # [Kt]
    k1 = (k0 + tile).clamp(max=kv_len)
    last = (ctx_valid * torch.arange(1, seq_len + 1, device=device)).amax(1)[:, None, None]  # one past the last real key
    invalid_before = F.pad(torch.cumsum(~ctx_valid, 1), (1, 0))  # [Bsz, T + 1]: padding keys before each index
    band = None if window is None else step - window + 1  # step 0: u >= q + band (band <= 0 unless W <= step)
    kept = torch.zeros(bsz, len(q0), len(k0), dtype=torch.bool, device=device)
    full = torch.ones_like(kept)
    for s in range(step + 1):
        ua, ub = (k0 - s * seq_len).clamp(0, seq_len), (k1 - s * seq_len).clamp(0, seq_len)  # this step's keys u in the tile
        present = ua < ub  # [Kt]
        diagonal = present & (torch.maximum(ua, q0) < torch.minimum(ub, q1))  # [Qt, Kt]: some u == q
        if s == 0:
            if band is not None and band > 0:  # the window ends before the query: no context key at all
                seg_kept = seg_full = torch.zeros_like(kept)
            else:
                if doc_start is None:
                    low = torch.zeros_like(q0) if band is None else q0 + band  # the u some q of the tile sees: [low, q1 - 1]
                    u_high = torch.minimum(ub - 1, last - 1)  # real keys only
                    meets = torch.maximum(ua, low) <= torch.minimum(u_high, q1 - 1)
                else:  # query by query: q sees [max(doc_start[q], q + band), min(q, last real key)]
                    q = torch.arange(seq_len, device=device)
                    lo = doc_start if band is None else torch.maximum(doc_start, q + band)  # [Bsz, T]
                    hi = torch.minimum(q, last[:, :, 0] - 1)
                    ctx_tiles = -(-seq_len // tile)  # only key tiles that start among step 0's keys hold any
                    meets = torch.maximum(lo[:, :, None], ua[:ctx_tiles]) <= torch.minimum(hi[:, :, None], ub[:ctx_tiles] - 1)  # [Bsz, T, Kc]
                    meets = F.pad(meets, (0, len(k0) - ctx_tiles, 0, len(q0) * tile - seq_len)).view(bsz, len(q0), tile, len(k0)).any(2)
                seg_kept = diagonal | meets
                padding = (invalid_before[:, ub] - invalid_before[:, ua])[:, None, :]  # [Bsz, 1, Kt]
                # a one-query tile also sees its own key when that is padding
                own = ((q1 - q0 == 1) & (ua <= q0) & (q0 < ub)) & ~ctx_valid[:, q0[:, 0]][:, :, None]  # [Bsz, Qt, Kt]
                all_real = padding - own.long() == 0
                above = True if band is None else ua >= q1 - 1 + band
                seg_full = present & (ub - 1 <= q0) & above & all_real
                if doc_start is not None:  # every key at or after the tile's latest document start
                    seg_full = seg_full & (ua >= doc_start[:, (q1 - 1)[:, 0]][:, :, None])
        else:
            seen = window is None or s >= step - window + 1
            seg_kept = (diagonal & seen).expand_as(kept)
            seg_full = (diagonal & seen & (q1 - q0 == 1) & (ub - ua == 1)).expand_as(kept)
        kept = kept | (present & seg_kept)
        full = full & (~present | seg_full)
    return kept, full & kept


def ttt_flex_block_mask(ctx_valid: torch.Tensor, step: int, window: int | None, tile: int = 128, doc_start: torch.Tensor | None = None,
                        kv_steps: int | None = None):
    """flex_attention ``BlockMask`` for the same rule (GPU); tiles with no visible pair are skipped
    (``ttt_tile_structure``: never the dense [T, (j+1)T] mask, 7.5 GB at 32K, step 6). With ``kv_steps``
    (``step_masks(uniform_keys=True)``) the mask spans ``kv_steps * T`` keys, the later steps' tiles empty, and its
    ``mask_mod`` reads the step from a tensor: every step's mask then has the same shapes and code."""
    seq_len = ctx_valid.shape[1]
    rule_step = step if kv_steps is None else torch.tensor(step, device=ctx_valid.device)

    def mask_mod(b, h, q_idx, kv_idx):
        return ttt_visible(b, q_idx, kv_idx, rule_step, ctx_valid, window, doc_start)

    kept, full = tile_structure_fn(ctx_valid.device.type)(ctx_valid, step, window, tile, doc_start)
    kv_len = (step + 1) * seq_len
    if kv_steps is not None and kv_steps * seq_len > kv_len:
        if kv_len % tile:  # the last tile now also holds later keys (never visible): partial, not full
            full = full.clone()
            full[..., -1] = False
        extra = -(-kv_steps * seq_len // tile) - kept.shape[-1]
        kept, full = F.pad(kept, (0, extra)), F.pad(full, (0, extra))
        kv_len = kv_steps * seq_len
    return block_mask_from_tiles(kept, full, mask_mod, seq_len, kv_len, tile, tile)


@functools.cache
def tile_structure_fn(device_type: str):
    """``ttt_tile_structure`` compiled on a GPU: eager it launches ~25 + 12 j small kernels for step j (~430 for a 7-step
    unroll, ~5 ms of host launches per training step, a 2-3.6% MFU drop at the 8B shape), compiled a handful; shapes
    dynamic, so one graph per (step, window, tile) whatever the batch's length. Eager elsewhere (CPU tests)."""
    if device_type != "cuda":  # one compiled function for every GPU index (cuda, cuda:0 ...)
        return ttt_tile_structure
    from swa_kernels.attention import raise_recompile_limit

    raise_recompile_limit()
    return torch.compile(ttt_tile_structure, dynamic=True)
