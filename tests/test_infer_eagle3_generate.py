"""The speculative loop with an EAGLE-3 drafter is lossless: chains and dynamic trees.

References: Hugging Face ``generate`` (greedy) on the reference target, token for token, behind MT-Bench
questions and a 2K-token prefill, under no and a small inference window; a real drafter overfit on the
target's own greedy text, partly scripted so that whole chains, partial accepts and rejections all
occur. At temperature > 0 (chains) the exact distribution of the first tokens of a tiny vocab-8
target, against which a chi-square test judges sampled generations.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

from models.eagle3 import Eagle3Drafter, StaticEagle3Drafter
from infer.batch import generate_batch
from infer.generate import generate
from infer.prompt_lookup import lookup_drafts
from infer.prompts import long_prompt_ids, mt_bench_questions
from models.sampling import SamplingConfig
from models.static_target import StaticTarget
from infer_helpers import PartlyScriptedEagle3, greedy_continuations, overfit_eagle3_drafter
from test_infer_sampling import chi_square_p_value, exact_distribution, sampled_outputs
from models.eagle3 import Eagle3DraftModel, make_eagle3_config

LAYERS = [1, 3, 4]
STEPS = 4
TREE = {"tree_topk": 4, "tree_tokens": 16}
WINDOWS = [None, 4]  # inference-time window: none = full attention; 4 < the chain

pytestmark = [pytest.mark.usefixtures("single_cpu_thread"), pytest.mark.slow]


@pytest.fixture(scope="module")
def setup(reference_target_path):
    model = AutoModelForCausalLM.from_pretrained(reference_target_path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(reference_target_path)
    questions = [q["turns"][0] for q in mt_bench_questions()[:6]]
    memorised = greedy_continuations(model, [long_prompt_ids(tokenizer, q) for q in questions[:2]], 64)
    drafter = overfit_eagle3_drafter(model, memorised, layer_types=["sliding_attention"], sliding_window=8, target_layer_ids=LAYERS,
                                     ttt_length=STEPS, draft_vocab_size=1024, steps=150)
    return model, tokenizer, questions, drafter, StaticTarget(model, LAYERS)


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    return model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()


@pytest.mark.parametrize("prefill,num_prompts", [(0, 4), (2048, 1)])
def test_greedy_chain_and_tree_equal_hf_generate(setup, prefill, num_prompts) -> None:
    model, tokenizer, questions, drafter_model, target = setup
    histograms = {"chain": Counter(), "tree": Counter()}
    for i, question in enumerate(questions[:num_prompts]):
        prompt = long_prompt_ids(tokenizer, question, prefill, offset=997 * i)
        want = hf_greedy(model, prompt, 20)
        for window in WINDOWS:
            for mode, kwargs in [("chain", {}), ("tree", TREE)]:
                drafter = PartlyScriptedEagle3(drafter_model, want, len(prompt), p_script=0.7, seed=i, window=window, **kwargs)
                got = generate(target, drafter, prompt, max_new_tokens=20, prefill_chunk=1536)
                assert got.tokens == want, f"{mode}, prompt {i}, prefill {prefill}, window {window}"
                assert got.stats.block_size == STEPS + 1
                histograms[mode].update(got.stats.accepted_per_step)
    for mode, histogram in histograms.items():
        # rejections, partial accepts and whole chains (depth-4 paths) all happened
        assert histogram[0] > 0 and histogram[STEPS] > 0 and any(histogram[a] for a in range(1, STEPS)), (mode, histogram)


def test_tree_accepts_more_than_the_chain(setup) -> None:
    """The drafter's own proposals, no script: a tree (16 nodes) accepts more per step than a chain of 4."""
    model, tokenizer, questions, drafter_model, target = setup
    taus = {}
    for mode, kwargs in [("chain", {}), ("tree", TREE)]:
        steps = []
        for question in questions[:3]:  # two memorised, one not
            prompt = long_prompt_ids(tokenizer, question)
            got = generate(target, Eagle3Drafter(drafter_model, **kwargs), prompt, max_new_tokens=32)
            assert got.tokens == hf_greedy(model, prompt, 32), mode
            steps += got.stats.accepted_per_step
        taus[mode] = sum(a + 1 for a in steps) / len(steps)
    assert taus["chain"] > 1.5 and taus["tree"] >= taus["chain"], taus


@pytest.mark.parametrize("window,lookup", [(None, 0), (4, 0), (None, 8)])
def test_batched_trees_equal_batch_one(setup, window, lookup) -> None:
    """Static trees (with prompt lookup's branch: ``lookup``), three rows in flight over four prompts (one row refilled):
    each prompt's tokens and accepted counts are the eager batch-1 tree's, which are the target's greedy tokens."""
    model, tokenizer, questions, drafter_model, target = setup
    prompts = [long_prompt_ids(tokenizer, q) for q in questions[:4]]
    want = [generate(target, Eagle3Drafter(drafter_model, window=window, **TREE, tree_lookup=lookup), p, max_new_tokens=48) for p in prompts]
    got = generate_batch(target, StaticEagle3Drafter(drafter_model, window=window, **TREE, tree_lookup=lookup), prompts, 48, batch_size=3)
    for i, (w, g) in enumerate(zip(want, got)):
        assert g.tokens == w.tokens == hf_greedy(model, prompts[i], 48), i
        assert g.stats.accepted_per_step == w.stats.accepted_per_step, i
    accepted = [a for g in got for a in g.stats.accepted_per_step]
    assert max(accepted) >= 3 and 0 in accepted, accepted
    if lookup:
        assert max(accepted) > STEPS, accepted  # a copy deeper than the trees reach


def test_tree_with_prompt_lookup_branch(setup) -> None:
    """Hybrid drafting (``tree_lookup``): lossless, and at every step it accepts at least what prompt lookup's own chain
    from that position would have (the chain is a branch of the verified tree), and past the tree's depth when copying."""
    model, tokenizer, questions, drafter_model, target = setup
    lookup, longest = 8, 0
    for question in questions[:3]:
        prompt = long_prompt_ids(tokenizer, question)
        drafter = Eagle3Drafter(drafter_model, **TREE, tree_lookup=lookup)
        got = generate(target, drafter, prompt, max_new_tokens=64)
        assert got.tokens == hf_greedy(model, prompt, 64)
        assert got.stats.block_size == lookup + 1
        text, pos = prompt + got.tokens, len(prompt)  # pos: the step's root (its token already in the output)
        for step, accepted in enumerate(got.stats.accepted_per_step[:-1]):  # the last step may be cut by the budget
            chain = lookup_drafts(text[:pos + 1], lookup)
            copied = next((i for i, t in enumerate(chain) if t != text[pos + 1 + i]), len(chain))
            assert accepted >= copied, f"step {step} at {pos}: accepted {accepted}, prompt lookup's chain matched {copied}"
            longest = max(longest, accepted)
            pos += accepted + 1
    assert longest > STEPS  # some step accepted a copy deeper than the drafter's trees reach


def test_end_of_sequence_inside_a_chain_and_budget(setup) -> None:
    model, tokenizer, questions, drafter_model, target = setup
    prompt = long_prompt_ids(tokenizer, questions[4])
    want = hf_greedy(model, prompt, 30)
    for kwargs in [{}, TREE]:
        whole = PartlyScriptedEagle3(drafter_model, want, len(prompt), p_script=1.0, **kwargs)
        got = generate(target, whole, prompt, max_new_tokens=7)
        # 1 + 5 tokens, then a whole accepted chain of which the budget keeps 1: it counts as 0 accepted drafts
        assert got.tokens == want[:7] and got.stats.accepted_per_step == [STEPS, 0]
        eos = want[8]
        whole = PartlyScriptedEagle3(drafter_model, want, len(prompt), p_script=1.0, **kwargs)
        got = generate(target, whole, prompt, max_new_tokens=30, eos_token_ids=[eos])
        assert got.tokens == want[:want.index(eos) + 1]
        assert 1 + sum(a + 1 for a in got.stats.accepted_per_step) == len(got.tokens)


def test_bad_inputs(setup) -> None:
    model, _, _, drafter_model, target = setup
    with pytest.raises(ValueError, match=r"tree drafting is greedy only \(temperature=0.7\)"):
        generate(target, Eagle3Drafter(drafter_model, **TREE), [5, 6, 7], max_new_tokens=4, sampling=SamplingConfig(temperature=0.7))
    with pytest.raises(ValueError, match=r"drafter reads target layers \[1, 3, 4\], the target captures \[2\]"):
        generate(StaticTarget(model, [2]), Eagle3Drafter(drafter_model), [5, 6], max_new_tokens=4)
    with pytest.raises(ValueError, match="window=0"):
        Eagle3Drafter(drafter_model, window=0)


# --- temperature > 0: the output distribution is the target's ------------------------------------------


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 0.8)])
def test_chain_sampling_follows_the_target_distribution(temperature, top_k, top_p) -> None:
    torch.manual_seed(0)
    vocab, depth = 8, 3
    config = Qwen3Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, max_position_embeddings=64, tie_word_embeddings=False)
    model = Qwen3ForCausalLM(config).eval()
    for p in model.parameters():  # peaked but not deterministic next-token distributions
        p.data.normal_(0, 0.25) if p.dim() > 1 else None
    draft_config = make_eagle3_config(config, num_hidden_layers=1, target_layer_ids=[0, 2, 3], layer_types=["sliding_attention"],
                                      sliding_window=2, draft_vocab_size=6, ttt_length=2)
    drafter_model = Eagle3DraftModel(draft_config).eval()
    for p in drafter_model.parameters():
        p.data.normal_(0, 0.25) if p.dim() > 1 else None
    kept = torch.tensor([0, 1, 3, 4, 6, 7])  # ids 2 and 5 cannot be drafted: q = 0 there
    drafter_model.d2t.copy_(kept - torch.arange(6))
    drafter_model.t2d.zero_()[kept] = True
    target = StaticTarget(model, [0, 2, 3])
    drafter = Eagle3Drafter(drafter_model)
    prompt = [1, 4, 2, 6, 3]
    n = 3000
    counts, accepted = sampled_outputs(target, drafter, StaticEagle3Drafter(drafter_model), prompt, depth, temperature, top_k, top_p, n)
    p_value = chi_square_p_value(counts, exact_distribution(model, prompt, depth, temperature, top_k, top_p), n)
    assert p_value > 0.01, f"chi-square p = {p_value:.2e}: the output is not distributed as the target's"
    assert accepted[0] > 100 and accepted[1] > 100, accepted  # rejections and accepted drafts both occurred


def test_two_layer_drafter_trees_and_chains_are_lossless(setup) -> None:
    """A drafter of two decoder layers (a sliding one, then a full one: the second reads the first's output, not the
    features): eager chains and trees, and static trees three rows in flight, give the target's greedy tokens, and the
    static trees accept step for step what the eager ones do."""
    model, tokenizer, questions, _, target = setup
    memorised = greedy_continuations(model, [long_prompt_ids(tokenizer, q) for q in questions[:2]], 64)
    two = overfit_eagle3_drafter(model, memorised, layer_types=["sliding_attention", "full_attention"], sliding_window=8,
                                 target_layer_ids=LAYERS, ttt_length=STEPS, draft_vocab_size=1024, steps=120)
    assert len(two.layers) == 2 and two.layer_types == ["sliding_attention", "full_attention"]
    prompts = [long_prompt_ids(tokenizer, q) for q in questions[:4]]
    want = [hf_greedy(model, p, 40) for p in prompts]
    eager = []
    for i, prompt in enumerate(prompts):
        assert generate(target, Eagle3Drafter(two), prompt, max_new_tokens=40).tokens == want[i], f"chain, prompt {i}"
        eager.append(generate(target, Eagle3Drafter(two, **TREE), prompt, max_new_tokens=40))
        assert eager[-1].tokens == want[i], f"tree, prompt {i}"
    got = generate_batch(target, StaticEagle3Drafter(two, **TREE), prompts, 40, batch_size=3)
    for i, (e, g) in enumerate(zip(eager, got)):
        assert g.tokens == want[i] and g.stats.accepted_per_step == e.stats.accepted_per_step, i
    accepted = [a for e in eager for a in e.stats.accepted_per_step]
    assert max(accepted) >= 3, accepted  # the memorised prompts: the two layers draft whole paths
