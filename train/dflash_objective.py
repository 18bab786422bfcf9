"""DFlash training objective: random anchors, masked blocks, decayed cross-entropy, acceptance stats.

For every sequence, anchors are drawn at random (``num_anchors``, capped by what the sequence holds)
among positions a whose token and next token are both in the loss mask. Block n is
[token(a_n), mask x (B-1)]; slot k (1..B-1) is trained on the ground-truth token at a_n + k (when
that position exists and is in the loss mask) with weight exp(-(k-1)/gamma): early slots decide
acceptance, so they weigh most (the DFlash paper uses gamma 7 for B=16, 5 for B=10, 4 for B=8).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.attention import FLASH_KERNELS

from .masks import LayerMaskSpec, dense_mask, flex_block_mask, flex_packed_block_mask, key_interval_mask

IGNORE = -100
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


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator, pad_to_max: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Random sorted anchors per row among positions whose token and next token carry loss.

    Args:
        loss_mask: [Bsz, T] bool.
        pad_to_max: return N = num_anchors columns always (static shapes for compiled kernels).
    Returns:
        anchors [Bsz, N] long and valid [Bsz, N] bool, N = max anchors any row got (>= 1).
    """
    eligible = loss_mask[:, :-1] & loss_mask[:, 1:]
    rows = []
    for row in eligible:
        candidates = row.nonzero().flatten().cpu()
        pick = torch.randperm(len(candidates), generator=generator)[:num_anchors]
        rows.append(candidates[pick].sort().values)
    n = num_anchors if pad_to_max else max(1, max(len(r) for r in rows))
    anchors = torch.zeros(len(rows), n, dtype=torch.long)
    valid = torch.zeros(len(rows), n, dtype=torch.bool)
    for i, r in enumerate(rows):
        anchors[i, : len(r)] = r
        valid[i, : len(r)] = True
    return anchors.to(loss_mask.device), valid.to(loss_mask.device)


def build_blocks(input_ids: torch.Tensor, loss_mask: torch.Tensor, anchors: torch.Tensor, anchor_valid: torch.Tensor, block_size: int, mask_token_id: int) -> Blocks:
    """Block inputs, positions and labels for anchors ([Bsz, T] ids and loss mask, [Bsz, N] anchors)."""
    bsz, seq_len = input_ids.shape
    offsets = torch.arange(block_size, device=input_ids.device)
    positions = anchors[:, :, None] + offsets  # [Bsz, N, B]
    in_range = positions < seq_len
    gather_at = positions.clamp(max=seq_len - 1).flatten(1)
    targets = input_ids.gather(1, gather_at).view_as(positions)
    has_loss = loss_mask.gather(1, gather_at).view_as(positions) & in_range & anchor_valid[:, :, None]
    has_loss[:, :, 0] = False
    labels = torch.where(has_loss, targets, torch.full_like(targets, IGNORE))
    block_ids = torch.full_like(targets, mask_token_id)
    block_ids[:, :, 0] = input_ids.gather(1, anchors)
    return Blocks(anchors, anchor_valid, block_ids.flatten(1), positions.flatten(1), labels.flatten(1))


def layer_masks(blocks: Blocks, ctx_valid: torch.Tensor, block_size: int, layer_types: list[str], sliding_window: int | None,
                sliding_block_causal: bool, backend: str, query_groups: int = 1, head_dim: int = 128) -> dict:
    """One mask per layer type present: dense bool for SDPA (``backend='sdpa'``), or for flex a
    BlockMask over queries packed by KV group (``query_groups`` = query heads per KV head) where a
    tile holds whole blocks, else a plain BlockMask. ``flex-flash``: the packed masks run on
    FlashAttention-4's kernels (flex's BACKEND=FLASH); a plain BlockMask stays on Triton flex.
    ``fa4``: per-row key intervals on FlashAttention-4's own kernels (``kernels.key_intervals``)."""

    def build(spec: LayerMaskSpec):
        if backend == "sdpa":
            return dense_mask(blocks.anchors, ctx_valid, block_size, spec)
        if backend == "fa4":
            return key_interval_mask(blocks.anchors, ctx_valid, block_size, spec, query_groups, head_dim, group_major=True)
        options = FLASH_KERNELS if backend == "flex-flash" else None
        packed = flex_packed_block_mask(blocks.anchors, ctx_valid, block_size, spec, query_groups, kernel_options=options)
        return packed if packed is not None else flex_block_mask(blocks.anchors, ctx_valid, block_size, spec)

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

    def __add__(self, other: "BlockStats") -> "BlockStats":
        return BlockStats(*(a + b for a, b in zip(vars(self).values(), vars(other).values())))

    def summary(self, prefix: str) -> dict[str, float]:
        acc = (self.slot_correct[1:] / self.slot_count[1:].clamp(min=1)).tolist()
        sim_tau = 1.0 + sum(math.prod(acc[: k + 1]) for k in range(len(acc)))
        out = {
            f"{prefix}/loss": float(self.loss_sum / self.num_labels.clamp(min=1)),
            f"{prefix}/acc": float(self.slot_correct[1:].sum() / self.slot_count[1:].sum().clamp(min=1)),
            f"{prefix}/sim_tau": sim_tau,  # 1 + sum_k prod_{j<=k} acc_j (per-slot accuracies)
            f"{prefix}/block_tau": float(1 + self.accepted_sum / self.num_blocks.clamp(min=1)),  # leading correct run + 1
        }
        out.update({f"{prefix}/acc_slot_{k + 1}": a for k, a in enumerate(acc)})
        return out


def block_loss(logits: torch.Tensor, labels: torch.Tensor, anchor_valid: torch.Tensor, block_size: int, gamma: float) -> BlockStats:
    """Decayed CE and accuracy stats. logits [Bsz, Q, V], labels [Bsz, Q]; Q = N * B."""
    bsz, q_len, vocab = logits.shape
    slot = torch.arange(q_len, device=labels.device) % block_size
    weight = torch.exp(-(slot - 1).clamp(min=0).float() / gamma).expand(bsz, -1)
    has_label = labels != IGNORE
    ce = F.cross_entropy(logits.float().reshape(-1, vocab), labels.reshape(-1), ignore_index=IGNORE, reduction="none").view(bsz, q_len)
    correct = (logits.argmax(-1) == labels) & has_label
    slot_correct = torch.zeros(block_size, device=labels.device).index_add_(0, slot, correct.float().sum(0))
    slot_count = torch.zeros(block_size, device=labels.device).index_add_(0, slot, has_label.float().sum(0))
    # Accepted length in a block: leading slots 1.. that are labelled and correct.
    per_block = correct.view(bsz, -1, block_size)[:, :, 1:].long()
    accepted = per_block.cumprod(-1).sum(-1)  # [Bsz, N]
    return BlockStats(
        loss_sum=(ce * weight * has_label).sum(),
        num_labels=has_label.sum().float(),
        slot_correct=slot_correct,
        slot_count=slot_count,
        accepted_sum=(accepted * anchor_valid).sum().float(),
        num_blocks=anchor_valid.sum().float(),
    )
