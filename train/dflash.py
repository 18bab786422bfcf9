"""DFlash training (``drafter.kind=dflash``): the drafter it builds and its step (its config schema,
``DFlashConfig``, is in ``train/config.py``).

For every sequence, anchors are drawn at random (``num_anchors``, capped by what the sequence holds)
among positions a whose token and next token are both in the loss mask. Block n is
[token(a_n), mask x (B-1)]; slot k (1..B-1) is trained on the ground-truth token at a_n + k (when
that position exists and is in the loss mask) with weight exp(-(k-1)/gamma): early slots decide
acceptance, so they weigh most (the DFlash paper uses gamma 7 for B=16, 5 for B=10, 4 for B=8).

    DFlashStep.plan       anchors and blocks (random, from the step's generator)
    DFlashStep.forward    target features -> ``models/dflash.py`` (masks per layer type) -> target LM head
                          (or its rows of a draft vocabulary, ``drafter.draft_vocab_size``)
                          -> ``block_loss``: decayed CE, per-slot accuracy, accepted drafts per block
    evaluate_batch        a block at every position and the greedy loop replayed over each reply
                          (``eval/block_tau``, ``train/loop_eval.py``)
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from common.transfer import to_device_async
from swa_kernels import fa4_adapter
from swa_kernels.attention import FLASH_KERNELS, triton_flex_options
from swa_kernels.window_attention import fa4_available
from models.dflash import (DFlashDraftModel, LayerMaskSpec, dense_mask, flex_block_mask, flex_packed_block_mask, key_interval_mask,
                           make_dflash_config)
from models.target import TargetModel, default_layer_ids

from .config import DFlashConfig, TrainConfig  # noqa: F401  (DFlashConfig: the schema, in the light config module)
from .cross_entropy import logits_cross_entropy
from .loop_eval import leading_correct, tau_summaries, walk_segments

log = logging.getLogger(__name__)

NAME = "DFlash"


def feature_layer_ids(d: DFlashConfig, num_layers: int) -> list[int]:
    """The target layers read when ``drafter.target_layer_ids`` is null: z-lab's even spacing."""
    return default_layer_ids("dflash", num_layers, d.num_hidden_layers if d.num_target_features is None else d.num_target_features)


def fastest_gpu_backend(cfg: TrainConfig, drafter: DFlashDraftModel) -> str:
    """What ``trainer.attention_backend=auto`` runs on the GPU.

    At 32K, W=2048 (BENCHMARKS.md, issue 8): FA4 with key intervals 1.3-1.4x flex's block masks on FA4's
    kernels, which are 1.3-1.5x Triton flex. The key-interval kernels are FA4's SM90 ones with 128-key
    tiles: Hopper, head_dim <= 128. The whole step on the reference target on an H200 (16 x 2048 tokens, FA4's
    calls as custom ops): FA4 35.1 ms, flex 41.9 ms."""
    if fa4_available():
        hopper = torch.cuda.get_device_capability()[0] == 9
        if hopper and drafter.config.head_dim <= 128:
            if not fa4_adapter.persistent_cache_enabled():
                return "fa4"
            log.warning("trainer.attention_backend=auto: not fa4 (key intervals) while %s=1 (FA4's persistent kernel cache "
                        "does not see this project's patch to its kernels); flex-flash runs instead", fa4_adapter.PERSISTENT_CACHE_ENV)
        return "flex-flash"
    return "flex"


def resolve_mask_token_id(configured: int | None, target: TargetModel) -> int:
    """The DFlash mask token: the configured id, else an embedding row no text ever produces."""
    vocab = target.vocab_size
    if configured is not None:
        if not 0 <= configured < vocab:
            raise ValueError(f"drafter.mask_token_id={configured} is outside the target's vocabulary (0..{vocab - 1})")
        return configured
    tokenizer = target.tokenizer
    if vocab > len(tokenizer):
        return len(tokenizer)  # first embedding row with no token (z-lab's choice: 151669 for Qwen3)
    used = {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id}
    template = tokenizer.chat_template or ""
    for token_id, token in sorted(tokenizer.added_tokens_decoder.items()):
        if token.special and token_id not in used and token.content not in template:
            return token_id
    raise ValueError("drafter.mask_token_id is null and the target has no unused special token; set drafter.mask_token_id")


def build_drafter(cfg: TrainConfig, target: TargetModel, layer_ids: list[int], train_ds=None) -> DFlashDraftModel:
    """A fresh DFlash drafter with the target's attention/MLP shape, seeded by ``trainer.seed``; with
    ``drafter.draft_vocab_size``, its draft vocabulary from the training data's loss-masked token counts (as EAGLE-3's)."""
    d = cfg.drafter
    mask_token_id = resolve_mask_token_id(d.mask_token_id, target)
    config = make_dflash_config(
        target.config, num_hidden_layers=d.num_hidden_layers, block_size=d.block_size, mask_token_id=mask_token_id,
        target_layer_ids=layer_ids, layer_types=d.resolved_layer_types(), sliding_window=d.sliding_window,
        sliding_block_causal=d.sliding_block_causal, draft_vocab_size=d.draft_vocab_size,
    )
    torch.manual_seed(cfg.trainer.seed)
    drafter = DFlashDraftModel(config)
    if drafter.has_draft_vocab:
        from models.eagle3 import build_draft_vocab

        from .eagle3 import loss_token_counts

        if train_ds is None:
            raise ValueError("drafter.draft_vocab_size: the draft vocabulary is counted from the training data, and none was given")
        counts = loss_token_counts(train_ds, target.vocab_size)
        d2t, t2d = build_draft_vocab({i: int(c) for i, c in enumerate(counts.tolist()) if c}, target.vocab_size, config.draft_vocab_size)
        drafter.set_draft_vocab(d2t, t2d, target.lm_head.weight.float().cpu())
        log.info("DFlash draft vocabulary: %d of %d target tokens, covering %.1f%% of loss-masked training tokens",
                 config.draft_vocab_size, target.vocab_size, 100 * float(counts[t2d].sum() / counts.sum().clamp(min=1)))
    return drafter


# ----------------------------------------------------------------------------- the step

class DFlashStep:
    """One DFlash training step's pieces, fixed at start-up: ``plan`` (anchors, blocks), ``num_labels``,
    ``forward`` (target features -> drafter -> loss and stats) and ``evaluate_batch``. ``ctx`` is the
    trainer's ``StepContext`` (device, attention backend, precision, target features)."""

    def __init__(self, ctx, drafter: DFlashDraftModel):
        self.ctx, self.cfg, self.drafter = ctx, ctx.cfg, drafter
        if ctx.backend == "fa4" and torch.cuda.get_device_capability(ctx.device)[0] != 9:
            raise ValueError("trainer.attention_backend=fa4 trains DFlash with FlashAttention-4's SM90 kernels (key intervals): "
                             "it needs a Hopper GPU; use flex-flash or flex")
        if ctx.backend == "fa4":  # at start-up, not at the first attention call
            fa4_adapter.refuse_persistent_cache("trainer.attention_backend=fa4 (DFlash's key intervals)")
        self.block_size = self.cfg.drafter.block_size
        self.gamma = self.cfg.drafter.loss_gamma or default_gamma(self.block_size)
        self.dpace_alpha = self.cfg.drafter.dpace_alpha if self.cfg.drafter.loss_weighting == "dpace" else None
        # trainer.pad_multiple: anchors padded to a multiple of half of num_anchors (two shapes), not always to
        # num_anchors; not on the GPU, where counting them would sync the host every micro-batch (and a batch's
        # longest row nearly always holds num_anchors anchors)
        self.anchor_multiple = max(1, self.cfg.drafter.num_anchors // 2) if ctx.pad_multiple and ctx.device.type != "cuda" else 0
        self.head_and_loss = head_and_loss
        # the head the loop decodes with, and each target id's row in it (-1: outside a draft vocabulary)
        self.head = drafter.head(ctx.target.lm_head)
        if drafter.has_draft_vocab:
            drafter.lm_head.weight.requires_grad_(False)  # the target's rows: frozen however the drafter was loaded
        self.head_index = drafter.target_to_draft(torch.arange(drafter.config.vocab_size)).to(ctx.device) if drafter.has_draft_vocab else None
        self.drafter_and_loss = None  # trainer.compile_scope=step: the whole training forward compiled as one function
        trainer_cfg = self.cfg.trainer
        if trainer_cfg.compile_drafter and ctx.device.type == "cuda":
            drafter.compile_regions()  # evaluation's forward, and training's with compile_scope=regions
            self.head_and_loss = torch.compile(head_and_loss, dynamic=False)  # logits, fp32 CE and stats fused around the product
            if trainer_cfg.compile_scope == "step":
                # mode="reduce-overhead" (CUDA graphs) is not offered: as is, CUDA Graph Trees re-record the backward at
                # every step (FA4's key-interval tables, new addresses each step, enter it as static inputs): 95-134 ms
                # against 38.5 on an H200; with every input copied to stable buffers it replays, but 34.7 against 34.9 ms
                # (the step's 32.9 ms of kernels bound it; BENCHMARKS.md, "CUDA graphs for the training step")
                self.drafter_and_loss = torch.compile(drafter_and_loss, dynamic=False)

    @contextlib.contextmanager
    def eager(self):
        """The step with ``trainer.compile_drafter``'s compiled pieces off (module hooks fire: FLOP counting)."""
        compiled = self.head_and_loss, getattr(self.drafter, "_regions", None), self.drafter_and_loss
        self.head_and_loss, self.drafter._regions, self.drafter_and_loss = head_and_loss, None, None
        try:
            yield self
        finally:
            self.head_and_loss, self.drafter._regions, self.drafter_and_loss = compiled

    def plan(self, batch: dict[str, torch.Tensor], generator: torch.Generator):
        """The step's random choices for one micro-batch: anchors and their blocks."""
        drafter_cfg = self.cfg.drafter
        doc_start = batch.get("doc_start")  # packed documents: anchors, labels and reveals stay in the anchor's document
        anchors, valid, reveal = sample_anchors_and_reveals(
            batch["loss_mask"], drafter_cfg.num_anchors, generator, drafter_cfg.reveal_prob, drafter_cfg.reveal_max,
            pad_to_max=self.ctx.static_shapes, pad_multiple=self.anchor_multiple, key_width=self.cfg.data.longest_row, doc_start=doc_start)
        return build_blocks(batch["input_ids"], batch["loss_mask"], anchors, valid, self.block_size, self.drafter.mask_token_id, reveal,
                            doc_start)

    def num_labels(self, batch: dict[str, torch.Tensor], blocks) -> torch.Tensor:
        return (blocks.labels != IGNORE).sum()  # a tensor: no host sync on the GPU

    def forward(self, batch: dict[str, torch.Tensor], blocks) -> BlockStats:
        """Target features -> drafter -> stats (loss_sum is differentiable)."""
        blocks = type(blocks)(*(t.to(self.ctx.device) for t in vars(blocks).values()))
        labels = self.head_labels(blocks.labels)
        with self.ctx.autocast():
            if self.drafter_and_loss is None:
                hidden = self.block_hidden(batch, blocks, self.ctx.backend)
                return self.head_and_loss(hidden, self.head, labels, blocks.anchor_valid, self.block_size, self.gamma, self.dpace_alpha)
            block_embeds, features, masks = self.drafter_inputs(batch, blocks, self.ctx.backend)
            return self.drafter_and_loss(self.drafter, block_embeds, features, blocks.positions, masks, self.head, labels, blocks.anchor_valid,
                                         self.block_size, self.gamma, self.dpace_alpha)

    def head_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """Labels as rows of the head: target ids, or a draft vocabulary's ids with ``OUTSIDE`` where it lacks the
        label (still a labelled slot: a draft there is wrong)."""
        if self.head_index is None:
            return labels
        return torch.where(labels == IGNORE, IGNORE, self.head_index[labels.clamp(min=0)])

    def evaluate_batch(self, batch: dict[str, torch.Tensor]) -> BlockStats:
        """Held-out stats with a block at every eligible position, and the loop replayed over each assistant
        turn: ``block_tau``."""
        total, accepted = self.dense_acceptance(batch)
        tokens, steps = walk_segments(accepted, batch["loss_mask"])
        total.walk_tokens += tokens
        total.walk_steps += steps
        return total

    @torch.no_grad()
    def dense_acceptance(self, batch: dict[str, torch.Tensor]) -> tuple[BlockStats, torch.Tensor]:
        """Stats of blocks at every eligible position (the target runs once, the drafter once per chunk of
        ``num_anchors``) and [Bsz, T] each position's leading correct drafts (-1: no block there)."""
        if "doc_start" in batch:  # its anchors and blocks are drawn one conversation per row
            raise ValueError("DFlash's evaluation reads one conversation per row; this batch holds packed documents")
        loss_mask = batch["loss_mask"]
        features = self.ctx.target_features(batch).features
        accepted = torch.full(loss_mask.shape, -1, dtype=torch.long)  # [Bsz, T] by anchor position
        total = None
        for anchors, valid in dense_anchor_chunks(loss_mask, self.cfg.drafter.num_anchors, self.ctx.static_shapes):
            blocks = build_blocks(batch["input_ids"], loss_mask, anchors, valid, self.block_size, self.drafter.mask_token_id)
            blocks = type(blocks)(*(t.to(self.ctx.device) for t in vars(blocks).values()))
            with self.ctx.autocast():
                hidden = self.block_hidden(batch, blocks, self.ctx.backend, features)
            # the logits a few rows at a time: [Bsz, N*B, V] at once is 13 GB in fp32 for 16 rows of 4,096 slots over
            # SmolLM2's 49K vocabulary (34 GB over Llama-3's 128K), before cross-entropy's copies
            rows_at_once = max(1, EVAL_LOGITS_BYTES // (hidden.shape[1] * self.head.weight.shape[0] * 4))
            labels = self.head_labels(blocks.labels)
            per_block, stats = [], None
            for r in range(0, hidden.shape[0], rows_at_once):
                with self.ctx.autocast():
                    logits = self.head(hidden[r:r + rows_at_once])
                part, part_blocks = block_loss(logits, labels[r:r + rows_at_once], blocks.anchor_valid[r:r + rows_at_once],
                                               self.block_size, self.gamma, self.dpace_alpha, per_block=True)
                stats = part if stats is None else stats + part
                per_block.append(part_blocks)
            per_block = torch.cat(per_block)
            rows = torch.arange(anchors.shape[0])[:, None].expand_as(anchors)
            accepted[rows[valid.cpu()], anchors.cpu()[valid.cpu()]] = per_block.cpu()[valid.cpu()]
            total = stats if total is None else total + stats
        return total, accepted

    def block_logits(self, batch: dict[str, torch.Tensor], blocks, backend: str, features: torch.Tensor | None = None) -> torch.Tensor:
        """[Bsz, N*B, V] the drafter's logits for every block slot (blocks already on the device; -inf outside a draft
        vocabulary)."""
        return self.drafter.to_target_logits(self.head(self.block_hidden(batch, blocks, backend, features)))

    def block_hidden(self, batch: dict[str, torch.Tensor], blocks, backend: str, features: torch.Tensor | None = None) -> torch.Tensor:
        """[Bsz, N*B, H] the drafter's final hidden states for every block slot (blocks already on the device)."""
        block_embeds, features, masks = self.drafter_inputs(batch, blocks, backend, features)
        return self.drafter(block_embeds, features, blocks.positions, masks)  # [Bsz, Q, H]

    def drafter_inputs(self, batch: dict[str, torch.Tensor], blocks, backend: str, features: torch.Tensor | None = None):
        """What the drafter's training forward reads besides the positions: block embeddings [Bsz, N*B, H], the target's
        features [Bsz, T, k*H] (run here unless given) and each layer type's mask."""
        attention_mask = batch["attention_mask"].to(self.ctx.device)  # [Bsz, T]
        if features is None:
            features = self.ctx.target_features(batch).features  # [Bsz, T, k*H]
        if not self.ctx.bf16:  # fp32 training of a drafter on a bf16 target's features
            features = features.to(self.drafter.fc.weight.dtype)
        d = self.cfg.drafter
        heads = self.drafter.config
        doc_start = batch.get("doc_start")  # packed documents: each block's context starts at its anchor's document
        ctx_lo = None if doc_start is None else doc_start.to(self.ctx.device).gather(1, blocks.anchors)
        masks = layer_masks(blocks, attention_mask.bool(), self.block_size, self.drafter.layer_types, d.sliding_window, d.sliding_block_causal,
                            backend, query_groups=heads.num_attention_heads // heads.num_key_value_heads, head_dim=heads.head_dim,
                            flex_options=self.cfg.trainer.flex_kernel_options, ctx_lo=ctx_lo)
        block_embeds = self.ctx.target.embed_tokens(blocks.block_ids).to(features.dtype)  # [Bsz, Q, H]
        return block_embeds, features, masks


# ----------------------------------------------------------------------------- the objective

IGNORE = -100
OUTSIDE = -1  # a labelled slot whose label the head cannot produce (outside a draft vocabulary): no CE term, never correct
PAPER_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}


def default_gamma(block_size: int) -> float:
    return PAPER_GAMMA.get(block_size, block_size / 2.0)


@dataclass
class Blocks:
    anchors: torch.Tensor  # [Bsz, N] long (padded slots: 0)
    anchor_valid: torch.Tensor  # [Bsz, N] bool
    block_ids: torch.Tensor  # [Bsz, N*B] tokens fed to the drafter
    positions: torch.Tensor  # [Bsz, N*B] absolute positions
    labels: torch.Tensor  # [Bsz, N*B] target token or IGNORE (slot 0 always IGNORE)


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator, pad_to_max: bool = False,
                   pad_multiple: int = 0, key_width: int = 0, keys: torch.Tensor | None = None,
                   doc_start: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Random sorted anchors per row among positions whose token and next token carry loss: a uniform
    random subset of min(num_anchors, eligible) positions, vectorised on ``loss_mask``'s device (one random
    key per position from ``generator``, drawn on the CPU so a run's anchors do not depend on the device).
    Each row draws ``max(key_width, T - 1)`` keys: with ``key_width`` = the longest a row can be padded to,
    a row's anchors depend neither on how far its micro-batch is padded nor on how the step's rows are split
    into micro-batches.

    Args:
        loss_mask: [Bsz, T] bool.
        pad_to_max: return N = num_anchors columns always (static shapes for compiled kernels; no host sync
            on the GPU); with ``pad_multiple``, N = the most anchors a row got rounded up to a multiple of it
            (capped at num_anchors). The anchors drawn are the same either way: only the padding columns differ.
        keys: [Bsz, >= T - 1] the rows' keys drawn by the caller instead (``sample_anchors_and_reveals`` draws them
            with each row's reveal draws, in one draw per row).
        doc_start: [Bsz, T] packed documents (``data.pack_documents``): an anchor's next token must be in its document.
    Returns:
        anchors [Bsz, N] long and valid [Bsz, N] bool (padding columns: anchor 0, not valid), N = max anchors
        any row got (>= 1) unless padded.
    """
    eligible = loss_mask[:, :-1] & loss_mask[:, 1:]  # [Bsz, T-1]
    if doc_start is not None:
        eligible = eligible & (doc_start[:, :-1] == doc_start[:, 1:]).to(eligible.device)
    width = eligible.shape[1]
    if keys is None:
        keys = torch.rand(eligible.shape[0], max(key_width, width), generator=generator)
    keys = keys[:, :width]
    keys = to_device_async(keys, eligible.device)  # pinned on a GPU: the host does not wait for queued kernels
    keys = torch.where(eligible, keys, -1.0)
    top = keys.topk(min(num_anchors, keys.shape[1]), dim=1)
    chosen = torch.where(top.values >= 0, top.indices, keys.shape[1])  # not eligible: sorts last
    chosen = chosen.sort(dim=1).values
    valid = chosen < keys.shape[1]
    anchors = torch.where(valid, chosen, 0)
    if pad_to_max and not pad_multiple:
        n = num_anchors
    else:
        n = max(1, int(valid.sum(1).max()))  # a host sync: bucketed or unpadded shapes need the count
        if pad_to_max:
            n = min(num_anchors, -(-n // pad_multiple) * pad_multiple)
    if n > anchors.shape[1]:
        anchors, valid = F.pad(anchors, (0, n - anchors.shape[1])), F.pad(valid, (0, n - valid.shape[1]))
    return anchors[:, :n].contiguous(), valid[:, :n].contiguous()


def sample_anchors_and_reveals(loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator, reveal_prob: float,
                               reveal_max: int, pad_to_max: bool = False, pad_multiple: int = 0, key_width: int = 0,
                               doc_start: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``sample_anchors`` and, with ``reveal_prob`` > 0, each anchor's revealed slots (``build_blocks``' ``reveal``
    [Bsz, N]: 0 with probability 1 - reveal_prob, else uniform in 1 .. reveal_max). Each row takes one draw of fixed
    width, its anchor keys then two numbers per anchor column, so that a row's anchors and reveals depend neither on
    how far its micro-batch is padded nor on how the step's rows are split into micro-batches (gradient accumulation),
    as ``sample_anchors``' own keys do. Without reveals: ``sample_anchors`` alone, the same anchors as before."""
    if reveal_prob <= 0:
        return (*sample_anchors(loss_mask, num_anchors, generator, pad_to_max, pad_multiple, key_width, doc_start=doc_start), None)
    width = max(key_width, loss_mask.shape[1] - 1)
    draws = torch.rand(loss_mask.shape[0], width + 2 * num_anchors, generator=generator)
    anchors, valid = sample_anchors(loss_mask, num_anchors, generator, pad_to_max, pad_multiple, key_width, keys=draws[:, :width],
                                    doc_start=doc_start)
    n = anchors.shape[1]  # <= num_anchors
    shown = draws[:, width:width + n] < reveal_prob
    count = 1 + (draws[:, width + num_anchors:width + num_anchors + n] * reveal_max).long().clamp(max=reveal_max - 1)
    return anchors, valid, to_device_async(torch.where(shown, count, 0), anchors.device)


def build_blocks(input_ids: torch.Tensor, loss_mask: torch.Tensor, anchors: torch.Tensor, anchor_valid: torch.Tensor, block_size: int,
                 mask_token_id: int, reveal: torch.Tensor | None = None, doc_start: torch.Tensor | None = None) -> Blocks:
    """Block inputs, positions and labels for anchors ([Bsz, T] ids and loss mask, [Bsz, N] anchors). ``reveal`` [Bsz, N]:
    how many slots after each anchor hold their true token instead of the mask token (and no label). ``doc_start``
    [Bsz, T] (packed documents): slots past the anchor's document are as slots past the row's end (no label, never
    revealed)."""
    bsz, seq_len = input_ids.shape
    offsets = torch.arange(block_size, device=input_ids.device)
    positions = anchors[:, :, None] + offsets  # [Bsz, N, B]
    in_range = positions < seq_len
    gather_at = positions.clamp(max=seq_len - 1).flatten(1)
    if doc_start is not None:
        same_doc = doc_start.gather(1, gather_at).view_as(positions) == doc_start.gather(1, anchors)[:, :, None]
        in_range = in_range & same_doc
    targets = input_ids.gather(1, gather_at).view_as(positions)
    has_loss = loss_mask.gather(1, gather_at).view_as(positions) & in_range & anchor_valid[:, :, None]
    has_loss[:, :, 0] = False
    labels = torch.where(has_loss, targets, torch.full_like(targets, IGNORE))
    block_ids = torch.full_like(targets, mask_token_id)
    block_ids[:, :, 0] = input_ids.gather(1, anchors)
    if reveal is not None:
        shown = (offsets >= 1) & (offsets <= reveal[:, :, None]) & in_range  # [Bsz, N, B]
        block_ids = torch.where(shown, targets, block_ids)
        labels = torch.where(shown, IGNORE, labels)
    return Blocks(anchors, anchor_valid, block_ids.flatten(1), positions.flatten(1), labels.flatten(1))


def layer_masks(blocks: Blocks, ctx_valid: torch.Tensor, block_size: int, layer_types: list[str], sliding_window: int | None,
                sliding_block_causal: bool, backend: str, query_groups: int = 1, head_dim: int = 128,
                flex_options: dict | None = None, ctx_lo: torch.Tensor | None = None) -> dict:
    """One mask per layer type present: dense bool for SDPA (``backend='sdpa'``), or for flex a
    BlockMask over queries packed by KV group (``query_groups`` = query heads per KV head) where a
    tile holds whole blocks, else a plain BlockMask. ``flex-flash``: the packed masks run on
    FlashAttention-4's kernels (flex's BACKEND=FLASH); a plain BlockMask stays on Triton flex.
    ``fa4``: per-row key intervals on FlashAttention-4's own kernels (``swa_kernels.key_intervals``). ``flex_options``:
    Triton flex's kernel options over ``triton_flex_options``' defaults (``trainer.flex_kernel_options``). ``ctx_lo``
    [Bsz, N]: packed documents, each block's first visible context key (``dflash_visible``)."""

    def build(spec: LayerMaskSpec):
        if backend == "sdpa":
            return dense_mask(blocks.anchors, ctx_valid, block_size, spec, ctx_lo)
        if backend == "fa4":
            return key_interval_mask(blocks.anchors, ctx_valid, block_size, spec, query_groups, head_dim, group_major=True, ctx_lo=ctx_lo)
        options = FLASH_KERNELS if backend == "flex-flash" else {**(triton_flex_options(head_dim, backward=True) or {}), **(flex_options or {})} or None
        packed = flex_packed_block_mask(blocks.anchors, ctx_valid, block_size, spec, query_groups, kernel_options=options, ctx_lo=ctx_lo)
        return packed if packed is not None else flex_block_mask(blocks.anchors, ctx_valid, block_size, spec, ctx_lo=ctx_lo)

    return {t: build(LayerMaskSpec.for_layer(t, sliding_window, sliding_block_causal)) for t in set(layer_types)}


@dataclass
class BlockStats:
    """Sums over a batch; add them up over batches, then call ``summary``."""

    loss_sum: torch.Tensor  # weighted CE summed over labelled slots
    num_labels: torch.Tensor  # labelled slots
    slot_correct: torch.Tensor  # [B] argmax == label, per slot
    slot_count: torch.Tensor  # [B] labelled, per slot
    accepted_sum: torch.Tensor  # sum over valid blocks of leading correct slots
    num_blocks: torch.Tensor
    walk_tokens: torch.Tensor  # the loop replayed over whole assistant turns (evaluation only, else 0)
    walk_steps: torch.Tensor

    def __add__(self, other: "BlockStats") -> "BlockStats":
        return BlockStats(*(a + b for a, b in zip(vars(self).values(), vars(other).values())))

    def summary(self, prefix: str) -> dict[str, float]:
        acc = (self.slot_correct[1:] / self.slot_count[1:].clamp(min=1)).tolist()
        sim_tau = 1.0 + sum(math.prod(acc[: k + 1]) for k in range(len(acc)))
        out = {
            f"{prefix}/loss": float(self.loss_sum / self.num_labels.clamp(min=1)),
            f"{prefix}/acc": float(self.slot_correct[1:].sum() / self.slot_count[1:].sum().clamp(min=1)),
            f"{prefix}/sim_tau": sim_tau,  # 1 + sum_k prod_{j<=k} acc_j (per-slot accuracies)
            **tau_summaries(prefix, self.accepted_sum, self.num_blocks, self.walk_tokens, self.walk_steps),
        }
        out.update({f"{prefix}/acc_slot_{k + 1}": a for k, a in enumerate(acc)})
        return out


EVAL_LOGITS_BYTES = 2 << 30  # evaluation computes the drafter's fp32 logits in row chunks of about this size


def head_and_loss(hidden: torch.Tensor, lm_head: torch.nn.Module, labels: torch.Tensor, anchor_valid: torch.Tensor, block_size: int,
                  gamma: float, dpace_alpha: float | None = None) -> BlockStats:
    """``block_loss`` of the (frozen) head on ``hidden``, the target's or a draft vocabulary's rows of it, labels in
    its ids: compiled as one region in training."""
    return block_loss(lm_head(hidden), labels, anchor_valid, block_size, gamma, dpace_alpha)


def drafter_and_loss(drafter: DFlashDraftModel, block_embeds: torch.Tensor, features: torch.Tensor, positions: torch.Tensor, masks: dict,
                     lm_head: torch.nn.Module, labels: torch.Tensor, anchor_valid: torch.Tensor, block_size: int, gamma: float,
                     dpace_alpha: float | None = None) -> BlockStats:
    """The drafter's training forward, the head and ``block_loss`` in one function: ``trainer.compile_scope=step``
    compiles it whole (one graph forward, one backward, flex attention inside)."""
    hidden = drafter(block_embeds, features, positions, masks)
    return head_and_loss(hidden, lm_head, labels, anchor_valid, block_size, gamma, dpace_alpha)


def dpace_weights(ce: torch.Tensor, has_label: torch.Tensor, block_size: int, alpha: float) -> torch.Tensor:
    """D-PACE slot weights [Bsz, Q] (vLLM speculators 0.9.0, losses/utils.py ``dpace_loss_decay``, read for this):
    slot k of a block weighs sum_{j >= k} prod_{i <= j} s_i over labelled slots, s_i = (1 - alpha) q_i + alpha with
    q_i = exp(-CE_i) the drafter's probability of slot i's label: the expected accepted drafts that need slot k
    right, so early slots weigh most while the drafter is unsure and later ones gain as it improves. No gradient."""
    bsz, q_len = ce.shape
    q = torch.exp(-ce.detach()).view(bsz, -1, block_size)
    mask = has_label.view(bsz, -1, block_size).float()
    smooth = torch.where(mask > 0, (1 - alpha) * q + alpha, torch.ones_like(q))
    weight = (torch.cumprod(smooth, -1) * mask).flip(-1).cumsum(-1).flip(-1) * mask
    return weight.view(bsz, q_len)


def block_loss(logits: torch.Tensor, labels: torch.Tensor, anchor_valid: torch.Tensor, block_size: int, gamma: float,
               dpace_alpha: float | None = None, per_block: bool = False) -> BlockStats | tuple[BlockStats, torch.Tensor]:
    """Weighted CE and accuracy stats. logits [Bsz, Q, V], labels [Bsz, Q] (IGNORE: unlabelled; OUTSIDE: labelled, not in
    the head's vocabulary); Q = N * B. Slot weights: exp(-(k-1)/gamma),
    or D-PACE's (``dpace_weights``) when ``dpace_alpha`` is given.
    ``per_block``: also return [Bsz, N] each block's leading correct drafts."""
    bsz, q_len, vocab = logits.shape
    slot = torch.arange(q_len, device=labels.device) % block_size
    has_label = labels != IGNORE
    ce_labels = torch.where(labels == OUTSIDE, IGNORE, labels)
    ce, top = logits_cross_entropy(logits.reshape(-1, vocab), ce_labels.reshape(-1), ignore_index=IGNORE, with_argmax=True)
    ce, top = ce.view(bsz, q_len), top.view(bsz, q_len)
    if dpace_alpha is None:
        weight = torch.exp(-(slot - 1).clamp(min=0).float() / gamma).expand(bsz, -1)
    else:
        # a label outside the draft vocabulary is a sure miss (q = 0), not the sure hit its zero CE term would read as
        weight = dpace_weights(torch.where(labels == OUTSIDE, torch.inf, ce), has_label, block_size, dpace_alpha)
    correct = (top == labels) & has_label
    slot_correct = torch.zeros(block_size, device=labels.device).index_add_(0, slot, correct.float().sum(0))
    slot_count = torch.zeros(block_size, device=labels.device).index_add_(0, slot, has_label.float().sum(0))
    # Accepted length in a block: leading slots 1.. that are labelled and correct.
    accepted = leading_correct(correct.view(bsz, -1, block_size)[:, :, 1:])  # [Bsz, N]
    stats = BlockStats(
        loss_sum=(ce * weight * has_label).sum(),
        num_labels=has_label.sum().float(),
        slot_correct=slot_correct,
        slot_count=slot_count,
        accepted_sum=(accepted * anchor_valid).sum().float(),
        num_blocks=anchor_valid.sum().float(),
        walk_tokens=torch.zeros((), device=labels.device),
        walk_steps=torch.zeros((), device=labels.device),
    )
    return (stats, accepted) if per_block else stats


def dense_anchor_chunks(loss_mask: torch.Tensor, num_anchors: int, pad_to_max: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every eligible anchor of every row (``sample_anchors``' rule), in chunks of ``num_anchors``
    per row: [(anchors [Bsz, N], valid [Bsz, N])]. Evaluation drafts a block at every position."""
    eligible = loss_mask[:, :-1] & loss_mask[:, 1:]
    rows = [r.nonzero().flatten().cpu() for r in eligible]
    longest = max((len(r) for r in rows), default=0)
    chunks = []
    for start in range(0, max(longest, 1), num_anchors):
        parts = [r[start:start + num_anchors] for r in rows]
        n = num_anchors if pad_to_max else max(1, max(len(p) for p in parts))
        anchors = torch.zeros(len(rows), n, dtype=torch.long)
        valid = torch.zeros(len(rows), n, dtype=torch.bool)
        for i, p in enumerate(parts):
            anchors[i, :len(p)], valid[i, :len(p)] = p, True
        chunks.append((anchors.to(loss_mask.device), valid.to(loss_mask.device)))
    return chunks
