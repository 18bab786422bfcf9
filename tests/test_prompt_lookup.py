"""Prompt lookup (``infer/prompt_lookup.py``) against a plain reference: its proposals element by element (only what it
found, 0 .. k tokens, like vLLM's ngram proposer), and the batch-1 loop verifying only the real drafts + 1."""

from __future__ import annotations

import random

import pytest
import torch

from infer.prompt_lookup import PromptLookupDrafter
from models.sampling import SamplingConfig

pytestmark = pytest.mark.usefixtures("single_cpu_thread")


def reference_proposal(sequence: list[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """Another formulation: every earlier end e of a match scores the common suffix of ``sequence[:e+1]`` and
    ``sequence`` (capped at ``max_ngram``); the highest score wins, the latest e breaks ties; what follows e is proposed."""
    best = (0, -1)
    for e in range(len(sequence) - 1):  # e = len - 1 is the suffix itself
        n = 0
        while n < min(max_ngram, e + 1) and sequence[e - n] == sequence[len(sequence) - 1 - n]:
            n += 1
        best = max(best, (n, e))
    n, e = best
    return sequence[e + 1:e + 1 + k] if n >= min_ngram else []


def random_case(rng: random.Random, shortest: int, longest: int) -> tuple[PromptLookupDrafter, list[int]]:
    """A drafter of random k (1-8) and n-gram sizes (1-4) and a sequence of ``shortest`` .. ``longest`` tokens from a
    small vocabulary (3, 6 or 20 ids: many repeats)."""
    k, max_ngram = rng.randint(1, 8), rng.randint(1, 4)
    min_ngram = rng.randint(1, max_ngram)
    sequence = [rng.randint(0, rng.choice([3, 6, 20])) for _ in range(rng.randint(shortest, longest))]
    return PromptLookupDrafter(num_draft_tokens=k, max_ngram=max_ngram, min_ngram=min_ngram), sequence


def test_proposals_equal_a_plain_reference() -> None:
    rng = random.Random(0)
    lengths = set()
    for trial in range(3000):
        drafter, sequence = random_case(rng, 1, 30)
        k, max_ngram, min_ngram = drafter.num_draft_tokens, drafter.max_ngram, drafter.min_ngram
        got, want = drafter.propose(sequence), reference_proposal(sequence, k, max_ngram, min_ngram)
        assert got == want, (sequence, k, max_ngram, min_ngram)
        lengths.add((len(got), k))
    assert {(0, 5), (2, 5), (5, 5)} <= lengths  # no match, a match near the end, a full proposal


def test_drafts_from_the_growing_index_equal_the_reference_at_every_step() -> None:
    """``draft`` reads ``NgramIndex`` (the context's n-grams by their latest end) instead of scanning the sequence: a
    context arriving in chunks of 1-5 tokens, as the loop appends accepted tokens, with a draft after every chunk; each
    step's drafts equal the plain reference's for the context plus the token about to be verified."""
    rng = random.Random(1)
    seen = set()
    drafters = {}  # one drafter a setting, reused over the sequences: ``reset`` must forget the sequence before
    for trial in range(1500):
        fresh, sequence = random_case(rng, 2, 40)
        k, max_ngram, min_ngram = fresh.num_draft_tokens, fresh.max_ngram, fresh.min_ngram
        drafter = drafters.setdefault((k, max_ngram, min_ngram, fresh.vocab_size), fresh)
        drafter.reset(64)
        pos = 0
        while True:
            chunk = sequence[pos:pos + rng.randint(1, 5)]
            drafter.append_context(None, pos, torch.tensor(chunk))
            pos += len(chunk)
            if pos >= len(sequence):
                break
            got = drafter.draft(torch.tensor(sequence[pos]), pos, SamplingConfig(), torch.Generator())[0].tolist()
            want = reference_proposal(sequence[:pos + 1], k, max_ngram, min_ngram)
            assert got == want, (sequence[:pos + 1], k, max_ngram, min_ngram)
            seen.add((len(got) == k, len(got) == 0, bool(got) and got[-1] == sequence[pos] and len(got) < k))
    assert len(seen) == 3  # full proposals, none, and short ones ending with the token being verified


def test_the_trees_growing_lookup_equals_the_reference_at_every_step() -> None:
    """``GrowingLookup`` (the trees' lookup branch over a generation's prompt and output): the output grows by 1-5
    tokens a step, the index catching up; every step's chain equals the plain reference's over prompt + output, including
    the first step (an output of one token) and prompts of one token."""
    from infer.prompt_lookup import GrowingLookup

    rng = random.Random(2)
    for trial in range(800):
        k = rng.randint(1, 8)
        vocab = rng.choice([3, 6, 20])
        prompt = [rng.randint(0, vocab) for _ in range(rng.randint(1, 25))]
        out = [rng.randint(0, vocab)]
        lookup = GrowingLookup()
        for _ in range(rng.randint(1, 8)):
            assert lookup(prompt, out, k) == reference_proposal(prompt + out, k, 3, 1), (prompt, out, k)
            out += [rng.randint(0, vocab) for _ in range(rng.randint(1, 5))]


def test_draft_gives_the_real_proposal_and_one_hot_rows_for_it() -> None:
    drafter = PromptLookupDrafter(num_draft_tokens=4, vocab_size=10)
    from models.sampling import SamplingConfig

    drafter.append_context(None, 0, torch.tensor([3, 1, 2]))
    tokens, probs = drafter.draft(torch.tensor(3), 3, SamplingConfig(temperature=1.0), torch.Generator())
    assert tokens.tolist() == [1, 2, 3] and probs.shape == (3, 10) and probs.argmax(-1).tolist() == [1, 2, 3]
    tokens, probs = drafter.draft(torch.tensor(7), 3, SamplingConfig(temperature=1.0), torch.Generator())
    assert tokens.shape == (0,) and probs.shape == (0, 10)


def test_the_loop_verifies_only_the_real_drafts_and_keeps_the_target_alones_tokens(reference_target_path, reference_tokenizer) -> None:
    """Batch 1 on the CPU (uncaptured): each step's block is the last token + the reference's proposal for the sequence so
    far (1 token when nothing matched), a step accepts at most its real drafts, and greedy output is the target alone's."""
    from transformers import AutoModelForCausalLM

    from infer.generate import generate
    from models.static_target import StaticTarget

    model = AutoModelForCausalLM.from_pretrained(reference_target_path, dtype=torch.float32).eval()
    target = StaticTarget(model, [])
    eos = [reference_tokenizer.convert_tokens_to_ids("<|im_end|>")]
    ids = reference_tokenizer.apply_chat_template([{"role": "user", "content": "List the days of the week, twice."}],
                                                  add_generation_prompt=True, tokenize=True)
    prompt = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    blocks, forward, greedy_forward = [], target.forward, target.greedy_forward  # greedy: the verify and its acceptance
    target.forward = lambda input_ids, start, *a, **kw: blocks.append((input_ids.tolist(), start)) or forward(input_ids, start, *a, **kw)
    target.greedy_forward = lambda input_ids, start, *a: blocks.append((input_ids.tolist(), start)) or greedy_forward(input_ids, start, *a)
    run = generate(target, PromptLookupDrafter(num_draft_tokens=5), prompt, 64, eos_token_ids=eos)
    del target.forward, target.greedy_forward
    full = prompt + run.tokens
    steps = [(block, start) for block, start in blocks if start >= len(prompt)]
    assert len(steps) == run.stats.steps
    real = []
    for (block, start), accepted in zip(steps, run.stats.accepted_per_step):
        proposal = reference_proposal(full[:start + 1], 5, 3, 1)
        assert block == [full[start]] + proposal
        assert accepted <= len(proposal)
        real.append(len(proposal))
    assert min(real) == 0 and max(real) == 5 and any(0 < r < 5 for r in real)
    assert run.tokens == generate(target, None, prompt, 64, eos_token_ids=eos).tokens
    # the steps that proposed nothing are counted (τ over the steps with drafts, vLLM's count, comes from it), batched too
    assert run.stats.steps_without_drafts == real.count(0)
    from benchmarks.pld_drafting_steps import replay  # the replay of saved records: the run's steps from its tokens alone

    assert replay(prompt, run.tokens, 5) == list(zip(run.stats.accepted_per_step, real))
    from infer.batch import generate_batch

    other = list(reference_tokenizer.apply_chat_template([{"role": "user", "content": "Name three colours."}],
                                                         add_generation_prompt=True, tokenize=True, return_dict=False))
    batched = generate_batch(target, PromptLookupDrafter(num_draft_tokens=5), [other, prompt], 64, batch_size=2, eos_token_ids=eos)
    assert batched[1].stats.steps_without_drafts == real.count(0)
    alone = generate(target, PromptLookupDrafter(num_draft_tokens=5), other, 64, eos_token_ids=eos)
    assert batched[0].stats.steps_without_drafts == alone.stats.steps_without_drafts


def test_tau_over_the_steps_with_drafts_leaves_out_the_steps_without_any() -> None:
    """vLLM's counters count a step without drafts as no draft: its mean acceptance length is over the others. Two turns,
    steps accepted [0, 3, 0, 2] with 2 of them draftless and [1, 0] with none: τ 2.0 over all six steps, 2.5 over the
    four with drafts ((4 + 3 + 2 + 1) / 4 = 2.5); the eval's report says both."""
    from eval.report import summary_table
    from eval.runner import summarize

    def record(accepted, without):
        stats = {"accepted_per_step": accepted, "steps_without_drafts": without, "block_size": 4, "new_tokens": 9, "prefill_s": 0.0,
                 "decode_s": 1.0, "draft_s": 0.0, "verify_s": 1.0, "other_s": 0.0}
        return {"id": "1", "category": "writing", "turn": 1, "prompt_tokens": 5, "stats": stats}

    summary = summarize([record([0, 3, 0, 2], 2), record([1, 0], 0)])
    assert summary["tau"] == pytest.approx(2.0) and summary["tau_drafting_steps"] == pytest.approx(2.5)
    assert summary["steps_without_drafts"] == 2
    text = summary_table(summary, "pld")
    assert "proposed no draft in 2 of its 6 steps" in text and "its τ is 2.500" in text
    old = record([1, 0], 0)  # a turn saved before the count existed (a resumed cell): neither number is known
    del old["stats"]["steps_without_drafts"]
    resumed = summarize([record([0, 3, 0, 2], 2), old])
    assert resumed["steps_without_drafts"] is None and resumed["tau_drafting_steps"] is None
    assert "proposed no draft" not in summary_table(resumed, "pld")
