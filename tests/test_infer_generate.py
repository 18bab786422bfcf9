"""The speculative loop (``infer/generate.py``, and ``infer/batch.py`` for DFlash trees) is lossless.

References, independent of the loop: Hugging Face ``generate`` (greedy) and the cache-free oracle
``infer/reference.py`` (same accepted counts step by step); at temperature > 0, ``test_infer_sampling.py``.
"""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from models.dflash import DFlashDraftModel, DFlashDrafter, StaticDFlashDrafter
from infer.batch import generate_batch
from infer.generate import generate
from infer.prompts import long_prompt_ids, mt_bench_questions
from infer.reference import reference_speculative_greedy
from models.sampling import SamplingConfig
from models.static_target import StaticTarget
from infer_helpers import PartlyScripted, memorised_dflash_drafter

LAYERS = [1, 3, 5]
WINDOWS = [None, 512, 2048]  # inference-time window: none = full attention

pytestmark = [pytest.mark.usefixtures("single_cpu_thread"), pytest.mark.slow]


@pytest.fixture(scope="module")
def setup(reference_target_path, run_shared_dir):
    model = AutoModelForCausalLM.from_pretrained(reference_target_path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(reference_target_path)
    questions = [q["turns"][0] for q in mt_bench_questions()[:20]]
    drafter = memorised_dflash_drafter(model, tokenizer, run_shared_dir)  # it memorised questions[:2], reads LAYERS
    return model, tokenizer, questions, drafter, StaticTarget(model, LAYERS)


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    return model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()


@pytest.mark.parametrize("window", ["trained", None, 4])
def test_matches_cache_free_oracle_step_by_step(setup, window) -> None:
    model, tokenizer, questions, drafter_model, target = setup
    drafter = DFlashDrafter(drafter_model, model.get_input_embeddings(), model.get_output_embeddings(), window=window)
    total_accepted = 0
    for question in questions[:3]:  # two memorised, one not
        prompt = long_prompt_ids(tokenizer, question)
        got = generate(target, drafter, prompt, max_new_tokens=40)
        want, accepted = reference_speculative_greedy(model, drafter_model, prompt, 40, window=window)
        assert got.tokens == want
        assert got.stats.accepted_per_step == accepted
        total_accepted += sum(accepted)
    # the drafter really is accepted, so multi-token steps are exercised (less so under a window it was not trained with)
    assert total_accepted > (20 if window == "trained" else 0)


def check_lossless(setup, prefill: int, questions: list[str], autoregressive: bool = True) -> Counter:
    model, tokenizer, _, drafter_model, target = setup
    histogram = Counter()
    for i, question in enumerate(questions):
        prompt = long_prompt_ids(tokenizer, question, prefill, offset=997 * i)
        want = hf_greedy(model, prompt, 16)
        if autoregressive:
            assert generate(target, None, prompt, max_new_tokens=16).tokens == want, f"baseline, prompt {i}"
        for window in WINDOWS:
            drafter = DFlashDrafter(drafter_model, model.get_input_embeddings(), model.get_output_embeddings(), window=window)
            scripted = PartlyScripted(drafter, want, len(prompt), p_script=0.7, seed=i)
            got = generate(target, scripted, prompt, max_new_tokens=16, prefill_chunk=1536)
            assert got.tokens == want, f"prompt {i}, prefill {prefill}, window {window}"
            histogram.update(got.stats.accepted_per_step)
    return histogram


# 4,096 tokens, not 8,192, in the default suite: the longest case is the one where every window binds (2,048 included: the
# drafter's ring of 2,048 slots wraps, the 1,536-token prefill chunks cross its end) at a third of 8,192's CPU time
# (attention grows with the square); 8,192 stays in the full matrix (``-m long``)
@pytest.mark.parametrize("prefill,num_prompts", [(0, 20), (2048, 2), (4096, 1)])
def test_greedy_lossless_behind_long_prefills(setup, prefill, num_prompts) -> None:
    """Spec == HF generate for every window; the full 20-prompt matrix is ``-m long`` below."""
    _, _, questions, _, _ = setup
    histogram = check_lossless(setup, prefill, questions[:num_prompts], autoregressive=prefill <= 2048)
    assert histogram[0] > 0 and max(histogram) >= 3  # rejections and multi-token accepted runs both happened


@pytest.mark.long
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("prefill", [2048, 8192])
def test_greedy_lossless_full_matrix(setup, prefill) -> None:
    _, _, questions, _, _ = setup
    check_lossless(setup, prefill, questions, autoregressive=prefill < 8192)


def test_end_of_sequence_inside_a_block_and_budget(setup) -> None:
    model, tokenizer, questions, drafter_model, target = setup
    prompt = long_prompt_ids(tokenizer, questions[5])
    want = hf_greedy(model, prompt, 40)
    drafter = DFlashDrafter(drafter_model, model.get_input_embeddings(), model.get_output_embeddings())
    whole_blocks = PartlyScripted(drafter, want, len(prompt), p_script=1.0)
    got = generate(target, whole_blocks, prompt, max_new_tokens=11)
    # 1 + 8 tokens, then a whole accepted block of which the budget keeps 2: only what is kept counts as accepted
    assert got.tokens == want[:11] and got.stats.accepted_per_step == [7, 1]
    assert 1 + sum(a + 1 for a in got.stats.accepted_per_step) == len(got.tokens)
    eos = want[9]
    got = generate(target, PartlyScripted(drafter, want, len(prompt), p_script=1.0), prompt, max_new_tokens=40, eos_token_ids=[eos])
    assert got.tokens == want[:want.index(eos) + 1]
    assert 1 + sum(a + 1 for a in got.stats.accepted_per_step) == len(got.tokens)  # no step after the end, none past it counted


def test_bad_inputs(setup) -> None:
    model, _, _, drafter_model, target = setup
    drafter = DFlashDrafter(drafter_model, model.get_input_embeddings(), model.get_output_embeddings())
    with pytest.raises(ValueError, match="prompt is empty"):
        generate(target, drafter, [], max_new_tokens=4)
    with pytest.raises(ValueError, match=r"drafter reads target layers \[1, 3, 5\], the target captures \[2\]"):
        generate(StaticTarget(model, [2]), drafter, [5, 6], max_new_tokens=4)
    # the same layers in another order: the features are concatenated in the target's order, so the drafter would read
    # its layers swapped (compared as sets before, it drafted from them)
    with pytest.raises(ValueError, match=r"drafter reads target layers \[1, 3, 5\], the target captures \[5, 3, 1\] \(in that order\)"):
        generate(StaticTarget(model, [5, 3, 1]), drafter, [5, 6], max_new_tokens=4)
    with pytest.raises(ValueError, match="top_p=0"):
        SamplingConfig(temperature=1.0, top_p=0)


TREE = {"tree_topk": 4, "tree_tokens": 24}


@pytest.mark.parametrize("window,lookup,redraft", [("trained", 0, 0), (None, 7, 0), ("trained", 0, 2)])
def test_dflash_trees_are_lossless_and_batched_rows_equal_batch_one(setup, window, lookup, redraft) -> None:
    """Trees over the block's marginals (``models.dflash.block_tree``; with prompt lookup's branch: ``lookup``; with
    re-drafted depths: ``redraft``): batch 1 (the eager drafter's trees) gives Hugging Face's greedy tokens; three rows
    in flight over four prompts (one row refilled) give each prompt the batch-1 tokens and accepted counts."""
    model, tokenizer, questions, drafter_model, target = setup
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    prompts = [long_prompt_ids(tokenizer, q) for q in questions[:4]]
    opts = dict(window=window, **TREE, tree_lookup=lookup, tree_redraft=redraft)
    want = [generate(target, DFlashDrafter(drafter_model, embed, head, **opts), p, max_new_tokens=40) for p in prompts]
    got = generate_batch(target, StaticDFlashDrafter(drafter_model, embed, head, **opts), prompts, 40, batch_size=3)
    for i, (w, g) in enumerate(zip(want, got)):
        assert w.tokens == hf_greedy(model, prompts[i], 40), i
        assert g.tokens == w.tokens, i
        assert g.stats.accepted_per_step == w.stats.accepted_per_step, i
    accepted = [a for g in got for a in g.stats.accepted_per_step]
    assert max(accepted) >= 4 and 0 in accepted, accepted


@pytest.mark.parametrize("first", [1, 3])
def test_a_staged_verify_gives_the_one_pass_tokens_and_counts(setup, first, monkeypatch) -> None:
    """Greedy DFlash chains verified in two passes (the CPU's default, ``infer.generate.staged_verify``): the first
    ``first`` drafts of every row, then the rest for the rows whose checked drafts all matched. Batch 1 and three rows
    in flight over four prompts (two memorised, two not) give the one-pass loop's tokens (Hugging Face's greedy ones)
    and accepted counts; second passes ran on some steps and not on others, and batched, some ran for part of the rows
    only (the others one token each)."""
    model, tokenizer, questions, drafter_model, target = setup
    drafter = StaticDFlashDrafter(drafter_model, model.get_input_embeddings(), model.get_output_embeddings())
    k = drafter.block_size - 1
    prompts = [long_prompt_ids(tokenizer, q) for q in questions[:4]]
    want = [generate(target, drafter, p, 40, verify_first=None) for p in prompts]
    assert [w.tokens for w in want] == [hf_greedy(model, p, 40) for p in prompts]
    passes, step = [], target.step
    monkeypatch.setattr(target, "step", lambda ids, pos, lengths=None:
                        passes.append((ids.shape[1], None if lengths is None else lengths.tolist())) or step(ids, pos, lengths))
    one = [generate(target, drafter, p, 40, verify_first=first) for p in prompts]
    alone, passes[:] = list(passes), []
    batched = generate_batch(target, drafter, prompts, 40, batch_size=3, verify_first=first)
    for got in (one, batched):
        assert [(g.tokens, g.stats.accepted_per_step) for g in got] == [(w.tokens, w.stats.accepted_per_step) for w in want]
    for seen in (alone, passes):
        checks, rests = [p for p in seen if p[0] == first], [p for p in seen if p[0] == k + 1 - first]
        assert len(checks) + len(rests) == len(seen) and 0 < len(rests) < len(checks), seen
    assert any(1 in lengths and k + 1 - first in lengths for _, lengths in passes if lengths), passes
    with pytest.raises(ValueError, match="verify_first=2: a staged verify checks >= 1 drafts of a greedy chain"):
        generate(target, drafter, prompts[0], 8, SamplingConfig(temperature=0.8), verify_first=2)


def block_causal_copy(drafter_model: DFlashDraftModel) -> DFlashDraftModel:
    """The memorised drafter's weights with every layer sliding (its full layer, bidirectional inside the block, made
    causal there): a block-causal drafter, as the recipes' are, that still accepts whole blocks on the memorised prompts."""
    config = copy.deepcopy(drafter_model.config)
    config.layer_types = ["sliding_attention"] * len(config.layer_types)
    causal = DFlashDraftModel(config)
    causal.load_state_dict(drafter_model.state_dict())
    return causal.eval().requires_grad_(False)


def test_drafting_in_stages_gives_the_one_pass_drafts_tokens_and_counts(setup, monkeypatch) -> None:
    """A block-causal DFlash drafter under a staged verify drafts the checked slots first and the rest of the block only
    for the rows whose checked drafts all matched (``StaticDFlashDrafter.first_drafts`` / ``rest_drafts``, through
    ``staged_verify``'s drafter). Directly: the two stages draft what one block pass does (greedy ids; logits to
    float rounding), for a subset of rows too. In the loop: batch 1 and three rows in flight over four prompts (two
    memorised, two not) give the one-pass loop's tokens (Hugging Face's greedy ones) and accepted counts, with the rest
    drafted on some steps only, batched for part of the rows. A drafter with a bidirectional layer is not staged."""
    model, tokenizer, questions, drafter_model, target = setup
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    drafter = StaticDFlashDrafter(block_causal_copy(drafter_model), embed, head)
    assert drafter.drafts_in_stages
    assert not StaticDFlashDrafter(drafter_model, embed, head).drafts_in_stages  # its full layer sees later slots
    with pytest.raises(ValueError, match="first_drafts"):
        StaticDFlashDrafter(drafter_model, embed, head).first_drafts(torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long), 3)
    k, first = drafter.drafts, 3

    torch.manual_seed(0)  # a context of 40 positions of arbitrary features in 3 rows, blocks at different anchors
    drafter.allocate(128, 3)
    for start in range(0, 40, 8):
        drafter.append(0.1 * torch.randn(3, 8, drafter.model.fc.in_features), torch.full((3,), start))
    token, anchor = torch.tensor([11, 12, 13]), torch.tensor([40, 37, 33])
    block_logits, greedy = (t.clone() for t in drafter.block_logits(token, anchor))
    assert torch.equal(drafter.first_drafts(token, anchor, first), greedy[:, :first])
    rows = torch.tensor([0, 2])
    assert torch.equal(drafter.rest_drafts(anchor[rows], rows, first), greedy[rows, first:])
    torch.testing.assert_close(drafter._rest_of_block(anchor[rows], rows, first), block_logits[rows, first:], rtol=1e-4, atol=1e-4)
    trimmed = StaticDFlashDrafter(drafter.model, embed, head, draft_tokens=k - 1)  # a chain of k - 1 drafts: its pass stops short
    trimmed.allocate(128, 3)
    for start in range(0, 40, 8):
        trimmed.append(0.1 * torch.randn(3, 8, drafter.model.fc.in_features), torch.full((3,), start))
    greedy = trimmed.block_logits(token, anchor)[1].clone()
    assert greedy.shape[1] == k - 1 and torch.equal(trimmed.first_drafts(token, anchor, first), greedy[:, :first])
    assert torch.equal(trimmed.rest_drafts(anchor[rows], rows, first), greedy[rows, first:])

    prompts = [long_prompt_ids(tokenizer, q) for q in questions[:4]]
    want = [generate(target, drafter, p, 40, verify_first=None) for p in prompts]
    assert [w.tokens for w in want] == [hf_greedy(model, p, 40) for p in prompts]
    rests, rest_drafts = [], drafter.rest_drafts
    monkeypatch.setattr(drafter, "rest_drafts", lambda anchor, rows, first: rests.append(len(rows)) or rest_drafts(anchor, rows, first))
    one = [generate(target, drafter, p, 40, verify_first=first) for p in prompts]
    alone, rests[:] = list(rests), []
    batched = generate_batch(target, drafter, prompts, 40, batch_size=3, verify_first=first)
    for got in (one, batched):
        assert [(g.tokens, g.stats.accepted_per_step) for g in got] == [(w.tokens, w.stats.accepted_per_step) for w in want]
    steps = sum(len(w.stats.accepted_per_step) for w in want)
    assert 0 < len(alone) < steps and set(alone) == {1}, alone
    assert rests and min(rests) < 3 and sum(a >= first for w in want for a in w.stats.accepted_per_step) > 0, rests
    assert any(0 < a < k for w in want for a in w.stats.accepted_per_step)  # partly accepted blocks too
    assert generate(target, drafter, prompts[0], 16, verify_first=k).tokens == want[0].tokens[:16]  # nothing to stage: one pass


def test_a_dflash_tree_accepts_more_than_the_block(setup) -> None:
    """The drafter's own proposals on two memorised prompts and two new ones: a 24-node tree accepts more per step than
    the block's greedy chain, and both give the target's greedy tokens."""
    model, tokenizer, questions, drafter_model, target = setup
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    prompts = [long_prompt_ids(tokenizer, q) for q in questions[:4]]
    taus = {}
    for mode, kwargs in [("block", {}), ("tree", TREE)]:
        got = generate_batch(target, StaticDFlashDrafter(drafter_model, embed, head, **kwargs), prompts, 48, batch_size=4)
        for i, g in enumerate(got):
            assert g.tokens == hf_greedy(model, prompts[i], 48), (mode, i)
        steps = [a for g in got for a in g.stats.accepted_per_step]
        taus[mode] = sum(a + 1 for a in steps) / len(steps)
    assert taus["block"] > 1.2 and taus["tree"] > taus["block"], taus
