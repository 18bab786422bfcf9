"""Speculative sampling's acceptance rule (``models.sampling.verify``, with the drafts drawn by ``models.sampling.choose``
as the DFlash and EAGLE-3 drafters draw them, or proposed by ``PromptLookupDrafter``) keeps the target's distribution
exactly: a synthetic Markov target over 5 tokens (next-token logits a table of the previous token) decoded speculatively
20,000 times at fixed seeds, the first 2-3 output tokens' empirical distribution against the exact one (a chi-square
test and a total-variation bound; the filtering written out independently of ``logits_to_probs``, in ``test_infer_sampling``). Three proposals: an autoregressive chain (q of
draft j depends on draft j-1, as EAGLE-3's), a block (every draft's q from the anchor alone, as DFlash's) and prompt
lookup's point masses (accept x with p(x), else draw from p less x). Drafts the target's top-k / top-p excludes
(p(x) = 0) and top-k beyond the vocabulary occur. Each case 4-7 s on one CPU thread; the end-to-end chi-square tests on
small models are ``tests/test_infer_sampling.py`` (DFlash) and ``tests/test_infer_eagle3_generate.py`` (EAGLE-3)."""

from __future__ import annotations

import functools
from collections import Counter

import pytest
import torch

from infer.prompt_lookup import PromptLookupDrafter
from models.sampling import SamplingConfig, choose, logits_to_probs, sample, verify
from test_infer_sampling import chi_square_p_value, filtered  # the filter written out token by token, the goodness of fit

pytestmark = pytest.mark.usefixtures("single_cpu_thread")

V, DRAFTS, N = 5, 2, 20_000


@functools.lru_cache(maxsize=None)
def tables(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Target logits [V, V] (row: the previous token), a chain drafter's [V, V] and a block drafter's [V, DRAFTS, V]
    (row: the anchor token): near the target's, so drafts are accepted often and rejected often. Token t is followed
    by t + 1 more often than not, so prompt lookup's copies of a cycle are accepted now and then."""
    g = torch.Generator().manual_seed(seed)
    target = 1.2 * torch.randn(V, V, generator=g)
    target[torch.arange(V), (torch.arange(V) + 1) % V] += 1.5
    chain = target + 0.9 * torch.randn(V, V, generator=g)
    block = target[:, None, :] + 1.2 * torch.randn(V, DRAFTS, V, generator=g)
    return target, chain, block


def exact(target: torch.Tensor, start: int, s: SamplingConfig, depth: int) -> dict[tuple, float]:
    """P(the first ``depth`` tokens after ``start``) under the target alone."""
    dist = {(): 1.0}
    for _ in range(depth):
        dist = {prefix + (t,): p * float(q[t]) for prefix, p in dist.items()
                for q in [filtered(torch.softmax(target[prefix[-1] if prefix else start].double() / s.temperature, -1), s.top_k, s.top_p)]
                for t in range(V) if q[t] > 0}
    return dist


def speculative(target: torch.Tensor, propose, start: int, s: SamplingConfig, g: torch.Generator,
                depth: int) -> tuple[tuple, list[int]]:
    """``infer.generate``'s chain step over the Markov target until ``depth`` tokens: drafts, one verify over [token,
    drafts] (row j: the target's logits after the j-th token of the block), the accepted drafts and the token after them.
    Returns the first ``depth`` tokens and the accepted count of each step."""
    out, token, accepted = [], start, []
    while len(out) < depth:
        drafts, q = propose(token, out)
        num, nxt = verify(drafts, q, target[torch.cat([torch.tensor([token]), drafts])], s, g)
        new = drafts[:int(num)].tolist() + [int(nxt)]
        accepted.append(int(num))
        out += new
        token = new[-1]
    return tuple(out[:depth]), accepted


PROMPT = [0, 1, 2, 3, 4, 0, 1, 3, 4, 0, 2, 3, 0, 1, 2, 4]  # the last token starts; the rest is prompt lookup's context


@functools.lru_cache(maxsize=None)
def chain_probs(s: SamplingConfig, seed: int) -> torch.Tensor:
    return logits_to_probs(tables(seed)[1], s)


def proposals(kind: str, s: SamplingConfig, g: torch.Generator, seed: int):
    """A fresh proposer for one generation: propose(token, output so far) -> drafts [m], q [m, V]."""
    block = tables(seed)[2]
    if kind == "chain":  # autoregressive: draft j+1 drawn after draft j (EAGLE-3), ``choose``'s two steps (its probs once)
        q = chain_probs(s, seed)

        def propose(token, out):
            tokens = [token]
            for _ in range(DRAFTS):
                tokens.append(int(sample(q[tokens[-1]][None], g)[0]))
            return torch.tensor(tokens[1:]), q[tokens[:-1]]
        return propose
    if kind == "block":  # every draft from the anchor alone, in one call (DFlash)
        return lambda token, out: choose(block[token], s, g)
    drafter = PromptLookupDrafter(num_draft_tokens=DRAFTS, vocab_size=V)  # point masses, 0 .. DRAFTS drafts
    drafter.reset(64)
    drafter.append_context(None, 0, torch.tensor(PROMPT[:-1]))

    def propose(token, out):
        seen = PROMPT[:-1] + out[:-1]  # the context holds every position before the token to verify
        if len(seen) > len(drafter.tokens):
            drafter.append_context(None, len(drafter.tokens), torch.tensor(seen[len(drafter.tokens):]))
        return drafter.draft(torch.tensor(token), len(seen), s, g)
    return propose


# drafter: sampling (top-k beyond the vocabulary, top-k and top-p cutting drafts out: p(x) = 0), tokens judged (DRAFTS + 1:
# a whole accepted chain's bonus token too; prompt lookup's 2, its 2 drafts rarely both accepted, for time)
CASES = {
    "chain": (SamplingConfig(temperature=1.0, top_k=4, top_p=0.95), 3),
    "block": (SamplingConfig(temperature=1.0), 3),
    "point mass": (SamplingConfig(temperature=1.2, top_k=50, top_p=0.9), 2),
}


@pytest.mark.parametrize("kind", list(CASES))
def test_speculative_samples_follow_the_target(kind: str) -> None:
    (s, depth), seed = CASES[kind], 3
    target = tables(seed)[0]
    g = torch.Generator().manual_seed(0)
    counts, accepted = Counter(), Counter()
    for _ in range(N):
        out, acc = speculative(target, proposals(kind, s, g, seed), PROMPT[-1], s, g, depth)
        counts[out] += 1
        accepted.update(acc)
    dist = exact(target, PROMPT[-1], s, depth)
    p_value = chi_square_p_value(counts, dist, N)
    tv = 0.5 * sum(abs(counts[o] / N - p) for o, p in dist.items())  # sampling noise alone: ~0.01-0.02 at N over <= 125 outcomes
    assert p_value > 1e-3 and tv < 0.035, f"{kind}: chi-square p = {p_value:.2e}, total variation {tv:.4f}"
    # every case rejects and accepts drafts often; the chain accepts whole chains often too (its bonus token judged)
    assert all(accepted[k] > 500 for k in range(DRAFTS + (kind == "chain"))), accepted


def test_a_tiny_temperature_follows_the_target_argmax() -> None:
    """temperature 1e-5: every output is the target's greedy path, whatever the drafter proposed."""
    s, seed = SamplingConfig(temperature=1e-5), 3
    target = tables(seed)[0]
    greedy = [PROMPT[-1]]
    for _ in range(3):
        greedy.append(int(target[greedy[-1]].argmax()))
    g = torch.Generator().manual_seed(0)
    for kind in CASES:
        for _ in range(200):
            assert speculative(target, proposals(kind, s, g, seed), PROMPT[-1], s, g, 3)[0] == tuple(greedy[1:]), kind


def test_trees_refuse_sampling_in_the_batched_loop() -> None:
    """Trees accept greedily only (``models.trees``): ``generate_batch`` refuses them at temperature > 0, as ``generate``
    does (``tests/test_infer_eagle3_generate.py``), rather than verifying sampled trees with the argmax rule."""
    from infer.batch import generate_batch
    from models.eagle3 import StaticEagle3Drafter
    from models.static_target import StaticTarget
    from test_static_eagle3 import HIDDEN, VOCAB, tiny
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=48, num_hidden_layers=6, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, max_position_embeddings=512)
    target = StaticTarget(Qwen3ForCausalLM(config).eval(), [1, 3, 5])
    drafter = StaticEagle3Drafter(tiny("full"), tree_topk=2, capture=False, compile=False)
    with pytest.raises(ValueError, match=r"tree drafting is greedy only \(temperature=0.7\)"):
        generate_batch(target, drafter, [[5, 6, 7]], 4, batch_size=1, sampling=SamplingConfig(temperature=0.7))


def test_a_temperature_too_small_to_divide_by_is_refused() -> None:
    """temperature=1e-45 passed the check, fp32 logits / T overflowed to inf, the probabilities were NaN and sampling
    returned token 0 forever (the argmax here is 1)."""
    with pytest.raises(ValueError, match=r"temperature=1e-45; expected 0 \(greedy\) or >= 1e-06"):
        SamplingConfig(temperature=1e-45)
    probs = logits_to_probs(torch.tensor([[1.0, 3.0, 2.0, -1.0]]), SamplingConfig(temperature=1e-6))
    assert torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0, 0.0]]))
