"""The static-cache EAGLE-3 drafter (``StaticEagle3Drafter``: fixed-shape buffers, rings for sliding layers, whole
verify blocks appended, step 0 run at draft time with the bonus token) against the eager ``Eagle3Drafter``
(consecutive context caches, accepted positions only), step by step: the same draft logits and tokens for every
drafter shape, window override and acceptance pattern, prompts in chunks, sampling, each row of a batch as if alone,
and the same generation in the loop (the target's own greedy output; sampled, forced-acceptance)."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config

from infer.generate import generate
from models.eagle3 import Eagle3Drafter, Eagle3DraftModel, StaticEagle3Drafter, make_eagle3_config
from infer_helpers import random_eagle3_on_reference
from models.sampling import SamplingConfig

pytestmark = pytest.mark.usefixtures("single_cpu_thread")

VOCAB, HIDDEN = 96, 32
SHAPES = {  # (layer types, trained window)
    "sliding": (["sliding_attention"], 6),
    "sliding+full": (["sliding_attention", "full_attention"], 5),
    "full": (["full_attention"], None),
}
ACCEPTED = [0, 3, 1, 2, 0, 0, 3, 3, 1] * 3  # past every ring's wrap-around (W + k + 1 slots)


def tiny(shape: str, steps: int = 3, fc_norm: bool = False, norm_output: bool = False, seed: int = 0) -> Eagle3DraftModel:
    torch.manual_seed(seed)
    target = Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=48, num_hidden_layers=6, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, max_position_embeddings=512)
    types, window = SHAPES[shape]
    model = Eagle3DraftModel(make_eagle3_config(target, num_hidden_layers=len(types), target_layer_ids=[1, 3, 5], layer_types=types,
                                                sliding_window=window, draft_vocab_size=64, ttt_length=steps, fc_norm=fc_norm,
                                                norm_output=norm_output)).eval()
    for p in model.parameters():  # larger weights than the init's, so windows and positions matter in the logits
        p.data.normal_(0, 0.3) if p.dim() > 1 else None
    kept = torch.randperm(VOCAB)[:64].sort().values  # a draft vocabulary that is not the first ids
    model.d2t.copy_(kept - torch.arange(64))
    model.t2d.zero_()[kept] = True
    return model


class Recorded(Eagle3Drafter):
    """The eager drafter, keeping every proposal's draft-vocabulary logits."""

    def logits_for(self, h, positions):
        logits = super().logits_for(h, positions)
        self.seen.append(logits)
        return logits


def run_both(model, window, accepted, prompt_chunks=(9,), sampling=SamplingConfig(), seed=0, extend_chunk=512):
    """Drive both drafters through a prompt (in chunks) and verify steps accepting ``accepted[i]`` drafts; per step
    yield (eager logits [k, Vd], eager tokens, eager probs, static logits, static tokens, static probs)."""
    g = torch.Generator().manual_seed(seed)
    eager = Recorded(model, window=window)
    static = StaticEagle3Drafter(model, window=window, extend_chunk=extend_chunk)
    k, features_size = eager.steps, model.fc.in_features
    eager.reset(300)
    static.reset(300)
    pos = 0
    for n in prompt_chunks:
        features, ids = torch.randn(n, features_size, generator=g), torch.randint(0, VOCAB, (n,), generator=g)
        eager.append_context(features, pos, ids)
        static.append_context(features, pos, ids)
        pos += n
    gens = [torch.Generator().manual_seed(seed + 1) for _ in range(2)]  # the same noise for both
    for acc in accepted:
        token = torch.randint(0, VOCAB, (), generator=g)  # the bonus token after the accepted drafts
        eager.seen = []
        want, want_probs = eager.draft(token, pos, sampling, gens[0])
        state = gens[1].get_state()
        got, got_probs = static.draft(token, pos, sampling, gens[1])
        again = torch.Generator()
        again.set_state(state)  # a second run with the same noise changes nothing (CUDA graphs warm up so)
        rerun, got_logits, _ = static.draft_chain(token.reshape(1), torch.tensor([pos]), sampling, again)
        assert torch.equal(rerun[0], got)
        yield torch.cat(eager.seen), want, want_probs, got_logits[0], got, got_probs
        block_ids = torch.cat([token[None], want])
        features = torch.randn(k + 1, features_size, generator=g)  # the verify pass's; rows after acc are rejected drafts'
        eager.append_context(features[:acc + 1], pos, block_ids[:acc + 1])
        static.append_context(features, pos, block_ids)
        pos += acc + 1


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("window", ["trained", None, 2, 1])
def test_static_chains_equal_the_eager_drafters(shape, window) -> None:
    model = tiny(shape)
    for want_logits, want, _, got_logits, got, _ in run_both(model, window, ACCEPTED):
        torch.testing.assert_close(got_logits, want_logits, rtol=1e-4, atol=1e-4)
        assert torch.equal(got, want)


@pytest.mark.parametrize("steps,fc_norm,norm_output", [(1, False, False), (5, True, True)])
def test_chain_lengths_and_eagle31_options(steps, fc_norm, norm_output) -> None:
    model = tiny("sliding+full", steps=steps, fc_norm=fc_norm, norm_output=norm_output)
    accepted = [a % (steps + 1) for a in [0, 5, 1, 3, 2, 5, 4, 0, 5, 5]]
    for want_logits, want, _, got_logits, got, _ in run_both(model, "trained", accepted):
        torch.testing.assert_close(got_logits, want_logits, rtol=1e-4, atol=1e-4)
        assert torch.equal(got, want)


def test_a_long_prompt_in_chunks_into_a_ring() -> None:
    """Chunks of 23, 1 and 26 positions (a ring holds 5 + 4), step 0 in passes of at most 7 indices."""
    model = tiny("sliding+full")
    for want_logits, want, _, got_logits, got, _ in run_both(model, "trained", [1, 2, 0, 3], prompt_chunks=(23, 1, 26), extend_chunk=7):
        torch.testing.assert_close(got_logits, want_logits, rtol=1e-4, atol=1e-4)
        assert torch.equal(got, want)
    for _, want, _, _, got, _ in run_both(model, "trained", [0, 1], prompt_chunks=(1,)):  # a one-token prompt
        assert torch.equal(got, want)


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_k=20, top_p=0.9)])
def test_sampled_chains_equal_the_eager_drafters(sampling) -> None:
    model = tiny("sliding+full")
    for want_logits, want, want_probs, got_logits, got, got_probs in run_both(model, "trained", ACCEPTED[:12], sampling=sampling):
        torch.testing.assert_close(got_logits, want_logits, rtol=1e-4, atol=1e-4)
        assert torch.equal(got, want)  # the same Exp(1) draws, in the same order
        assert got_probs.shape == (3, VOCAB)
        torch.testing.assert_close(got_probs, want_probs, rtol=1e-5, atol=1e-6)


def test_each_row_of_a_batch_drafts_as_if_alone() -> None:
    model = tiny("sliding+full")
    g = torch.Generator().manual_seed(3)
    p, features_size = 4, model.fc.in_features
    batch = StaticEagle3Drafter(model)
    batch.allocate(100, batch=2)
    singles = [StaticEagle3Drafter(model) for _ in range(2)]
    lengths = [7, 12]
    for row, n in enumerate(lengths):  # prompts of different lengths, each into its own row
        features, ids = torch.randn(n, features_size, generator=g), torch.randint(0, VOCAB, (n,), generator=g)
        singles[row].allocate(100, batch=1)
        singles[row].prefill(features, 0, ids)
        batch.prefill(features, 0, ids, row=row)
    pos = torch.tensor(lengths)
    for step in range(6):  # then batched verify appends, rows at their own positions and acceptances
        tokens = torch.randint(0, VOCAB, (2,), generator=g)
        drafts, logits, _ = batch.draft_chain(tokens, pos)
        for row in range(2):
            want_drafts, want_logits, _ = singles[row].draft_chain(tokens[row:row + 1], pos[row:row + 1])
            torch.testing.assert_close(logits[row], want_logits[0], rtol=1e-4, atol=1e-4)
            assert torch.equal(drafts[row], want_drafts[0])
        features = torch.randn(2, p, features_size, generator=g)
        block_ids = torch.cat([tokens[:, None], drafts], dim=1)
        batch.append(features, pos, block_ids)
        for row in range(2):
            singles[row].append(features[row:row + 1], pos[row:row + 1], block_ids[row:row + 1])
        pos = pos + torch.tensor([1 + step % 4, 4 - step % 4])


def test_protocol_mistakes_are_one_clear_error() -> None:
    drafter = StaticEagle3Drafter(tiny("sliding"))
    drafter.reset(50)
    with pytest.raises(ValueError, match="draft at position 3"):
        drafter.draft(torch.tensor(1), 3, SamplingConfig(), None)
    with pytest.raises(ValueError, match="expects its prompt's position 0 next"):
        drafter.append_context(torch.randn(2, 96), 4, torch.tensor([1, 2]))
    drafter.append_context(torch.randn(5, 96), 0, torch.arange(5))
    drafter.draft(torch.tensor(1), 5, SamplingConfig(), None)
    with pytest.raises(ValueError, match="whole verify block"):
        drafter.append_context(torch.randn(2, 96), 5, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="draft_at: the features"):  # a draft since the last append
        drafter.draft_at(torch.tensor(1), torch.tensor([5]), SamplingConfig(), None)
    drafter.append_context(torch.randn(4, 96), 5, torch.arange(4))
    drafter.draft_at(torch.tensor(1), torch.tensor([7]), SamplingConfig(), None)  # the position on the device only
    with pytest.raises(ValueError, match="whole verify block"):
        drafter.append_context(torch.randn(2, 96), 7, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="draft steps=0"):
        StaticEagle3Drafter(tiny("sliding"), steps=0)


@pytest.mark.slow  # the quick tier stays under 3 minutes (README); the full suite runs it
def test_the_loop_with_the_static_drafter_equals_the_eager_one(reference_target_path) -> None:
    _, target, drafter_model, prompt = random_eagle3_on_reference(reference_target_path)
    plain = generate(target, None, prompt, 30)
    want = generate(target, Eagle3Drafter(drafter_model), prompt, 30)
    got = generate(target, StaticEagle3Drafter(drafter_model), prompt, 30, prefill_chunk=16)
    assert got.tokens == want.tokens == plain.tokens
    assert got.stats.accepted_per_step == want.stats.accepted_per_step
    for accept in (1, 3):  # the drafts themselves, `accept` per step (a whole chain, a partial one)
        forced = [generate(target, d, prompt, 30, accept_per_step=accept) for d in (Eagle3Drafter(drafter_model), StaticEagle3Drafter(drafter_model))]
        assert forced[0].tokens == forced[1].tokens
    sampling = SamplingConfig(temperature=0.8, seed=5)
    sampled = [generate(target, d, prompt, 30, sampling=sampling) for d in (Eagle3Drafter(drafter_model), StaticEagle3Drafter(drafter_model))]
    assert sampled[0].tokens == sampled[1].tokens and sampled[0].stats.accepted_per_step == sampled[1].stats.accepted_per_step


@pytest.mark.slow  # the quick tier stays under 3 minutes (README); the full suite runs it
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"))])
def test_drafting_the_next_chain_ahead_of_the_host_sync_changes_no_token(reference_target_path, device) -> None:
    """``draft_at`` (the next chain launched before the host reads the verify's accepted count) or ``draft`` after it:
    the same tokens and accepted counts, greedy (the target's own output), forced, sampled, and with a stop token inside
    a step (the chain drafted ahead is dropped). On a GPU the drafter's chain and append are captured graphs, as the
    8B-shape benchmark runs them."""
    from transformers import AutoModelForCausalLM

    from models.static_target import StaticTarget

    model = AutoModelForCausalLM.from_pretrained(reference_target_path, dtype=torch.float32).eval().to(device)
    config = make_eagle3_config(model.config, num_hidden_layers=1, target_layer_ids=[1, 3, 4], layer_types=["sliding_attention"],
                                sliding_window=6, draft_vocab_size=2048, ttt_length=3)
    torch.manual_seed(0)
    drafter_model = Eagle3DraftModel(config).eval().to(device)
    drafter_model.embed_tokens.weight.data.copy_(model.get_input_embeddings().weight.data)
    target, drafter = StaticTarget(model, [1, 3, 4]), StaticEagle3Drafter(drafter_model)
    prompt = torch.randint(10, 8000, (30,)).tolist()
    alone = generate(target, None, prompt, 30).tokens
    for kwargs in ({}, {"accept_per_step": 2}, {"sampling": SamplingConfig(temperature=1.0, seed=3)}):
        runs = [generate(target, drafter, prompt, 30, run_ahead=ahead, **kwargs) for ahead in (False, True)]
        assert runs[0].tokens == runs[1].tokens and runs[0].stats.accepted_per_step == runs[1].stats.accepted_per_step
        assert kwargs or runs[1].tokens == alone
    for stop in (3, 7):
        eos = alone[stop]
        runs = [generate(target, drafter, prompt, 30, eos_token_ids=[eos], run_ahead=ahead).tokens for ahead in (False, True)]
        assert runs[0] == runs[1] == alone[:alone.index(eos) + 1]


def uncaptured_and_captured(model, compile: bool, **options) -> tuple[list[StaticEagle3Drafter], torch.Generator, torch.Tensor]:
    """The same drafter uncaptured and captured (compiled or not) on the GPU, two rows of 9-position prompts prefilled in
    both; returns them, the generator that drew the prompts (for the steps' draws) and the rows' positions."""
    g = torch.Generator(device="cuda").manual_seed(0)
    drafters = [StaticEagle3Drafter(model, capture=c, compile=c and compile, **options) for c in (False, True)]
    features = torch.randn(2, 9, model.fc.in_features, device="cuda", generator=g)
    ids = torch.randint(0, VOCAB, (2, 9), device="cuda", generator=g)
    for d in drafters:
        d.allocate(100, batch=2)
        for row in range(2):
            d.prefill(features[row], 0, ids[row], row=row)
    return drafters, g, torch.tensor([9, 9], device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("compile", [False, True])
def test_captured_drafter_equals_the_uncaptured_one_on_cuda(shape, compile) -> None:
    model = tiny(shape).cuda()
    drafters, g, pos = uncaptured_and_captured(model, compile)
    tol = {"atol": 1e-4, "rtol": 1e-4} if compile else {"atol": 0, "rtol": 0}
    for step in range(12):
        token = torch.randint(0, VOCAB, (2,), device="cuda", generator=g)
        sampling = SamplingConfig(temperature=0.8) if step % 3 == 2 else SamplingConfig()
        outs = [d.draft_chain(token, pos, sampling, torch.Generator(device="cuda").manual_seed(step)) for d in drafters]
        torch.testing.assert_close(outs[1][1], outs[0][1], **tol)
        assert torch.equal(outs[1][0], outs[0][0])
        if not sampling.greedy:
            torch.testing.assert_close(outs[1][2], outs[0][2], **tol)
        features = torch.randn(2, 4, model.fc.in_features, device="cuda", generator=g)
        block_ids = torch.cat([token[:, None], outs[0][0]], dim=1)
        for d in drafters:
            d.append(features, pos, block_ids)
        pos = pos + torch.tensor([1 + step % 4, 4 - step % 4], device="cuda")
