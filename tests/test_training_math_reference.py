"""Training math of train/dflash.py and train/eagle3.py against element-by-element references (CPU, small random inputs)."""

from __future__ import annotations

import math

import pytest
import torch

from train.dflash import (IGNORE, OUTSIDE, BlockStats, block_loss, build_blocks, dpace_weights, sample_anchors,
                          sample_anchors_and_reveals)
from train.eagle3 import STEP_DECAY, label_mask, ttt_dense_mask, ttt_loss, unroll

pytestmark = pytest.mark.usefixtures("single_cpu_thread")


# ----------------------------------------------------------------------------- DFlash


def random_batch(g: torch.Generator, bsz: int = 3, seq_len: int = 23, vocab: int = 30, pad_id: int = 2):
    """Right-padded rows (pad id == an eos id in the text, as SmolLM2), multi-turn loss masks with gaps."""
    ids = torch.randint(0, vocab, (bsz, seq_len), generator=g)
    lengths = [seq_len, seq_len - 5, seq_len - 11]
    loss_mask = torch.rand(bsz, seq_len, generator=g) < 0.75
    for b, n in enumerate(lengths):
        ids[b, n:] = pad_id
        loss_mask[b, n:] = False
    ids[0, 7] = pad_id  # an eos inside a real row, in the loss mask
    loss_mask[0, 7] = True
    return ids, loss_mask, lengths


@pytest.mark.parametrize("seed", range(5))
def test_anchors_and_blocks_follow_a_position_by_position_reference(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    ids, loss_mask, lengths = random_batch(g)
    bsz, seq_len = ids.shape
    block, num_anchors, reveal_max = 5, 4, 3
    anchors, valid, reveal = sample_anchors_and_reveals(loss_mask, num_anchors, g, 0.6, reveal_max, key_width=31)
    for b in range(bsz):
        eligible = [a for a in range(seq_len - 1) if loss_mask[b, a] and loss_mask[b, a + 1]]
        got = anchors[b][valid[b]].tolist()
        assert got == sorted(set(got)) and all(a in eligible for a in got)
        assert len(got) == min(num_anchors, len(eligible))
        assert all(a + 1 < lengths[b] for a in got)  # never at or past a padded row's end
    assert ((reveal >= 0) & (reveal <= reveal_max)).all()
    blocks = build_blocks(ids, loss_mask, anchors, valid, block, 99, reveal)
    for b in range(bsz):
        for n in range(anchors.shape[1]):
            a, r = int(anchors[b, n]), int(reveal[b, n])
            for k in range(block):
                q = n * block + k
                p = a + k
                assert int(blocks.positions[b, q]) == p
                shown = 1 <= k <= r and p < seq_len
                want_id = int(ids[b, a]) if k == 0 else int(ids[b, p]) if shown else 99
                assert int(blocks.block_ids[b, q]) == want_id
                labelled = k >= 1 and not shown and bool(valid[b, n]) and p < seq_len and bool(loss_mask[b, p])
                assert int(blocks.labels[b, q]) == (int(ids[b, p]) if labelled else IGNORE)


def reference_block_stats(logits, labels, valid, block, gamma):
    bsz, q_len, _ = logits.shape
    loss, count = 0.0, 0
    correct, seen = [0] * block, [0] * block
    accepted = 0
    for b in range(bsz):
        for n in range(q_len // block):
            run = True
            for k in range(1, block):
                q = n * block + k
                label = int(labels[b, q])
                ok = False
                if label != IGNORE:
                    count += 1
                    seen[k] += 1
                    if label != OUTSIDE:
                        loss += math.exp(-(k - 1) / gamma) * float(torch.logsumexp(logits[b, q], 0) - logits[b, q, label])
                        ok = int(logits[b, q].argmax()) == label
                    correct[k] += ok
                run = run and ok
                accepted += run and bool(valid[b, n])
    return loss, count, correct, seen, accepted


@pytest.mark.parametrize("seed", range(4))
def test_block_loss_and_summary_follow_an_element_by_element_reference(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    ids, loss_mask, _ = random_batch(g, vocab=8)
    block, gamma = 4, 2.5
    anchors, valid, reveal = sample_anchors_and_reveals(loss_mask, 5, g, 0.3, 2)
    blocks = build_blocks(ids, loss_mask, anchors, valid, block, 7, reveal)
    labels = blocks.labels.clone()
    labels[(labels == 5)] = OUTSIDE
    logits = torch.randn(*labels.shape, 8, generator=g)
    logits[..., 3] += 1.5  # some right drafts
    stats = block_loss(logits, labels, valid, block, gamma)
    loss, count, correct, seen, accepted = reference_block_stats(logits, labels, valid, block, gamma)
    assert math.isclose(float(stats.loss_sum), loss, rel_tol=1e-5)
    assert float(stats.num_labels) == count
    assert stats.slot_correct.tolist() == correct and stats.slot_count.tolist() == seen
    assert float(stats.accepted_sum) == accepted and float(stats.num_blocks) == int(valid.sum())
    summary = stats.summary("x")
    acc = [correct[k] / max(seen[k], 1) for k in range(1, block)]
    tau = 1.0
    for k in range(len(acc)):
        prod = 1.0
        for j in range(k + 1):
            prod *= acc[j]
        tau += prod
    assert summary["x/sim_tau"] == pytest.approx(tau)
    assert summary["x/loss"] == pytest.approx(loss / count, rel=1e-5)
    assert summary["x/acc"] == pytest.approx(sum(correct) / sum(seen))
    for k in range(1, block):
        assert summary[f"x/acc_slot_{k}"] == pytest.approx(correct[k] / max(seen[k], 1))
    # BlockStats add up
    both = stats + stats
    assert both.summary("x")["x/sim_tau"] == pytest.approx(tau)


def test_dpace_counts_a_label_outside_the_draft_vocabulary_as_a_sure_miss() -> None:
    """D-PACE: q_i = the drafter's probability of slot i's label. A label outside a draft vocabulary (OUTSIDE) is one
    the head cannot produce: q_i = 0, s_i = alpha, so slot i adds alpha * prod(earlier) to the expected accepted drafts
    of every earlier slot, not the prod(earlier) of a sure hit."""
    g = torch.Generator().manual_seed(1)
    block, vd, alpha = 4, 6, 0.3
    logits = torch.randn(1, 2 * block, vd, generator=g)
    labels = torch.randint(0, vd, (1, 2 * block), generator=g)
    labels[:, ::block] = IGNORE
    labels[0, 2] = OUTSIDE  # block 0 slot 2
    labels[0, block + 1] = OUTSIDE  # block 1 slot 1
    has_label = labels != IGNORE
    q = torch.zeros(labels.shape)
    for i in range(labels.shape[1]):
        if has_label[0, i] and labels[0, i] != OUTSIDE:
            q[0, i] = torch.softmax(logits[0, i], 0)[labels[0, i]]
    want = torch.zeros(labels.shape)
    for n in range(2):
        for k in range(block):
            if not has_label[0, n * block + k]:
                continue
            for j in range(k, block):
                if has_label[0, n * block + j]:
                    prod = 1.0
                    for i in range(j + 1):
                        if has_label[0, n * block + i]:
                            prod *= (1 - alpha) * float(q[0, n * block + i]) + alpha
                    want[0, n * block + k] += prod
    ce = torch.where(has_label & (labels != OUTSIDE),
                     torch.nn.functional.cross_entropy(logits[0], labels[0].clamp(min=0), reduction="none")[None], 0.0)
    stats = block_loss(logits, labels, torch.ones(1, 2, dtype=torch.bool), block, gamma=7.0, dpace_alpha=alpha)
    torch.testing.assert_close(stats.loss_sum, (ce * want).sum())


def test_anchor_keys_do_not_depend_on_padding() -> None:
    g = torch.Generator().manual_seed(3)
    ids, loss_mask, _ = random_batch(g)
    a1, v1 = sample_anchors(loss_mask, 4, torch.Generator().manual_seed(5), key_width=40)
    padded = torch.nn.functional.pad(loss_mask, (0, 9))
    a2, v2 = sample_anchors(padded, 4, torch.Generator().manual_seed(5), key_width=40)
    assert torch.equal(a1[v1], a2[v2])


# ----------------------------------------------------------------------------- EAGLE-3


def reference_visible(ctx_valid, step, window):
    """Which keys the inference chain anchored at index t has at step j: the context cache (step-0 keys of real indices
    u <= t, index t's own), then its own drafts (step s, index t); a window by RoPE position (u + 1 + s)."""
    bsz, seq_len = ctx_valid.shape
    out = torch.zeros(bsz, 1, seq_len, (step + 1) * seq_len, dtype=torch.bool)
    for b in range(bsz):
        for t in range(seq_len):
            qpos = t + 1 + step
            for s in range(step + 1):
                for u in range(seq_len):
                    if s == 0:
                        ok = u <= t and (bool(ctx_valid[b, u]) or u == t)
                    else:
                        ok = u == t
                    if window is not None and not (u + 1 + s > qpos - window):
                        ok = False
                    out[b, 0, t, s * seq_len + u] = ok
    return out


@pytest.mark.parametrize("window", [None, 1, 2, 5])
def test_ttt_masks_are_the_inference_chains_keys(window) -> None:
    ctx_valid = torch.ones(2, 7, dtype=torch.bool)
    ctx_valid[1, 4:] = False
    for step in range(4):
        assert torch.equal(ttt_dense_mask(ctx_valid, step, window), reference_visible(ctx_valid, step, window))


def test_label_mask_with_pad_equal_to_eos() -> None:
    ids = torch.tensor([[5, 6, 2, 7, 8, 2, 2, 2]])  # eos 2 inside the row (labelled), then padding with the same id
    attention_mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0]])
    loss_mask = torch.tensor([[0, 0, 1, 0, 1, 1, 0, 0]], dtype=torch.bool)
    for step in range(3):
        want = [bool(t + step + 2 < 8 and loss_mask[0, t + step + 2] and attention_mask[0, t + step + 2]) for t in range(8)]
        assert label_mask(ids, loss_mask, attention_mask, step)[0].tolist() == want


@torch.no_grad()
def test_ttt_per_step_accuracy_and_loss_follow_a_loop() -> None:
    from test_eagle3_train import small_drafter

    model = small_drafter(["full_attention"], None)
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 40, (2, 10), generator=g)
    attention_mask = torch.ones(2, 10, dtype=torch.long)
    attention_mask[1, 7:] = 0
    loss_mask = (torch.rand(2, 10, generator=g) < 0.8) & attention_mask.bool()
    outputs = unroll(model, torch.randn(2, 10, 96, generator=g), ids, attention_mask.bool(), 3)
    target_logits = torch.randn(2, 10, 40, generator=g)
    draft_ids = model.draft_ids_in_target()
    for j, h in enumerate(outputs):  # make some drafts right
        guess = draft_ids[model.logits(h).argmax(-1)]
        for b in range(2):
            for t in range(10 - j - 1):
                if (t + b) % 2:
                    target_logits[b, t + j + 1, guess[b, t]] += 30
    stats = ttt_loss(model, outputs, target_logits, ids, loss_mask, attention_mask)
    for j, h in enumerate(outputs):
        logits = model.logits(h)
        n = c = 0
        ce = 0.0
        for b in range(2):
            for t in range(10):
                p = t + j + 2
                if p >= int(attention_mask[b].sum()) or not loss_mask[b, p]:
                    continue
                n += 1
                c += int(draft_ids[logits[b, t].argmax()]) == int(target_logits[b, t + j + 1].argmax())
                soft = torch.softmax(target_logits[b, t + j + 1, draft_ids], -1)
                ce += float(-(soft * torch.log_softmax(logits[b, t], -1)).sum())
        assert float(stats.step_count[j]) == n and float(stats.step_correct[j]) == c
        assert math.isclose(float(stats.step_loss[j]), ce, rel_tol=1e-5)
    assert 0 < float(stats.step_correct.sum()) < float(stats.step_count.sum())
    assert math.isclose(float(stats.loss_sum), sum(STEP_DECAY**j * float(stats.step_loss[j]) for j in range(3)), rel_tol=1e-5)


def test_ttt_loss_on_rows_no_longer_than_the_unroll() -> None:
    """A batch padded to no more than the TTT length (its later steps have no label at all): the same stats as the same
    rows padded longer, whose pads carry no label (the loss once sliced those steps with a negative length)."""
    from test_eagle3_train import small_drafter

    model = small_drafter(["full_attention"], None)
    g = torch.Generator().manual_seed(3)
    short, long, steps = 5, 14, 8
    ids = torch.randint(0, 40, (2, short), generator=g)
    attention_mask = torch.ones(2, short, dtype=torch.long)
    attention_mask[1, 4:] = 0
    loss_mask = torch.ones(2, short, dtype=torch.bool) & attention_mask.bool()
    features, target_logits = torch.randn(2, short, 96, generator=g), torch.randn(2, short, 40, generator=g)

    def padded(x: torch.Tensor, fill) -> torch.Tensor:
        return torch.cat([x, x.new_full((x.shape[0], long - short, *x.shape[2:]), fill)], dim=1)

    stats_short = ttt_loss(model, unroll(model, features, ids, attention_mask.bool(), steps), target_logits, ids, loss_mask,
                           attention_mask)
    stats_long = ttt_loss(model, unroll(model, padded(features, 0.0), padded(ids, 2), padded(attention_mask, 0).bool(), steps),
                          padded(target_logits, 0.0), padded(ids, 2), padded(loss_mask, False), padded(attention_mask, 0))
    assert float(stats_short.step_count[0]) == 5 and float(stats_short.step_count[3:].sum()) == 0  # labels: 3 + 2 rows
    for name, value in vars(stats_long).items():
        torch.testing.assert_close(getattr(stats_short, name), value, msg=name)
