"""A conversation's next turn resumed past ``kept_prefix`` leaves the static drafters (EAGLE-3 chains,
DFlash blocks) in the state a fresh drafter reaches by prefilling the whole turn-2 prompt: the same held keys/values
(positions and values, every layer), the same pending block (EAGLE-3), the same draft logits and tokens on turn 2's
first steps. Turn 1 runs the batched protocol on row 1 of 2 (draft, whole verify block appended, forced acceptance,
optionally idle steps after the row finished, as ``infer.batch`` steps a waiting row). Target features are a fixed
causal function of the tokens (f_t from x_{t-1}, x_t, t), so the kept keys and the fresh ones are made from the same
numbers and any mismatch is the drafter's bookkeeping, not the target's rounding. Slow: ~50 s for the grid.

Also the most that can be kept: a prompt the caches hold whole keeps n - 1 positions for both drafters (EAGLE-3 kept
n - 2, its key at n - 1 redone), and DFlash's ring check reads the first block's window exactly (it asked for one
position more, and a ring that had lost it alone kept nothing)."""

from __future__ import annotations

import pytest
import torch

from infer.generate import common_prefix
from models.dflash import StaticDFlashDrafter
from models.eagle3 import StaticEagle3Drafter
import test_static_drafters as dflash_tests
import test_static_eagle3 as eagle_tests

pytestmark = [pytest.mark.usefixtures("single_cpu_thread"), pytest.mark.slow]

ROW, CAP = 1, 160
ACCEPTED = [2, 0, 3, 1, 3]  # turn 1's steps (the last accepts 3: the pending block starts 4 before the row's end)
TURN2_ACCEPTED = [1, 0, 2, 3]


class Features:
    """Causal stand-in for the target's features: f_t = A[x_t] + B[x_{t-1}] + C[t]."""

    def __init__(self, vocab: int, dim: int, seed: int = 11):
        g = torch.Generator().manual_seed(seed)
        self.a, self.b = torch.randn(vocab, dim, generator=g), 0.5 * torch.randn(vocab, dim, generator=g)
        self.c = 0.5 * torch.randn(512, dim, generator=g)

    def __call__(self, ids) -> torch.Tensor:
        ids = torch.as_tensor(list(ids), dtype=torch.long)
        prev = torch.cat([ids.new_zeros(1), ids[:-1]])
        return self.a[ids] + self.b[prev] + self.c[:ids.shape[0]]


def other(tok: int, vocab: int) -> int:
    return (tok + 1) % vocab


def turn2_prompts(seen: list[int], bonus: int, vocab: int, g) -> dict[str, list[int]]:
    """Turn-2 prompts by their common prefix with the row's cached tokens ``seen`` (positions < b; ``bonus`` at b)."""
    b = len(seen)
    tail = torch.randint(0, vocab, (7,), generator=g).tolist()
    cut = lambda c: seen[:c] + [other(seen[c], vocab)] + tail  # noqa: E731  (common prefix exactly c)
    return {"keep0": cut(0), "keep1": cut(1), "keep2": cut(2), "mid10": cut(10), "b-6": cut(b - 6), "b-5": cut(b - 5),
            "b-4": cut(b - 4), "b-3": cut(b - 3), "b-2": cut(b - 2), "b-1": cut(b - 1),
            "whole+bonus": seen + [bonus] + tail,  # the usual next turn: turn 1's prompt, its answer, a new question
            "whole+other": seen + [other(bonus, vocab)] + tail,
            "prefix20": seen[:20], "prefix-whole": list(seen), "prefix2": seen[:2]}  # prompts the cache holds whole


def assert_same_held(a, b, row: int, below: int, slot_pos_a, slot_pos_b, windows) -> None:
    """Every key position < ``below`` that a later query can read (a window layer: > below - W, the first query
    sitting at ``below``) is held by both, with the same keys/values."""
    for pa, pb, ka, kb, va, vb, w in zip(slot_pos_a, slot_pos_b, a.k, b.k, a.v, b.v, windows):
        ha, hb = pa[row], pb[row]
        low = 0 if w is None else max(0, below - w + 1)
        sa = ((ha >= low) & (ha < below)).nonzero()[:, 0]
        sb = ((hb >= low) & (hb < below)).nonzero()[:, 0]
        sa, sb = sa[ha[sa].argsort()], sb[hb[sb].argsort()]
        assert ha[sa].tolist() == hb[sb].tolist()
        torch.testing.assert_close(ka[row, :, sa], kb[row, :, sb], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(va[row, :, sa], vb[row, :, sb], rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------------------- EAGLE-3

def eagle3_turn_one(drafter, feats, vocab, idle: int, g):
    k = drafter.steps
    drafter.allocate(CAP, batch=2)
    prompt = torch.randint(0, vocab, (14,), generator=g).tolist()
    filler = torch.randint(0, vocab, (9,), generator=g).tolist()
    drafter.prefill(feats(filler), 0, filler, row=1 - ROW)
    drafter.prefill(feats(prompt), 0, prompt, row=ROW)
    seq, token = list(prompt), int(torch.randint(0, vocab, (), generator=g))
    tokens, positions = torch.tensor([3, token]), torch.tensor([len(filler), len(seq)])

    def step(features_for_row):
        drafts = drafter.draft_chain(tokens, positions)[0]
        ids = torch.cat([tokens[:, None], drafts], dim=1)
        f = torch.randn(2, k + 1, drafter.model.fc.in_features, generator=g)
        f[ROW] = features_for_row(ids[ROW].tolist())
        drafter.append(f, positions.clone(), ids)
        return drafts[ROW].tolist()

    for acc in ACCEPTED:
        pos = len(seq)
        drafts = step(lambda block: feats(seq + block)[pos:pos + k + 1])
        seq += [token] + drafts[:acc]
        token = other(drafts[acc], vocab) if acc < k else int(torch.randint(0, vocab, (), generator=g))
        tokens[ROW], positions[ROW] = token, len(seq)
        tokens[1 - ROW], positions[1 - ROW] = 5, positions[1 - ROW] + 1
    for i in range(idle):  # the finished row waits: it steps at its parked position, its newest token first, then garbage
        b = len(seq)
        step(lambda block: feats(seq + block)[b:b + k + 1])
        tokens[ROW] = int(torch.randint(0, vocab, (), generator=g))
        positions[1 - ROW] += 1
    return seq, token


def eagle3_continue(drafters, feats, vocab, prompt, first, g) -> None:
    """Turn 2's steps on the resumed and the fresh drafter: the same logits and drafts each step."""
    k = drafters[0].steps
    seq, token = list(prompt), first
    for acc in TURN2_ACCEPTED:
        tokens, positions = torch.tensor([0, token]), torch.tensor([0, len(seq)])
        got = [d.draft_chain(tokens, positions) for d in drafters]
        torch.testing.assert_close(got[0][1][ROW], got[1][1][ROW], rtol=1e-5, atol=1e-5)
        assert torch.equal(got[0][0][ROW], got[1][0][ROW])
        drafts = got[1][0][ROW].tolist()
        ids = torch.tensor([[0] * (k + 1), [token] + drafts])
        f = torch.zeros(2, k + 1, drafters[0].model.fc.in_features)
        f[ROW] = feats(seq + ids[ROW].tolist())[len(seq):len(seq) + k + 1]
        for d in drafters:
            d.append(f, positions, ids)
        seq += [token] + drafts[:acc]
        token = other(drafts[acc], vocab) if acc < k else int(torch.randint(0, vocab, (), generator=g))


@pytest.mark.parametrize("idle", [0, 2])
@pytest.mark.parametrize("window", ["trained", None, 2, 1])
@pytest.mark.parametrize("shape", sorted(eagle_tests.SHAPES))
def test_eagle3_next_turn_after_kept_prefix_equals_a_fresh_prefill(shape, window, idle) -> None:
    model = eagle_tests.tiny(shape)
    vocab, feats = eagle_tests.VOCAB, Features(eagle_tests.VOCAB, model.fc.in_features)
    g = torch.Generator().manual_seed(5)
    probe = StaticEagle3Drafter(model, window=window)
    seen, bonus = eagle3_turn_one(probe, feats, vocab, idle, torch.Generator().manual_seed(1))
    report = {}
    cases = [(name, prompt, whole) for name, prompt in turn2_prompts(seen, bonus, vocab, g).items() for whole in (False, True)]
    for name, prompt, whole in cases:
        kept = StaticEagle3Drafter(model, window=window)
        eagle3_turn_one(kept, feats, vocab, idle, torch.Generator().manual_seed(1))  # the same turn 1
        pending = int(kept.pending_start[ROW])
        # infer.batch's skip (capped at len - 1), or the whole common prefix (<= len: a prompt the row holds whole)
        keep = common_prefix(seen, prompt) if whole else min(common_prefix(seen, prompt), len(prompt) - 1)
        start = kept.kept_prefix(ROW, keep, len(prompt))
        assert 0 <= start <= min(keep, len(prompt) - 1)
        kept.prefill(feats(prompt)[start:], start, prompt[start:], row=ROW)
        fresh = StaticEagle3Drafter(model, window=window)
        fresh.allocate(CAP, batch=2)
        fresh.prefill(feats(prompt), 0, prompt, row=ROW)
        n = len(prompt)
        assert_same_held(kept, fresh, ROW, n, kept.slot_pos, fresh.slot_pos, kept.windows)
        assert int(kept.pending_start[ROW]) == int(fresh.pending_start[ROW]) == n - 1
        torch.testing.assert_close(kept.pending_features[ROW, 0], fresh.pending_features[ROW, 0], rtol=0, atol=0)
        assert int(kept.pending_ids[ROW, 0]) == int(fresh.pending_ids[ROW, 0])
        eagle3_continue([kept, fresh], feats, vocab, prompt, other(prompt[-1], vocab), g)
        report[name + (' whole' if whole else '')] = (keep, pending, start)
    print(shape, window, idle, "b =", len(seen), report)


# ----------------------------------------------------------------------------------------------------- DFlash

def dflash_turn_one(drafter, feats, vocab, idle: int, g):
    block = drafter.block_size
    drafter.allocate(CAP, batch=2)
    prompt = torch.randint(2, vocab, (14,), generator=g).tolist()
    drafter.append(torch.randn(1, 9, 64, generator=g), torch.tensor([0]), row=1 - ROW)
    drafter.append(feats(prompt)[None], torch.tensor([0]), row=ROW)
    seq, token = list(prompt), int(torch.randint(2, vocab, (), generator=g))
    tokens, anchors = torch.tensor([3, token]), torch.tensor([9, len(seq)])

    def step(features_for_row):
        drafts = drafter.block_logits(tokens, anchors)[1]
        f = torch.randn(2, block, 64, generator=g)
        f[ROW] = features_for_row([int(tokens[ROW])] + drafts[ROW].tolist())
        drafter.append(f, anchors.clone())
        return drafts[ROW].tolist()

    for acc in ACCEPTED:
        pos = len(seq)
        drafts = step(lambda blk: feats(seq + blk)[pos:pos + block])
        seq += [token] + drafts[:acc]
        token = other(drafts[acc], vocab) if acc < block - 1 else int(torch.randint(2, vocab, (), generator=g))
        tokens[ROW], anchors[ROW] = token, len(seq)
        anchors[1 - ROW] += 1
    for i in range(idle):
        b = len(seq)
        step(lambda blk: feats(seq + blk)[b:b + block])
        tokens[ROW] = int(torch.randint(2, vocab, (), generator=g))
        anchors[1 - ROW] += 1
    return seq, token


@pytest.mark.parametrize("idle", [0, 2])
@pytest.mark.parametrize("window", ["trained", None, 2])
@pytest.mark.parametrize("shape", sorted(dflash_tests.SHAPES))
def test_dflash_next_turn_after_kept_prefix_equals_a_fresh_prefill(shape, window, idle) -> None:
    model, embed, head = dflash_tests.tiny(shape)
    vocab, feats = 64, Features(64, 64)
    g = torch.Generator().manual_seed(5)
    make = lambda: StaticDFlashDrafter(model, embed, head, window=window)  # noqa: E731
    seen, bonus = dflash_turn_one(make(), feats, vocab, idle, torch.Generator().manual_seed(1))
    report = {}
    for name, prompt in turn2_prompts(seen, bonus, vocab, g).items():
        kept = make()
        dflash_turn_one(kept, feats, vocab, idle, torch.Generator().manual_seed(1))
        keep = min(common_prefix(seen, prompt), len(prompt) - 1)
        start = kept.kept_prefix(ROW, keep, len(prompt))
        assert start in (0, keep)
        kept.append(feats(prompt)[start:][None], torch.tensor([start]), row=ROW)
        fresh = make()
        fresh.allocate(CAP, batch=2)
        fresh.append(feats(prompt)[None], torch.tensor([0]), row=ROW)
        n = len(prompt)
        assert_same_held(kept, fresh, ROW, n, [kept.slot_pos[r] for r in kept.rules], [fresh.slot_pos[r] for r in fresh.rules],
                         [r.window for r in kept.rules])
        seq, token = list(prompt), other(prompt[-1], vocab)
        for acc in TURN2_ACCEPTED:
            tokens, anchors = torch.tensor([2, token]), torch.tensor([0, len(seq)])
            got = [d.block_logits(tokens, anchors) for d in (kept, fresh)]
            torch.testing.assert_close(got[0][0][ROW], got[1][0][ROW], rtol=1e-5, atol=1e-5)
            assert torch.equal(got[0][1][ROW], got[1][1][ROW])
            drafts = got[1][1][ROW].tolist()
            f = torch.zeros(2, kept.block_size, 64)
            f[ROW] = feats(seq + [token] + drafts)[len(seq):len(seq) + kept.block_size]
            for d in (kept, fresh):
                d.append(f, anchors.clone())
            seq += [token] + drafts[:acc]
            token = other(drafts[acc], vocab) if acc < kept.block_size - 1 else 7
        report[name] = (keep, start)
    print(shape, window, idle, "b =", len(seen), report)


def test_dflash_ring_check_reads_the_first_blocks_window_exactly() -> None:
    """Perf, not correctness: the first block (anchor = length) reads positions > length - W, so a kept prefix whose
    ring lost position length - W alone is still whole (turn 1 ran 28 positions, window 2: a 20-token prompt of
    cached tokens reads nothing below its own re-appended position 19)."""
    model, embed, head = dflash_tests.tiny("sliding+full")
    feats = Features(64, 64)
    d = StaticDFlashDrafter(model, embed, head, window=2)
    seen, _ = dflash_turn_one(d, feats, 64, 0, torch.Generator().manual_seed(1))
    assert d.kept_prefix(ROW, 19, 20) == 19  # was 0 (it asked for position 18 too)


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_a_prompt_the_caches_hold_whole_equals_a_fresh_run(reference_target_path, kind) -> None:
    """Batch 1 (``generate(cached_ids=...)``) with a prompt the row's caches hold whole (the same prompt again, and the
    prompt plus 5 tokens of its reply): the tokens and accepted counts of a fresh target and drafter, with n - 1 of the
    prompt's positions reused (EAGLE-3 reused n - 2)."""
    from infer.generate import generate
    from infer_helpers import random_dflash_on_reference, random_eagle3_on_reference

    def make():
        if kind == "eagle3":
            _, target, drafter_model, prompt = random_eagle3_on_reference(reference_target_path)
            return target, StaticEagle3Drafter(drafter_model, window=None), prompt  # full layers: no ring to lose
        _, target, drafter_model, embed, head, prompt = random_dflash_on_reference(reference_target_path)
        return target, StaticDFlashDrafter(drafter_model, embed, head, window=None), prompt

    target, drafter, prompt = make()
    first = generate(target, drafter, prompt, 12)
    for again in (prompt, first.cache_ids[:len(prompt) + 5]):
        generate(target, drafter, prompt, 12)  # the caches hold turn 1 again
        got = generate(target, drafter, again, 12, cached_ids=first.cache_ids)
        fresh_target, fresh, _ = make()
        want = generate(fresh_target, fresh, again, 12)
        assert (got.tokens, got.stats.accepted_per_step) == (want.tokens, want.stats.accepted_per_step)
        assert got.stats.reused_tokens == len(again) - 1
