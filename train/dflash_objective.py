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


def tau_summaries(prefix: str, accepted_sum: torch.Tensor, count: torch.Tensor, walk_tokens: torch.Tensor,
                  walk_steps: torch.Tensor) -> dict[str, float]:
    """Acceptance length from teacher forcing, two ways (both drafters use this).

    ``anchor_tau`` = 1 + mean over anchors of the leading correct drafts: every position weighs the
    same. The decoding loop does not visit positions uniformly: a step that accepts a drafts moves
    a + 1 positions on, so a run of easy positions (a repetition loop, a code block) is crossed in a
    few steps while every hard position costs a whole step, and ``anchor_tau`` overstates the loop's
    τ (BENCHMARKS.md "τ you can trust"). ``block_tau`` replays the loop instead (``walk_tau``) over
    whole assistant turns with a block at every position, which evaluation computes
    (``walk_tokens`` / ``walk_steps``; training batches draw random anchors and have no walk). On the
    target's own greedy output the replay is the loop's τ exactly (``tests/test_loop_eval.py``).
    """
    out = {f"{prefix}/anchor_tau": float(1 + accepted_sum / count.clamp(min=1))}
    if float(walk_steps) > 0:
        out[f"{prefix}/block_tau"] = float(walk_tokens / walk_steps)
    return out


def walk_segments(accepted: torch.Tensor, loss_mask: torch.Tensor) -> tuple[int, int]:
    """``walk_tau`` over each assistant turn of each row: [Bsz, T] leading correct drafts of a block
    anchored at every position (-1 where none) and [Bsz, T] the loss mask; a turn is a run of loss
    positions and the loop's first step there is anchored at its first token. Returns (tokens, steps)."""
    tokens = steps = 0
    for acc_row, mask_row in zip(accepted.tolist(), loss_mask.tolist()):  # host sync: evaluation only
        t = 0
        while t < len(mask_row):
            if not mask_row[t]:
                t += 1
                continue
            end = t
            while end < len(mask_row) and mask_row[end]:
                end += 1
            n, s = walk_tau([max(a, 0) for a in acc_row[t:end]])
            tokens, steps, t = tokens + n, steps + s, end
    return tokens, steps


def leading_correct(correct: torch.Tensor) -> torch.Tensor:
    """[..., S] bool (draft k right) -> [...] long: how many leading drafts a greedy verify accepts."""
    return correct.long().cumprod(-1).sum(-1)


def walk_tau(accepted: list[int], start: int = 0) -> tuple[int, int]:
    """The greedy loop replayed on teacher-forced acceptances: from ``start``, a step at position i
    accepts ``accepted[i]`` drafts and the next step starts at i + accepted[i] + 1 (``accepted[i]``
    already capped at the block's drafts). Returns (tokens, steps); tau = tokens / steps."""
    i, steps, tokens = start, 0, 0
    while i < len(accepted):
        steps += 1
        tokens += accepted[i] + 1
        i += accepted[i] + 1
    return tokens, steps


def block_loss(logits: torch.Tensor, labels: torch.Tensor, anchor_valid: torch.Tensor, block_size: int, gamma: float,
               per_block: bool = False) -> BlockStats | tuple[BlockStats, torch.Tensor]:
    """Decayed CE and accuracy stats. logits [Bsz, Q, V], labels [Bsz, Q]; Q = N * B.
    ``per_block``: also return [Bsz, N] each block's leading correct drafts."""
    bsz, q_len, vocab = logits.shape
    slot = torch.arange(q_len, device=labels.device) % block_size
    weight = torch.exp(-(slot - 1).clamp(min=0).float() / gamma).expand(bsz, -1)
    has_label = labels != IGNORE
    ce = F.cross_entropy(logits.float().reshape(-1, vocab), labels.reshape(-1), ignore_index=IGNORE, reduction="none").view(bsz, q_len)
    correct = (logits.argmax(-1) == labels) & has_label
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
