"""Batched decoding (``infer/batch.py``) against the batch-1 loop: every prompt's tokens and accepted counts per step are
the same at batch size 3 (rows refilled as requests finish, prompts of different lengths), greedy and sampled, for the
target alone, prompt lookup, the static DFlash drafter and static EAGLE-3 chains; the eval runner's batched path gives
batch 1's records."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from infer.batch import check_batchable, generate_batch
from infer.generate import VERIFY_FIRST, GenerationStats, common_prefix, generate, trim_output, verify_stages
from infer.prompt_lookup import PromptLookupDrafter
from models.dflash import DFlashDraftModel, DFlashDrafter, StaticDFlashDrafter, make_dflash_config
from models.eagle3 import Eagle3Drafter, Eagle3DraftModel, StaticEagle3Drafter, make_eagle3_config
from models.sampling import SamplingConfig
from infer_helpers import bigram_eagle3, greedy_continuations, overfit_drafter
from models.static_target import StaticTarget

pytestmark = pytest.mark.usefixtures("single_cpu_thread")


@pytest.fixture(scope="module")
def setup(reference_target_path, reference_tokenizer):
    model = AutoModelForCausalLM.from_pretrained(reference_target_path, dtype=torch.float32).eval()
    questions = ["Write a haiku about rain.", "What is 2 + 2? Explain.", "Name three rivers in Europe and one fact about each.",
                 "Tell me a story.", "How do I sort a list in Python?"]
    prompts = []
    for q in questions:
        ids = reference_tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    eos = [reference_tokenizer.convert_tokens_to_ids("<|im_end|>")]
    # a DFlash drafter (a sliding layer of window 6 and a full layer, blocks of 4) overfit on the target's greedy replies
    # to these prompts (100 steps, ~16 s of one core): its drafts are accepted (greedy: 0 .. 3 a step, τ ~3), so a row
    # drafting from another row's context, or a count mis-kept, changes what batch 1 is compared with (a random drafter
    # accepted nothing: every comparison was of the target's tokens and zeros)
    dflash = overfit_drafter(model, greedy_continuations(model, prompts, 32), layer_types=["sliding_attention", "full_attention"],
                             sliding_window=6, block_size=4, mask_token_id=5, target_layer_ids=(1, 3), steps=100)
    return model, dflash, prompts, eos, bigram_eagle3(model, prompts)


def accepted_some(generations, at_least: int) -> bool:
    """Whether some step of these generations accepted ``at_least`` drafts: a comparison with batch 1 that holds only zeros
    shows nothing about the drafter's rows."""
    return max(a for g in generations for a in g.stats.accepted_per_step) >= at_least


def make_drafter(setup, kind: str):
    """(target, drafter) of a kind, the target capturing the layers the drafter reads."""
    model, dflash, _, _, eagle3 = setup
    if kind == "eagle3":
        return StaticTarget(model, [1, 3, 4]), StaticEagle3Drafter(eagle3)
    drafter = {"none": None, "pld": PromptLookupDrafter(num_draft_tokens=3, vocab_size=8192),
               "dflash": StaticDFlashDrafter(dflash, model.get_input_embeddings(), model.get_output_embeddings())}[kind]
    return StaticTarget(model, [1, 3]), drafter


_BATCH_ONE: dict[tuple, object] = {}


def batch_one(setup, drafter_kind: str, prompts: list[list[int]], n: int, sampling: SamplingConfig = SamplingConfig(),
              eos: list[int] = ()) -> list:
    """Batch 1's ``generate`` of each prompt from a whole prefill: what the batched runs are compared with. A whole
    prefill reads nothing an earlier call left, so the result depends on the drafter kind, the prompt, the budget, the
    sampling settings, the end-of-sequence ids and the thread count alone: each is made once per module run and shared
    by the tests asking for the same (2-5 s a prompt and drafter kind on one core). Greedy decoding reads no seed."""
    key = (drafter_kind, n, repr(sampling) if sampling.temperature > 0 else "greedy", tuple(eos), torch.get_num_threads())
    missing = [p for p in prompts if key + (tuple(p),) not in _BATCH_ONE]
    if missing:
        target, drafter = make_drafter(setup, drafter_kind)
        for p in missing:
            _BATCH_ONE[key + (tuple(p),)] = generate(target, drafter, p, n, sampling, eos_token_ids=eos)
    return [_BATCH_ONE[key + (tuple(p),)] for p in prompts]


def test_trimmed_output_counts_only_the_kept_tokens() -> None:
    """Both loops trim with ``trim_output``: one prefill token and steps accepting 3 and 4 drafts made 1 + 4 + 5 = 10
    tokens; an end-of-sequence token at index 6 keeps 7 of them, so the last step is counted as 1 accepted draft and
    its 3 drafts past the end stand apart (an engine's counters include them); a budget of 8 cuts the same way."""
    tokens = [10, 11, 12, 13, 14, 15, 2, 17, 18, 19]
    stats = GenerationStats(prompt_tokens=5, new_tokens=0, block_size=8, accepted_per_step=[3, 4])
    assert trim_output(tokens, stats, {2}, 100) == tokens[:7]
    assert (stats.new_tokens, stats.accepted_per_step, stats.accepted_past_end, stats.untrimmed_steps) == (7, [3, 1], 3, [3, 4])
    assert 1 + sum(a + 1 for a in stats.accepted_per_step) == stats.new_tokens
    stats = GenerationStats(prompt_tokens=5, new_tokens=0, block_size=8, accepted_per_step=[3, 4])
    assert trim_output(tokens, stats, set(), 8) == tokens[:8]  # the budget: the loop stopped past it after the last step
    assert (stats.new_tokens, stats.accepted_per_step, stats.accepted_past_end) == (8, [3, 2], 2)
    stats = GenerationStats(prompt_tokens=5, new_tokens=0, block_size=8, accepted_per_step=[3, 4])
    assert trim_output(tokens, stats, set(), 100) == tokens and stats.accepted_past_end == 0


# quick tier: the target alone, greedy; prompt lookup there through the draining batch below, EAGLE-3 through
# test_infer_eagle3_cli's batched prompts file
@pytest.mark.parametrize("drafter_kind", ["none", pytest.param("pld", marks=pytest.mark.slow), pytest.param("dflash", marks=pytest.mark.slow),
                                          pytest.param("eagle3", marks=pytest.mark.slow)])
@pytest.mark.parametrize("temperature", [0.0, pytest.param(0.8, marks=pytest.mark.slow)])
def test_batched_rows_equal_batch_one(setup, drafter_kind, temperature) -> None:
    prompts, eos = setup[2], setup[3]
    target, drafter = make_drafter(setup, drafter_kind)
    sampling = SamplingConfig(temperature=temperature, seed=7)
    want = batch_one(setup, drafter_kind, prompts, 24, sampling, eos)
    got = generate_batch(target, drafter, prompts, 24, batch_size=3, sampling=sampling, eos_token_ids=eos)
    for w, g in zip(want, got):
        assert g.tokens == w.tokens
        assert g.stats.accepted_per_step == w.stats.accepted_per_step
        assert g.stats.accepted_past_end == w.stats.accepted_past_end
        assert g.stats.tau == w.stats.tau
    if drafter_kind in ("dflash", "eagle3"):  # rows at different offsets in their blocks were drafted together
        assert accepted_some(want, 2 if temperature == 0 else 1)


@pytest.mark.slow  # ~7 s on 2 cores; the quick tier keeps the other batched prompt-lookup equalities
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_prompt_lookup_rows_with_short_and_empty_proposals_equal_batch_one(setup, temperature, monkeypatch) -> None:
    """Prompt lookup proposes only what it found (0 .. k): steps where some rows propose nothing and others k verify a
    block as wide as the longest proposal + 1, the padding skipping the linears (``lengths``); every prompt's tokens
    and accepted counts are batch 1's, and greedy tokens are the target alone's."""
    prompts, eos = setup[2], setup[3]
    target, drafter = make_drafter(setup, "pld")
    sampling = SamplingConfig(temperature=temperature, seed=5)
    want = [generate(target, drafter, p, 32, sampling, eos_token_ids=eos) for p in prompts]
    if temperature == 0:
        assert [w.tokens for w in want] == [generate(target, None, p, 32, eos_token_ids=eos).tokens for p in prompts]
    steps, step = [], target.step
    monkeypatch.setattr(target, "step",
                        lambda ids, pos, lengths=None: steps.append((ids.shape[1], lengths.tolist())) or step(ids, pos, lengths))
    got = generate_batch(target, drafter, prompts, 32, batch_size=5, sampling=sampling, eos_token_ids=eos)
    assert [(g.tokens, g.stats.accepted_per_step) for g in got] == [(w.tokens, w.stats.accepted_per_step) for w in want]
    assert all(width == max(lengths) for width, lengths in steps)
    assert any(min(lengths) == 1 and max(lengths) == 4 for _, lengths in steps)  # nothing proposed beside k drafts
    assert any(width < 4 for width, _ in steps)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"))])
def test_prefilling_several_rows_at_once_equals_one_row_at_a_time(setup, device) -> None:
    """``prefill_rows`` (prompts of different lengths right-padded into one forward) against ``prefill`` per row: the
    last token's logits, the features of every prompt token, and every cached key and value of the prompts (fp32)."""
    import copy

    model, _, prompts, _, _ = setup
    model = model if device == "cpu" else copy.deepcopy(model).to(device)
    batched, alone = StaticTarget(model, [1, 3]), StaticTarget(model, [1, 3])
    for target in (batched, alone):
        target.allocate(128, batch=4)
    rows = [2, 0, 3]
    logits, features = batched.prefill_rows([torch.tensor(prompts[j], device=device) for j in range(3)], rows)
    for j, r in enumerate(rows):
        n = len(prompts[j])
        want_logits, want_features = alone.prefill(torch.tensor(prompts[j], device=device), r, 0, last_logits_only=True)
        torch.testing.assert_close(logits[j:j + 1], want_logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(features[j, :n], want_features, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(batched.k_cache[:, r, :, :n], alone.k_cache[:, r, :, :n], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(batched.v_cache[:, r, :, :n], alone.v_cache[:, r, :, :n], rtol=1e-5, atol=1e-5)
    assert batched.k_cache[:, 1].abs().sum() == 0  # the row not named is untouched


@pytest.mark.slow  # the quick tier stays under 3 minutes (README); the full suite runs it
@pytest.mark.parametrize("drafter_kind", ["none", "dflash", "eagle3"])
def test_rows_refilled_in_waves_equal_batch_one(setup, drafter_kind, monkeypatch) -> None:
    """Finished rows wait for a wave of two before their prompts are prefilled together (rows idle meanwhile): every
    prompt's tokens and accepted counts are batch 1's, and the prefills did run several rows at once."""
    prompts, eos = setup[2] * 2, setup[3]
    target, drafter = make_drafter(setup, drafter_kind)
    want = batch_one(setup, drafter_kind, prompts, 24, eos=eos)
    calls = []
    prefill_rows = target.prefill_rows
    monkeypatch.setattr(target, "prefill_rows", lambda ps, rows, starts=None: calls.append(len(rows)) or prefill_rows(ps, rows, starts))
    got = generate_batch(target, drafter, prompts, 24, batch_size=4, eos_token_ids=eos, refill_wave=2)
    assert [(g.tokens, g.stats.accepted_per_step) for g in got] == [(w.tokens, w.stats.accepted_per_step) for w in want]
    assert sum(calls) == len(prompts) and calls[0] == 4 and max(calls[1:]) >= 2
    assert drafter_kind == "none" or accepted_some(want, 2)


@pytest.mark.parametrize("drafter_kind", [pytest.param("none", marks=pytest.mark.slow), "pld", pytest.param("dflash", marks=pytest.mark.slow)])
@pytest.mark.parametrize("temperature", [0.0, pytest.param(0.8, marks=pytest.mark.slow)])  # quick tier: prompt lookup, greedy
def test_a_draining_batch_steps_only_its_live_rows(setup, drafter_kind, temperature, monkeypatch) -> None:
    """Once no request waits, live rows move down into finished ones and only the rows up to the last live one step
    (the CPU; DFlash's chain caches move with their rows): every prompt's tokens and accepted counts are still batch
    1's, and rows did move and steps did shrink. A token of row 0's reply that the other replies lack is made an
    end-of-sequence token, so row 0 finishes first and leaves a hole below live rows. (DFlash's drafts read the moved
    context: a row whose caches stayed behind drafts from another row's and accepts other counts.)"""
    prompts = setup[2][:4]
    target, drafter = make_drafter(setup, drafter_kind)
    sampling = SamplingConfig(temperature=temperature, seed=3)
    replies = [generate(target, drafter, p, 24, sampling, eos_token_ids=setup[3]).tokens for p in prompts]
    eos = setup[3] + [next(t for t in replies[0][:12] if all(t not in r for r in replies[1:]))]
    want = [generate(target, drafter, p, 24, sampling, eos_token_ids=eos) for p in prompts]
    moves, widths, drafter_moves = [], [], []
    move_row, step = target.move_row, target.step
    monkeypatch.setattr(target, "move_row", lambda src, dst, n: moves.append((src, dst)) or move_row(src, dst, n))
    monkeypatch.setattr(target, "step", lambda ids, pos, lengths=None: widths.append(ids.shape[0]) or step(ids, pos, lengths))
    if drafter_kind == "dflash":  # its caches move with the target's (their arithmetic: the test below)
        drafter_move = drafter.move_row
        monkeypatch.setattr(drafter, "move_row", lambda src, dst: drafter_moves.append((src, dst)) or drafter_move(src, dst))
    got = generate_batch(target, drafter, prompts, 24, batch_size=4, sampling=sampling, eos_token_ids=eos)
    assert [(g.tokens, g.stats.accepted_per_step) for g in got] == [(w.tokens, w.stats.accepted_per_step) for w in want]
    assert moves and all(src > dst for src, dst in moves)
    assert widths[0] == 4 and min(widths) < 4
    assert drafter_moves == (moves if drafter_kind == "dflash" else [])
    assert drafter_kind != "dflash" or accepted_some(want, 2 if temperature == 0 else 1)  # prompt lookup: 0 or 1 on these


def test_a_dflash_row_moved_drafts_as_its_own_row_did(setup) -> None:
    """``StaticDFlashDrafter.move_row`` and a pass over the first rows only (a packed batch): row 2's context moved
    into row 0, the block logits of a one-row pass equal row 2's in a three-row pass before the move (each row's own
    context: different lengths and features, so a row drafting from another row's context gives other logits)."""
    _, drafter = make_drafter(setup, "dflash")
    gen = torch.Generator().manual_seed(0)
    width = drafter.model.fc.in_features
    lengths = [5, 9, 7]
    contexts = [torch.randn(1, n, width, generator=gen) for n in lengths]
    drafter.allocate(64, batch=3)
    for r, context in enumerate(contexts):
        drafter.append(context, torch.tensor([0]), row=r)
    tokens, anchors = torch.tensor([11, 12, 13]), torch.tensor(lengths)
    before = drafter.block_logits(tokens, anchors)[0].clone()
    assert not torch.allclose(before[0], before[2], atol=1e-3)  # the rows' contexts do differ
    drafter.move_row(2, 0)
    moved = drafter.block_logits(tokens[[2]], anchors[[2]])[0]
    torch.testing.assert_close(moved[0], before[2], rtol=1e-4, atol=1e-5)
    blocks = torch.randn(2, 16, width, generator=gen)
    drafter.append(blocks, anchors[[2, 1]])  # a block append into the first 2 rows (row 2's context now in row 0)
    after = drafter.block_logits(tokens[[2, 1]], anchors[[2, 1]] + 16)[0]
    for got, r, block in zip(after, (2, 1), blocks):  # each row as a drafter of one row given the same appends drafts it
        _, alone = make_drafter(setup, "dflash")
        alone.allocate(64, batch=1)
        alone.append(contexts[r], torch.tensor([0]))
        alone.append(block[None], anchors[[r]])
        torch.testing.assert_close(got, alone.block_logits(tokens[[r]], anchors[[r]] + 16)[0][0], rtol=1e-4, atol=1e-5)


def ending_inside_a_run(setup) -> tuple[list[list[int]], StaticTarget, list[int], list]:
    """The prompts, the static target, end-of-sequence ids with one more that ends the first reply inside a run of 3 or
    8 steps (maybe others too; the rest run to the budget of 23, no multiple of the run), and batch 1's generations."""
    prompts = setup[2]
    target = StaticTarget(setup[0], [])
    replies = [generate(target, None, p, 23, eos_token_ids=setup[3]).tokens for p in prompts]
    stop = next(t for t in replies[0][4:14] if t not in replies[0][:4])
    eos = setup[3] + [stop]
    want = [generate(target, None, p, 23, eos_token_ids=eos) for p in prompts]
    assert len(want[0].tokens) < 15 and any(len(w.tokens) == 23 for w in want)
    return prompts, target, eos, want


@pytest.mark.parametrize("run_steps", [3, pytest.param(8, marks=pytest.mark.slow)])
def test_the_target_alone_steps_in_runs_without_host_syncs(setup, run_steps, monkeypatch) -> None:
    """The target alone, greedy, steps ``run_steps`` times between host syncs: requests that end inside a run (an
    end-of-sequence token mid-run, a budget that is no multiple of the run) give batch 1's tokens and step counts,
    and the host looked at the rows once per run, not once per step."""
    prompts, target, eos, want = ending_inside_a_run(setup)
    steps, syncs = [], []
    step, tensor = target.step, torch.tensor
    monkeypatch.setattr(target, "step", lambda ids, pos, lengths=None: steps.append(len(syncs)) or step(ids, pos, lengths))
    # the host's positions go back to the device once per sync (torch.tensor of a list of row positions)
    monkeypatch.setattr(torch, "tensor", lambda data, *a, **k: (syncs.append(1) if isinstance(data, list) else None) or tensor(data, *a, **k))
    got = generate_batch(target, None, prompts, 23, batch_size=3, eos_token_ids=eos, run_steps=run_steps)
    assert [(g.tokens, g.stats.accepted_per_step) for g in got] == [(w.tokens, w.stats.accepted_per_step) for w in want]
    runs = [steps.count(k) for k in sorted(set(steps))]  # steps between two syncs
    assert runs and all(n == run_steps for n in runs)


@pytest.mark.parametrize("batch_size", [2, 3])
def test_runs_queued_ahead_of_the_host_give_batch_ones_tokens(setup, batch_size) -> None:
    """``run_ahead``: the next run is queued before the host books the one before it, so a request that ends inside a
    run (an end-of-sequence token mid-run, a budget that is no multiple of the run) has its row step one more run, and a
    row refilled after the next run was queued starts a run later. With fewer rows than prompts (refills in waves of
    one), every request's tokens and step counts are batch 1's, and a drafter or sampling is refused in one line."""
    prompts, target, eos, want = ending_inside_a_run(setup)
    steps = []
    step = target.step
    target.step = lambda ids, pos, lengths=None: steps.append(1) or step(ids, pos, lengths)
    try:
        got = generate_batch(target, None, prompts, 23, batch_size=batch_size, eos_token_ids=eos, run_steps=3, refill_wave=1,
                             run_ahead=True)
    finally:
        target.step = step
    assert [(g.tokens, g.stats.accepted_per_step) for g in got] == [(w.tokens, w.stats.accepted_per_step) for w in want]
    assert len(steps) % 3 == 0 and len(steps) > 3 * max(-(-len(w.tokens) // 3) for w in want)  # whole runs, one queued past the end
    with pytest.raises(ValueError, match=r"run_ahead: the target alone, greedy, in runs of run_steps > 1 .*temperature 1.0"):
        generate_batch(target, None, prompts, 4, batch_size=2, sampling=SamplingConfig(temperature=1.0), run_ahead=True)


def test_the_cpu_stages_the_verify_of_greedy_dflash_chains_of_eight_drafts_or_more(setup) -> None:
    """Where the staged verify runs by default (``verify_stages``; its equality with one pass: test_infer_generate)."""
    model, _, prompts, eos, eagle3 = setup
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    config = make_dflash_config(model.config, num_hidden_layers=1, block_size=16, mask_token_id=5, target_layer_ids=[1, 3],
                                layer_types=["full_attention"], sliding_window=None)
    block16 = DFlashDraftModel(config).eval()
    target, greedy = StaticTarget(model, [1, 3]), SamplingConfig()
    assert verify_stages(target, StaticDFlashDrafter(block16, embed, head), greedy) == VERIFY_FIRST == 4
    assert verify_stages(target, StaticDFlashDrafter(block16, embed, head, draft_tokens=8), greedy) == 4
    assert verify_stages(target, StaticDFlashDrafter(block16, embed, head, draft_tokens=7), greedy) is None  # a short tail
    assert verify_stages(target, StaticDFlashDrafter(block16, embed, head), SamplingConfig(temperature=0.8)) is None
    assert verify_stages(target, StaticDFlashDrafter(block16, embed, head, tree_topk=4, tree_tokens=8), greedy) is None
    assert verify_stages(target, PromptLookupDrafter(num_draft_tokens=15, vocab_size=8192), greedy) is None
    assert verify_stages(StaticTarget(model, [1, 3, 4]), StaticEagle3Drafter(eagle3), greedy) is None
    with pytest.raises(ValueError, match="verify_first=2: batched, a staged verify checks >= 1 drafts of greedy DFlash chains"):
        generate_batch(StaticTarget(model, [1, 3, 4]), StaticEagle3Drafter(eagle3), prompts[:2], 4, batch_size=2, verify_first=2)


def test_an_end_of_sequence_first_token_and_a_one_token_budget(setup) -> None:
    model, _, prompts, eos, _ = setup
    target = StaticTarget(model, [])
    first = generate(target, None, prompts[0], 1).tokens[0]
    got = generate_batch(target, None, prompts[:3], 1, batch_size=2, eos_token_ids=[first])
    assert [g.tokens for g in got] == [generate(target, None, p, 1).tokens for p in prompts[:3]]


def test_a_seed_per_prompt_samples_as_batch_one_with_that_seed(setup) -> None:
    """``seeds``: each row samples as ``generate`` with its own seed (the chi-square tests draw their samples so);
    a seed count that is not the prompt count is one line."""
    model, _, prompts, eos, _ = setup
    target = StaticTarget(model, [])
    sampling = SamplingConfig(temperature=1.0)
    got = generate_batch(target, None, [prompts[0]] * 3, 6, batch_size=3, sampling=sampling, seeds=[4, 5, 4])
    want = [generate(target, None, prompts[0], 6, SamplingConfig(temperature=1.0, seed=s)).tokens for s in (4, 5)]
    assert [g.tokens for g in got] == [want[0], want[1], want[0]] and want[0] != want[1]
    with pytest.raises(ValueError, match=r"^stream_seeds: 2 seeds for 3 streams$"):
        generate_batch(target, None, prompts[:3], 6, batch_size=2, sampling=sampling, seeds=[1, 2])


@pytest.mark.slow
@pytest.mark.parametrize("drafter_kind", ["dflash", "eagle3"])
def test_sampled_drafters_draw_each_rows_noise_from_its_own_seed(setup, drafter_kind) -> None:
    """Rows of one seed draw in lockstep, so a batch drafting a row with another row's noise passed the sampled batch
    tests: with a seed a row, each row's tokens and accepted counts are its own seed's at batch 1."""
    prompts = setup[2][:3]
    target, drafter = make_drafter(setup, drafter_kind)
    seeds = [4, 5, 6]
    want = [generate(target, drafter, p, 16, SamplingConfig(temperature=0.8, seed=s), eos_token_ids=setup[3]) for p, s in zip(prompts, seeds)]
    got = generate_batch(target, drafter, prompts, 16, batch_size=3, sampling=SamplingConfig(temperature=0.8), eos_token_ids=setup[3],
                         seeds=seeds)
    assert [(g.tokens, g.stats.accepted_per_step) for g in got] == [(w.tokens, w.stats.accepted_per_step) for w in want]
    assert accepted_some(want, 1)


@pytest.mark.parametrize("kwargs,message", [
    ({"max_new_tokens": 0}, r"^max_new_tokens=0; expected an integer >= 1$"),
    ({"batch_size": 0}, r"^batch_size=0; expected an integer >= 1$"),
    ({"batch_size": -1}, r"^batch_size=-1; expected an integer >= 1$"),
    ({"prefill_chunk": 0}, r"^prefill_chunk=0; expected an integer >= 1$"),
    ({"prompts": []}, r"^prompts: none given; expected at least one prompt$"),
])
def test_bad_numbers_are_refused_in_one_line(setup, kwargs, message) -> None:
    """The batched loop called as a library (the CLIs check their own flags): what ``generate`` refuses at batch 1 is
    refused here too, in one line naming the argument (before: empty generations, [None] results, a torch error)."""
    model, _, prompts, _, _ = setup
    args = {"prompts": prompts[:2], "max_new_tokens": 4, "batch_size": 2, **kwargs}
    with pytest.raises(ValueError, match=message):
        generate_batch(StaticTarget(model, []), None, args.pop("prompts"), args.pop("max_new_tokens"), **args)


def test_eager_eagle3_and_trees_are_refused_at_batch_sizes_above_one(setup) -> None:
    model = setup[0]
    config = make_eagle3_config(model.config, num_hidden_layers=1, target_layer_ids=[1, 3, 4], layer_types=["full_attention"],
                                sliding_window=None, draft_vocab_size=8192)
    runs = (r"--batch-size 4: batched decoding runs DFlash and EAGLE-3 blocks, chains and trees \(their static drafters\), prompt lookup or "
            "the target alone; ")
    with pytest.raises(ValueError, match=runs + "Eagle3Drafter runs at --batch-size 1"):
        check_batchable(Eagle3Drafter(Eagle3DraftModel(config)), 4)  # the eager chain drafter (FlashInfer attention)
    with pytest.raises(ValueError, match=runs + r"the eager EAGLE-3 drafter \(Eagle3Drafter\) runs at --batch-size 1"):
        check_batchable(Eagle3Drafter(Eagle3DraftModel(config), tree_topk=2, tree_tokens=4), 4)
    check_batchable(StaticEagle3Drafter(Eagle3DraftModel(config)), 4)
    check_batchable(StaticEagle3Drafter(Eagle3DraftModel(config), tree_topk=2, tree_tokens=4, tree_lookup=3), 4)


@pytest.mark.slow  # the quick tier stays under 3 minutes (README); the full suite runs it
@pytest.mark.parametrize("drafter_kind", ["dflash", "eagle3"])
def test_eval_batched_records_equal_batch_one(setup, reference_tokenizer, tmp_path, drafter_kind) -> None:
    from infer.prompts import mt_bench
    from eval.runner import run_conversations

    eos = setup[3]
    target, drafter = make_drafter(setup, drafter_kind)
    conversations = mt_bench(3)
    kwargs = dict(prefill_tokens=0, sampling=SamplingConfig(), max_new_tokens=16, eos_token_ids=eos, baseline=True)
    want = run_conversations(target, drafter, reference_tokenizer, conversations, **kwargs)
    got = run_conversations(target, drafter, reference_tokenizer, conversations, batch_size=2, partial=tmp_path / "p.jsonl", **kwargs)
    key = lambda r: (r["id"], r["turn"])  # noqa: E731
    want, got = sorted(want, key=key), sorted(got, key=key)
    assert [(r["id"], r["turn"], r["prompt_tokens"], r["output_ids"], r["stats"]["accepted_per_step"], r["same_as_baseline"]) for r in got] == \
           [(r["id"], r["turn"], r["prompt_tokens"], r["output_ids"], r["stats"]["accepted_per_step"], r["same_as_baseline"]) for r in want]
    # a rerun reads every finished turn back (baseline included) and decodes nothing
    again = run_conversations(target, None, reference_tokenizer, conversations, batch_size=2, partial=tmp_path / "p.jsonl",
                              **{**kwargs, "baseline": False})
    assert sorted((r["id"], r["turn"], r["output_ids"]) for r in again) == sorted((r["id"], r["turn"], r["output_ids"]) for r in got)


@pytest.mark.slow  # worker processes
@pytest.mark.parametrize("drafter_kind", ["pld", "dflash", "none"])
def test_eval_records_from_cpu_workers_equal_batch_one(setup, reference_tokenizer, tmp_path, drafter_kind) -> None:
    """``--cpu-workers``: a batched CPU run split over forked one-thread processes (rows shared out, each free row
    claiming the next conversation from a shared counter) gives batch 1's records: tokens, accepted counts and prompts,
    with a filler document before each first turn (its offset follows the conversation's index in the whole set); every
    turn reaches the partial file exactly once (a conversation claimed twice would write its turns twice), and a rerun
    reads them back."""
    from infer.prompts import mt_bench
    from eval.runner import run_conversations

    target, drafter = make_drafter(setup, drafter_kind)
    conversations = mt_bench(5)
    kwargs = dict(prefill_tokens=40, sampling=SamplingConfig(), max_new_tokens=12, eos_token_ids=setup[3], baseline=False)
    want = run_conversations(target, drafter, reference_tokenizer, conversations, **kwargs)
    got = run_conversations(target, drafter, reference_tokenizer, conversations, batch_size=4, workers=2, partial=tmp_path / "p.jsonl",
                            **kwargs)
    key = lambda r: (r["id"], r["turn"])  # noqa: E731
    fields = lambda rs: [(r["id"], r["turn"], r["prompt_tokens"], r["output_ids"], r["stats"]["accepted_per_step"])  # noqa: E731
                         for r in sorted(rs, key=key)]
    assert fields(got) == fields(want) and len(got) == 10
    assert {r["stats"]["batch"]["workers"] for r in got} == {2}
    written = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert fields(written) == fields(want)
    again = run_conversations(target, drafter, reference_tokenizer, conversations, batch_size=4, workers=2, partial=tmp_path / "p.jsonl",
                              **kwargs)
    assert fields(again) == fields(want) and all("batch" not in r["stats"] or r["stats"]["batch"]["pass_tokens"] > 0 for r in again)


@pytest.mark.slow  # worker processes
def test_the_baseline_of_a_pass_in_cpu_workers_runs_in_them_too(setup, reference_tokenizer, monkeypatch) -> None:
    """Found by review (2026-12-06's third session): with ``--cpu-workers``, the drafter pass ran in forked one-thread
    processes and its autoregressive baseline in this process on its threads: the speedup column compared two setups
    (on a loaded 2-core machine 40x). The baseline now runs in the same workers, in no other process: its tokens are
    the target's greedy tokens (batch 1's), each record says so."""
    import os

    from infer.prompts import mt_bench
    from eval import runner

    target, drafter = make_drafter(setup, "pld")
    conversations = mt_bench(3)
    kwargs = dict(prefill_tokens=0, sampling=SamplingConfig(), max_new_tokens=10, eos_token_ids=setup[3])
    want = runner.run_conversations(target, None, reference_tokenizer, conversations, baseline=False, **kwargs)
    import infer.batch as batch

    real, pids = batch.generate_batch, []
    monkeypatch.setattr(batch, "generate_batch", lambda *a, **k: pids.append(os.getpid()) or real(*a, **k))
    got = runner.run_conversations(target, drafter, reference_tokenizer, conversations, baseline=True, batch_size=4, workers=2, **kwargs)
    assert pids == []  # no baseline decoded in this process (the workers' calls are in theirs)
    by_turn = {(r["id"], r["turn"]): r["output_ids"] for r in want}
    assert len(got) == 6 and all(r["same_as_baseline"] and r["baseline_stats"]["workers"] == 2 for r in got)
    assert all(r["output_ids"] == by_turn[(r["id"], r["turn"])] for r in got)


def test_a_cpu_worker_error_reaches_the_caller(setup, reference_tokenizer) -> None:
    """A worker's exception comes back to the caller instead of a hang: bad input (here a turn that cannot fit the
    target's positions) as the one-line ValueError the one-process run raises."""
    from infer.prompts import mt_bench
    from eval.runner import max_positions, run_conversations

    target, drafter = make_drafter(setup, "pld")
    conversations = mt_bench(2)
    limit = max_positions(target)
    with pytest.raises(ValueError, match=r"^question \S+ turn 1: \d+ prompt \+ 128 new tokens exceed the target's max_position_embeddings"):
        run_conversations(target, drafter, reference_tokenizer, conversations, prefill_tokens=limit - 64, sampling=SamplingConfig(),
                          max_new_tokens=128, eos_token_ids=setup[3], baseline=False, batch_size=2, workers=2)


@pytest.mark.slow  # worker processes
def test_a_cpu_worker_crash_or_death_is_an_error_not_a_hang(setup, reference_tokenizer, monkeypatch) -> None:
    """Any other exception in a worker: a RuntimeError naming it with the worker's traceback; a worker that dies without
    a word (killed, say): a RuntimeError with its exit code, after the parent's next 5-second wait."""
    import os

    from infer.prompts import mt_bench
    from eval import runner

    target, drafter = make_drafter(setup, "pld")
    args = (target, drafter, reference_tokenizer, mt_bench(2))
    kwargs = dict(prefill_tokens=0, sampling=SamplingConfig(), max_new_tokens=8, eos_token_ids=setup[3], baseline=False, batch_size=2,
                  workers=2)

    def crash(*a, **k):
        raise ZeroDivisionError("a bug in a worker")

    monkeypatch.setattr(runner, "decode_batched", crash)  # forked workers inherit the patched module
    with pytest.raises(RuntimeError, match=r"(?s)CPU worker \d failed with ZeroDivisionError: a bug in a worker\n.*Traceback"):
        runner.run_conversations(*args, **kwargs)
    for code in (3, 0):  # killed, or gone quietly
        monkeypatch.setattr(runner, "decode_batched", lambda *a, **k: os._exit(code))
        with pytest.raises(RuntimeError, match=rf"a CPU worker process died \(exit code {code}\) before sending its records"):
            runner.run_conversations(*args, **kwargs)


def test_cpu_workers_auto_and_refusals(monkeypatch) -> None:
    """Auto: one worker per core when the batch gives every core 4 rows and --threads is unset; otherwise one process.
    Refused in one line: workers off the CPU, more workers than rows, workers with --threads above 1."""
    from eval import runner
    from infer import loading

    monkeypatch.setattr(loading, "DEFAULT_THREADS", 2)  # a 2-core machine
    assert runner.cpu_workers("cpu", 8, None) == 2
    assert runner.cpu_workers("cpu", 7, None) == 1  # 3.5 rows a core
    assert runner.cpu_workers("cpu", 8, 2) == 1 and runner.cpu_workers("cpu", 8, None, 1) == 1
    assert runner.cpu_workers("cpu", 1, None) == 1 and runner.cpu_workers("cuda", 16, None) == 1
    assert runner.cpu_workers("cpu", 8, 1, 4) == 4
    monkeypatch.setattr(runner.sys, "platform", "darwin")
    assert runner.cpu_workers("cpu", 8, None) == 1  # auto forks on Linux only
    monkeypatch.setattr(runner.sys, "platform", "linux")
    monkeypatch.setattr(loading, "DEFAULT_THREADS", 16)
    assert runner.cpu_workers("cpu", 8, None) == 1  # a big machine: one process on all its threads
    with pytest.raises(ValueError, match=r"--cpu-workers 2: worker processes split a batched run on the CPU; this run is on cuda"):
        runner.cpu_workers("cuda", 8, None, 2)
    with pytest.raises(ValueError, match=r"--cpu-workers 9; expected 1 to the batch size \(8\)"):
        runner.cpu_workers("cpu", 8, None, 9)
    with pytest.raises(ValueError, match=r"--cpu-workers 2 with --threads 2: workers are forked processes on one thread each"):
        runner.cpu_workers("cpu", 8, 2, 2)


def test_prepacked_linears_give_the_plain_matrices_tokens(setup) -> None:
    """The CPU default (oneDNN-prepacked copies of the linears, attention up to the furthest row only) against the plain
    matrices: logits of a batched step agree to fp32 rounding, and every batched row's tokens are the same."""
    model, _, prompts, eos, _ = setup
    packed, plain = StaticTarget(model, [1, 3]), StaticTarget(model, [1, 3], prepack=False)
    assert packed.linear is not plain.linear  # the default on the CPU in fp32 is prepacked
    for target in (packed, plain):
        target.allocate(128, batch=3)
        for row, p in enumerate(prompts[:3]):
            target.prefill(torch.tensor(p), row, 0)
    ids = torch.tensor([p[-4:] for p in prompts[:3]])
    pos = torch.tensor([len(p) for p in prompts[:3]])
    (got, got_features), (want, want_features) = packed.step(ids, pos), plain.step(ids, pos)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got_features, want_features, rtol=1e-4, atol=1e-4)
    got = generate_batch(packed, None, prompts, 24, batch_size=3, eos_token_ids=eos)
    want = generate_batch(plain, None, prompts, 24, batch_size=3, eos_token_ids=eos)
    assert [g.tokens for g in got] == [w.tokens for w in want]


@pytest.mark.slow  # the quick tier stays under 3 minutes (README); the full suite runs it
@pytest.mark.parametrize("drafter_kind", ["pld", "dflash", "eagle3"])
def test_batched_rows_on_two_threads_equal_batch_one_on_one(setup, drafter_kind) -> None:
    """eval's CPU default (infer.loading.set_threads) for a tiny target: 1 thread at batch 1, one per core when batched.
    The thread count changes speed, not tokens: batched rows on 2 threads against batch 1 on 1 (greedy, tokens and
    accepted counts)."""
    from infer.loading import set_threads

    prompts, eos = setup[2], setup[3]
    target, drafter = make_drafter(setup, drafter_kind)
    set_threads("cpu", None, batch_size=1)
    assert torch.get_num_threads() == 1
    want = batch_one(setup, drafter_kind, prompts, 24, eos=eos)  # on one thread (its key holds the thread count)
    torch.set_num_threads(2)
    try:
        got = generate_batch(target, drafter, prompts, 24, batch_size=3, eos_token_ids=eos)
    finally:
        torch.set_num_threads(1)
    assert [(g.tokens, g.stats.accepted_per_step) for g in got] == [(w.tokens, w.stats.accepted_per_step) for w in want]


def test_eval_threads_default_by_batch_size_and_target_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """``set_threads``: one per core when batched; at batch 1 one per core from ``ONE_THREAD_BELOW_PARAMS`` target
    parameters on, else (and before a target is loaded) one; ``--threads`` over both."""
    from infer import loading
    from infer.loading import ONE_THREAD_BELOW_PARAMS, set_threads

    # one per core = torch's default at import, 1 in the test workers (OMP_NUM_THREADS=1): a count both cases can tell apart
    monkeypatch.setattr(loading, "DEFAULT_THREADS", 3)
    DEFAULT_THREADS = 3
    small = torch.nn.Linear(ONE_THREAD_BELOW_PARAMS // 1000 - 1, 1000, bias=False)  # one row short of the line: 1 thread
    large = torch.nn.Linear(ONE_THREAD_BELOW_PARAMS // 1000, 1000, bias=False)  # at the line: one per core
    assert sum(p.numel() for p in small.parameters()) < ONE_THREAD_BELOW_PARAMS <= sum(p.numel() for p in large.parameters())
    before = torch.get_num_threads()
    try:
        set_threads("cpu", None, batch_size=8)
        assert torch.get_num_threads() == DEFAULT_THREADS
        set_threads("cpu", None, batch_size=8, target_model=small)
        assert torch.get_num_threads() == DEFAULT_THREADS
        set_threads("cpu", None, batch_size=1)  # before the target is loaded
        assert torch.get_num_threads() == 1
        set_threads("cpu", None, batch_size=1, target_model=small)
        assert torch.get_num_threads() == 1
        set_threads("cpu", None, batch_size=1, target_model=large)
        assert torch.get_num_threads() == DEFAULT_THREADS
        set_threads("cpu", 3, batch_size=1, target_model=large)  # --threads wins
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


# ---------------------------------------------------------------------------------------- prefix reuse across turns

def second_turns(prompts: list[list[int]], replies: list[list[int]], tokenizer) -> list[list[int]]:
    """A next turn per conversation as eval builds it: the first prompt, the reply, a new user question."""
    follow = ["Now say it in one line.", "Why?", "And in Asia?", "Make it shorter.", "Add a test."]
    out = []
    for p, r, q in zip(prompts, replies, follow):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        out.append(p + [t for t in r if t != end] + [end] + tokenizer("\n")["input_ids"] + ids)
    return out


def test_prefilling_rows_past_cached_prefixes_equals_the_model_on_whole_prompts(setup) -> None:
    """``prefill_rows`` with starts (rows continue prefixes their caches hold; one row from 0) against the HF model's
    own forward over the whole prompts: the last token's logits, every prompt position's features, and the cached keys
    of a whole-prompt prefill (fp32)."""
    model, _, prompts, _, _ = setup
    batched, whole = StaticTarget(model, [1, 3]), StaticTarget(model, [1, 3])
    for target in (batched, whole):
        target.allocate(128, batch=4)
    rows, starts = [3, 0, 1], [9, 0, len(prompts[2]) - 1]
    for r, j in zip(rows, range(3)):  # whole prompts into `whole`; the prefixes alone into `batched`
        whole.prefill(torch.tensor(prompts[j]), r, 0)
        if starts[j]:
            batched.prefill(torch.tensor(prompts[j][:starts[j]]), r, 0)
    logits, features = batched.prefill_rows([torch.tensor(prompts[j][starts[j]:]) for j in range(3)], rows, starts)
    for j, r in enumerate(rows):
        n = len(prompts[j])
        ref = model(torch.tensor([prompts[j]]), output_hidden_states=True)
        torch.testing.assert_close(logits[j], ref.logits[0, -1], rtol=1e-4, atol=1e-4)
        want_features = torch.cat([ref.hidden_states[i + 1][0, starts[j]:] for i in (1, 3)], dim=-1)
        torch.testing.assert_close(features[j, :n - starts[j]], want_features, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(batched.k_cache[:, r, :, :n], whole.k_cache[:, r, :, :n], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(batched.v_cache[:, r, :, :n], whole.v_cache[:, r, :, :n], rtol=1e-5, atol=1e-5)
    assert batched.k_cache[:, 2].abs().sum() == 0  # the row not named is untouched
    assert batched.k_cache[:, 1, :, len(prompts[2]):].abs().sum() == 0  # past a prefix only real tokens are written


@pytest.mark.slow  # the quick tier stays under 3 minutes (README); the full suite runs it
@pytest.mark.parametrize("drafter_kind", ["none", "pld"])
def test_a_next_turn_reuses_the_cached_turn_and_gives_the_tokens_of_a_fresh_prefill(setup, reference_tokenizer, drafter_kind) -> None:
    """``generate(cached_ids=...)``: turn 2 prefills only past its common prefix with turn 1's cached tokens (the first
    prompt and the reply, all but its newest token), also when the caches must grow (the prefix copied), and its tokens
    and accepted counts are those of turn 2 prefilled whole on a fresh target."""
    prompts, eos = setup[2][:3], setup[3]
    target, drafter = make_drafter(setup, drafter_kind)
    first = [generate(target, drafter, p, 24, eos_token_ids=eos) for p in prompts]
    nexts = second_turns(prompts, [f.tokens for f in first], reference_tokenizer)
    nexts[2] = nexts[2] + nexts[2] * 6  # a much longer prompt: new buffers, the prefix copied into them
    fresh, drafter2 = make_drafter(setup, drafter_kind)
    for p, f, q in zip(prompts, first, nexts):
        generate(target, drafter, p, 24, eos_token_ids=eos)  # the cache holds this turn again
        got = generate(target, drafter, q, 24, eos_token_ids=eos, cached_ids=f.cache_ids)
        want = generate(fresh, drafter2, q, 24, eos_token_ids=eos)
        assert (got.tokens, got.stats.accepted_per_step) == (want.tokens, want.stats.accepted_per_step)
        reply = [t for t in f.tokens if t not in eos]
        assert got.stats.reused_tokens == len(p) + min(len(reply), len(f.cache_ids) - len(p)) > len(p)
        assert want.stats.reused_tokens == 0
    assert f.cache_ids == p + f.tokens[:len(f.cache_ids) - len(p)] and len(f.cache_ids) == len(p) + sum(a + 1 for a in f.stats.untrimmed_steps)


def held_context(drafter, row: int, below: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per layer of a static drafter, the positions < ``below`` row ``row``'s context holds (sorted) and their keys and
    values (DFlash: slot positions per rule; EAGLE-3: per layer)."""
    slot_pos = [drafter.slot_pos[rule] for rule in drafter.rules] if isinstance(drafter, StaticDFlashDrafter) else drafter.slot_pos
    out = []
    for positions, k_buf, v_buf in zip(slot_pos, drafter.k, drafter.v):
        held = positions[row]
        slots = ((held >= 0) & (held < below)).nonzero()[:, 0]
        slots = slots[held[slots].argsort()]
        out.append((held[slots], k_buf[row, :, slots], v_buf[row, :, slots]))
    return out


def assert_same_context(got: list, want: list) -> None:
    for (pos_a, k_a, v_a), (pos_b, k_b, v_b) in zip(got, want):
        assert pos_a.tolist() == pos_b.tolist()
        torch.testing.assert_close(k_a, k_b, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(v_a, v_b, rtol=1e-4, atol=1e-4)


# the default suite: each drafter greedy on the first prompt and sampled on the second; the three prompts greedy and
# sampled (~15 s a prompt and drafter on 2 cores) only under -m long. The quick tier keeps the batched prefill's reuse
# (`test_static_drafter_rows_reuse_their_context_through_the_batched_prefill`, DFlash)
@pytest.mark.slow
@pytest.mark.parametrize("drafter_kind", ["dflash", "eagle3"])
@pytest.mark.parametrize("temperature,prompt_ids", [
    pytest.param(0.0, (0,), id="greedy-p0"), pytest.param(0.8, (1,), id="sampled-p1"),
    pytest.param(0.0, (0, 1, 2), marks=pytest.mark.long, id="greedy-p012"),
    pytest.param(0.8, (0, 1, 2), marks=pytest.mark.long, id="sampled-p012")])
def test_static_drafters_next_turn_reuses_their_context_and_equals_a_fresh_prefill(setup, reference_tokenizer, drafter_kind,
                                                                                    temperature, prompt_ids) -> None:
    """The static drafters keep a turn's context for the next (batch 1, ``cached_ids``; DFlash's test config has a ring
    layer of window 6 and a full layer, EAGLE-3's a ring of window 1 and a full layer, its bigram head accepting often).
    Turn 2 prefills past the prefix and gives the tokens and accepted counts of a fresh target and drafter prefilling it
    whole, and the drafter's context (every held position's keys and values, every layer) equals the fresh one's.
    Between the turns a baseline generation (no drafter) rewrites the target's cache, as eval's baseline does (sampled,
    its tokens differ): the reuse stops where the drafter's own tokens (``context_ids``) stop matching. EAGLE-3 resumes
    a position earlier (its keys are made with the next token) and no later than its pending block (later keys may be
    rejected drafts'). A prompt whose window reads positions DFlash's ring has written over (a short prompt sharing an
    early prefix) reuses nothing; one whose window it holds reuses its prefix."""
    prompts, eos = [setup[2][i] for i in prompt_ids], setup[3]
    sampling = SamplingConfig(temperature=temperature, seed=7)
    target, drafter = make_drafter(setup, drafter_kind)
    dflash, accepted = drafter_kind == "dflash", []
    if dflash:
        assert drafter.rules[0].window == 6 and drafter.rules[1].window is None
    for p in prompts:
        one = generate(target, drafter, p, 24, sampling, eos_token_ids=eos)
        pending = None if dflash else int(drafter.pending_start[0])
        base = generate(target, None, p, 24, sampling, eos_token_ids=eos, cached_ids=one.cache_ids)
        q = second_turns([p], [one.tokens], reference_tokenizer)[0]
        ring_lost = one.cache_ids[:20] + [one.cache_ids[5]] * 2  # DFlash's window reads positions 16 .. 19, long written over
        ring_held = one.cache_ids[:-2] + [one.cache_ids[5]]  # its window reads the newest positions
        cases = [(q, base.cache_ids), (q, one.cache_ids), (ring_lost, one.cache_ids), (ring_held, one.cache_ids)]
        for i, (prompt, cached) in enumerate(cases):
            if i:  # the caches hold turn 1 again
                generate(target, drafter, p, 24, sampling, eos_token_ids=eos)
            got = generate(target, drafter, prompt, 24, sampling, eos_token_ids=eos, cached_ids=cached)
            fresh_target, fresh = make_drafter(setup, drafter_kind)
            want = generate(fresh_target, fresh, prompt, 24, sampling, eos_token_ids=eos)
            assert (got.tokens, got.stats.accepted_per_step) == (want.tokens, want.stats.accepted_per_step)
            assert_same_context(held_context(drafter, 0, len(got.cache_ids)), held_context(fresh, 0, len(want.cache_ids)))
            accepted += got.stats.accepted_per_step
            common = min(common_prefix(cached, prompt), common_prefix(one.cache_ids, prompt), len(prompt) - 1)
            lost = dflash and prompt is ring_lost
            assert got.stats.reused_tokens == (0 if lost else common if dflash else min(common - 1, pending))
            assert (len(prompt) - 6 < common) if lost else (prompt is not q or got.stats.reused_tokens >= len(p))
        if temperature > 0:  # the baseline's sampled reply differs: the target's cache alone would have claimed more
            assert common_prefix(base.cache_ids, one.cache_ids) < len(one.cache_ids)
    if not dflash:  # its drafts are accepted: the kept context is what they read
        assert any(a > 0 for a in accepted)


@pytest.mark.parametrize("drafter_kind", ["dflash", pytest.param("eagle3", marks=pytest.mark.slow)])
def test_static_drafter_rows_reuse_their_context_through_the_batched_prefill(setup, reference_tokenizer, drafter_kind) -> None:
    """``generate_streams``' own prefill path (rows prefilled together past their kept prefixes, the drafter fed from
    there): when a row finishes turn 2, its drafter's context over turn 2's prompt equals a fresh drafter's after a whole
    prefill of that prompt at batch 1, with the same tokens and accepted counts, and turn 2 reused turn 1."""
    from infer.batch import generate_streams

    prompts, eos = setup[2][:3], setup[3]
    target, drafter = make_drafter(setup, drafter_kind)
    got, contexts = {}, {}

    def driver(stream, finished):
        if finished is None:
            return prompts[stream]
        got.setdefault(stream, []).append(finished)
        if len(got[stream]) == 1:
            return second_turns([prompts[stream]], [finished.tokens], reference_tokenizer)[0]
        q = second_turns([prompts[stream]], [got[stream][0].tokens], reference_tokenizer)[0]
        contexts[stream] = (q, held_context(drafter, 0, len(q)))  # one row: every stream's turns in row 0
        return None

    generate_streams(target, drafter, driver, len(prompts), batch_size=1, capacity=512, max_new_tokens=24, eos_token_ids=eos)
    for s, (q, context) in contexts.items():
        fresh_target, fresh = make_drafter(setup, drafter_kind)
        want = generate(fresh_target, fresh, q, 24, eos_token_ids=eos)
        assert (got[s][1].tokens, got[s][1].stats.accepted_per_step) == (want.tokens, want.stats.accepted_per_step)
        assert_same_context(context, held_context(fresh, 0, len(q)))
        assert got[s][1].stats.reused_tokens > len(prompts[s])
    assert len(contexts) == len(prompts)


_TWO_TURNS: dict[str, tuple[list, list]] = {}


def two_turns_at_batch_one(setup, reference_tokenizer, drafter_kind: str) -> tuple[list, list]:
    """Batch 1's references for two-turn streams of ``setup``'s prompts: (per prompt [turn 1, turn 2 reusing turn 1's
    cache]; per prompt turn 2 prefilled whole by a fresh target). Computed once per drafter kind in this module (the
    prefill chunkings' cases compare against the same references; 6-15 s a drafter on one core)."""
    if drafter_kind not in _TWO_TURNS:
        prompts, eos = setup[2], setup[3]
        target, drafter = make_drafter(setup, drafter_kind)
        want, alone = [], []
        for p in prompts:
            one = generate(target, drafter, p, 24, eos_token_ids=eos)
            q = second_turns([p], [one.tokens], reference_tokenizer)[0]
            two = generate(target, drafter, q, 24, eos_token_ids=eos, cached_ids=one.cache_ids)
            assert two.stats.reused_tokens > len(p)
            want.append([one, two])
            alone.append(generate(make_drafter(setup, drafter_kind)[0], drafter, q, 24, eos_token_ids=eos))
        _TWO_TURNS[drafter_kind] = want, alone
    return _TWO_TURNS[drafter_kind]


@pytest.mark.slow  # ~14 s a case on one core; the quick tier keeps two-turn streams on one row
# (test_static_drafter_rows_reuse_their_context_through_the_batched_prefill) and the draining batch of three rows
@pytest.mark.parametrize("drafter_kind", ["none", "pld", "dflash", "eagle3"])
@pytest.mark.parametrize("prefill_chunk", [4096, 48])
def test_batched_turns_reuse_their_rows_and_equal_batch_one(setup, reference_tokenizer, drafter_kind, prefill_chunk, monkeypatch) -> None:
    """Two-turn streams, 3 rows, rows refilled in waves of 2 (a finished row waits, stepping idle past its cached
    tokens, before its next turn is prefilled): turn 2 prefills only past its row's cached turn 1, and every turn's
    tokens and accepted counts equal batch 1 with reuse and batch 1 prefilling every prompt whole. With 48-token
    prefill chunks every turn 2 (cached prefix + suffix past 48) is prefilled alone, chunk by chunk from its prefix."""
    from infer.batch import generate_streams

    prompts, eos = setup[2], setup[3]
    want, alone = two_turns_at_batch_one(setup, reference_tokenizer, drafter_kind)
    target, drafter = make_drafter(setup, drafter_kind)
    got = {}

    def driver(stream, finished):
        if finished is None:
            return prompts[stream]
        got.setdefault(stream, []).append(finished)
        return second_turns([prompts[stream]], [finished.tokens], reference_tokenizer)[0] if len(got[stream]) == 1 else None

    starts, prefill = [], target.prefill
    monkeypatch.setattr(target, "prefill", lambda ids, row, start, *a, **k: starts.append(start) or prefill(ids, row, start, *a, **k))
    generate_streams(target, drafter, driver, len(prompts), batch_size=3, capacity=512, max_new_tokens=24, eos_token_ids=eos, refill_wave=2,
                     prefill_chunk=prefill_chunk)
    assert (min(starts, default=0) > 0) if prefill_chunk == 48 else not starts  # past a prefix, chunk by chunk; else grouped
    for s in range(len(prompts)):
        assert [(g.tokens, g.stats.accepted_per_step) for g in got[s]] == [(w.tokens, w.stats.accepted_per_step) for w in want[s]]
        # a row that ran past its budget (the target alone steps in runs) holds a few more tokens than batch 1's cache
        assert got[s][1].stats.reused_tokens >= want[s][1].stats.reused_tokens > len(prompts[s])
        assert (want[s][1].tokens, want[s][1].stats.accepted_per_step) == (alone[s].tokens, alone[s].stats.accepted_per_step)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("drafter_kind", ["none", "pld", "dflash", "eagle3"])
def test_captured_rows_reuse_their_turns_on_a_gpu(setup, reference_tokenizer, drafter_kind) -> None:
    """The captured target (CUDA graphs, fp32): two-turn streams with reuse give the tokens and accepted counts of the
    same streams prefilled whole, at batch 3 (idle rows parked past their cached turns in the captured steps) and at
    batch 1 (``cached_ids``), and turn 2 reused its turn 1. The static drafters: their steps captured too, their
    contexts kept with the prefix."""
    import copy

    from infer.batch import generate_streams

    model = copy.deepcopy(setup[0]).cuda()
    prompts, eos = setup[2], setup[3]
    drafter = {"none": None, "pld": PromptLookupDrafter(num_draft_tokens=3, vocab_size=8192),
               "dflash": StaticDFlashDrafter(copy.deepcopy(setup[1]).cuda(), model.get_input_embeddings(), model.get_output_embeddings(),
                                             compile=False),
               "eagle3": StaticEagle3Drafter(copy.deepcopy(setup[4]).cuda(), compile=False)}[drafter_kind]
    layers = {"dflash": [1, 3], "eagle3": [1, 3, 4]}.get(drafter_kind, [])

    def run(reuse: bool) -> dict:
        target, got = StaticTarget(model, layers), {}

        def driver(stream, finished):
            if finished is None:
                return prompts[stream]
            got.setdefault(stream, []).append(finished)
            return second_turns([prompts[stream]], [finished.tokens], reference_tokenizer)[0] if len(got[stream]) == 1 else None

        generate_streams(target, drafter, driver, len(prompts), batch_size=3, capacity=512, max_new_tokens=24, eos_token_ids=eos,
                         refill_wave=2, reuse_prefixes=reuse)
        return got

    reused, whole = run(True), run(False)
    target = StaticTarget(model, layers)
    for s, p in enumerate(prompts):
        assert [(g.tokens, g.stats.accepted_per_step) for g in reused[s]] == [(g.tokens, g.stats.accepted_per_step) for g in whole[s]]
        assert reused[s][1].stats.reused_tokens > len(p) and whole[s][1].stats.reused_tokens == 0
        one = generate(target, drafter, p, 24, eos_token_ids=eos)
        two = generate(target, drafter, second_turns([p], [one.tokens], reference_tokenizer)[0], 24, eos_token_ids=eos, cached_ids=one.cache_ids)
        assert two.stats.reused_tokens > len(p)
        assert (two.tokens, two.stats.accepted_per_step) == (whole[s][1].tokens, whole[s][1].stats.accepted_per_step)


@pytest.mark.slow  # ~20 s on one core; the quick tier keeps the static trees against the model (test_static_eagle3_trees, test_dflash_trees)
@pytest.mark.parametrize("drafter_kind", ["dflash", "eagle3"])
def test_batch_one_trees_on_the_static_drafters_equal_the_eager_trees_and_reuse_their_turns(setup, reference_tokenizer, drafter_kind) -> None:
    """``generate`` with a static drafter's trees (``generate_tree_row``: the batched tree step on one row, what
    ``load_models`` builds for trees at batch 1 now) against the eager drafter's trees (``tree_step``, the reference loop
    it replaced) on each prompt: the same tokens and accepted counts, with prompt lookup's chain joining the tree. Turn 2
    with ``cached_ids`` prefills past turn 1 (its ``cache_ids``: what the row's caches hold) and gives the tokens of the
    eager drafter and of a fresh static one prefilling it whole; the drafter's context equals the fresh one's. A
    baseline run between the turns (the target alone) bounds the reuse by what the drafter's context saw."""
    model, dflash, prompts, eos, eagle3 = setup
    trees = dict(tree_topk=2, tree_tokens=6, tree_lookup=3)

    def pair():
        if drafter_kind == "eagle3":
            return StaticTarget(model, [1, 3, 4]), StaticEagle3Drafter(eagle3, **trees), Eagle3Drafter(eagle3, **trees)
        embed, head = model.get_input_embeddings(), model.get_output_embeddings()
        return (StaticTarget(model, [1, 3]), StaticDFlashDrafter(dflash, embed, head, **trees),
                DFlashDrafter(dflash, embed, head, **trees))

    target, static, eager = pair()
    accepted = []
    for p in prompts[:3]:
        one = generate(target, static, p, 24, eos_token_ids=eos)
        ref = generate(target, eager, p, 24, eos_token_ids=eos)
        assert (one.tokens, one.stats.accepted_per_step) == (ref.tokens, ref.stats.accepted_per_step)
        generate(target, static, p, 24, eos_token_ids=eos)  # the caches hold turn 1 again
        assert static.context_ids == one.cache_ids
        base = generate(target, None, p, 30, eos_token_ids=eos, cached_ids=one.cache_ids)  # longer: more than the drafter saw
        # the caches hold the prompt and the target's own tokens: the reply's, and where the last step accepted drafts
        # past the budget (the reply cut there, the counts too), those as well
        assert one.cache_ids == (p + base.tokens)[:len(one.cache_ids)] and len(one.cache_ids) >= len(p) + len(one.tokens) - 1
        q = second_turns([p], [one.tokens], reference_tokenizer)[0]
        got = generate(target, static, q, 24, eos_token_ids=eos, cached_ids=base.cache_ids)
        fresh_target, fresh, fresh_eager = pair()
        want = generate(fresh_target, fresh, q, 24, eos_token_ids=eos)
        eager_two = generate(fresh_target, fresh_eager, q, 24, eos_token_ids=eos)
        assert (got.tokens, got.stats.accepted_per_step) == (want.tokens, want.stats.accepted_per_step)
        assert (got.tokens, got.stats.accepted_per_step) == (eager_two.tokens, eager_two.stats.accepted_per_step)
        assert_same_context(held_context(static, 0, len(got.cache_ids)), held_context(fresh, 0, len(want.cache_ids)))
        assert len(p) < got.stats.reused_tokens <= common_prefix(one.cache_ids, q) and want.stats.reused_tokens == 0
        accepted += got.stats.accepted_per_step + one.stats.accepted_per_step
    assert any(a > 0 for a in accepted)
    with pytest.raises(ValueError, match="accept_per_step=1: needs a chain drafter"):  # checked before the trees take one row
        generate(target, static, prompts[0], 4, accept_per_step=1)


@pytest.mark.slow  # the quick tier stays under 3 minutes (README); the full suite runs it
def test_eval_batch_one_trees_turn_by_turn_and_on_one_row_give_the_eager_trees_records(setup, reference_tokenizer) -> None:
    """``run_conversations`` at batch 1 with a static drafter's trees: on the CPU turn by turn (``generate_tree_row``),
    on a captured target (a GPU) the batched runner on one row, called here directly; both give the eager tree drafter's
    records turn by turn (``run_turns``, ``generate`` per turn): tokens, accepted counts, the baseline check; turn 2
    reuses turn 1's caches."""
    from infer.prompts import mt_bench
    from eval.runner import run_conversations, run_conversations_batched

    model, _, _, eos, eagle3 = setup
    trees = dict(tree_topk=2, tree_tokens=6, tree_lookup=3)
    kwargs = dict(prefill_tokens=0, sampling=SamplingConfig(), max_new_tokens=16, eos_token_ids=eos, baseline=True)
    conversations = mt_bench(2)
    want = run_conversations(StaticTarget(model, [1, 3, 4]), Eagle3Drafter(eagle3, **trees), reference_tokenizer, conversations, **kwargs)
    turns = run_conversations(StaticTarget(model, [1, 3, 4]), StaticEagle3Drafter(eagle3, **trees), reference_tokenizer, conversations, **kwargs)
    rows = run_conversations_batched(StaticTarget(model, [1, 3, 4]), StaticEagle3Drafter(eagle3, **trees), reference_tokenizer, conversations,
                                     desc="rows", partial=None, batch_size=1, **kwargs)
    fields = lambda r: (r["id"], r["turn"], r["prompt_tokens"], r["output_ids"], r["stats"]["accepted_per_step"], r["same_as_baseline"])  # noqa: E731
    assert [fields(r) for r in turns] == [fields(r) for r in rows] == [fields(r) for r in want]
    assert all("batch" not in r["stats"] for r in turns) and all(r["stats"]["batch"]["size"] == 1 for r in rows)
    for got in (turns, rows):
        assert [r["stats"]["reused_tokens"] > r["prompt_tokens"] // 2 for r in got] == [False, True, False, True]
    assert all(r["same_as_baseline"] for r in want)


# the quick tier keeps the turn-by-turn warm-up (below); these decode two passes each (~10 s on a 2-core AMX Xeon)
@pytest.mark.parametrize("drafter_kind,temperature", [pytest.param("eagle3", 0.0, marks=pytest.mark.slow), pytest.param("pld", 0.0, marks=pytest.mark.slow),
                                                      pytest.param("eagle3", 0.8, marks=pytest.mark.slow),
                                                      pytest.param("dflash", 0.8, marks=pytest.mark.slow)])
def test_a_warmup_before_a_batched_pass_changes_no_record(setup, reference_tokenizer, tmp_path, drafter_kind, temperature) -> None:
    """``warmup=True`` (eval's default on a GPU): a few untimed steps of the pass's shapes first, for the drafter's pass and
    the baseline's; every record (tokens, accepted counts, the baseline check; sampled too: the warm-up draws from
    generators of its own) is the one without it, nothing of it reaches the partial file, and the summary says how long
    it took."""
    from infer.prompts import mt_bench
    from eval.report import summary_table
    from eval.runner import run_conversations, summarize

    eos = setup[3]
    kwargs = dict(prefill_tokens=0, sampling=SamplingConfig(temperature=temperature, seed=3), max_new_tokens=16, eos_token_ids=eos,
                  baseline=True, batch_size=2)
    conversations = mt_bench(3)
    got = {}
    for warm in (False, True):
        target, drafter = make_drafter(setup, drafter_kind)
        got[warm] = run_conversations(target, drafter, reference_tokenizer, conversations, partial=tmp_path / f"{warm}.jsonl", warmup=warm, **kwargs)
    fields = lambda r: (r["id"], r["turn"], r["output_ids"], r["stats"]["accepted_per_step"], r["same_as_baseline"])  # noqa: E731
    assert [fields(r) for r in got[True]] == [fields(r) for r in got[False]]
    # every line as written (a turn's line, then again with its baseline)
    lines = lambda warm: [json.loads(x) for x in (tmp_path / f"{warm}.jsonl").read_text().splitlines()]  # noqa: E731
    line_fields = lambda r: (r["id"], r["turn"], r["output_ids"], r["stats"]["accepted_per_step"], str(r.get("same_as_baseline")))  # noqa: E731
    assert sorted(map(line_fields, lines(True))) == sorted(map(line_fields, lines(False)))
    assert len(lines(True)) == 2 * len(got[True])
    assert all(r["stats"]["batch"]["warmup_s"] > 0 for r in got[True]) and all(r["stats"]["batch"]["warmup_s"] == 0 for r in got[False])
    assert all(r["baseline_stats"]["warmup_s"] > 0 for r in got[True]) and all(r["baseline_stats"]["warmup_s"] == 0 for r in got[False])
    assert "A warm-up of the pass's shapes took" in summary_table(summarize(got[True]), "t") and "the baseline's pass: " in summary_table(summarize(got[True]), "t")
    assert "warm-up" not in summary_table(summarize(got[False]), "t")


@pytest.mark.slow  # ~13 s on one core (a warm-up is a GPU run's; the CPU decodes cold)
@pytest.mark.parametrize("drafter_kind", ["dflash", "eagle3"])
def test_a_warmup_before_turn_by_turn_decoding_changes_no_record(setup, reference_tokenizer, drafter_kind) -> None:
    """Batch 1, turn by turn (``warm_up_turn``: the cell's first turn decoded once, untimed, by the drafter and the target
    alone): every record equals the one without it (the first timed turn reuses nothing of the warm-up, its cache record
    starting empty), and the records carry its seconds."""
    from infer.prompts import mt_bench
    from eval.report import summary_table
    from eval.runner import run_conversations, summarize

    kwargs = dict(prefill_tokens=0, sampling=SamplingConfig(), max_new_tokens=16, eos_token_ids=setup[3], baseline=True)
    got = {}
    for warm in (False, True):
        target, drafter = make_drafter(setup, drafter_kind)
        got[warm] = run_conversations(target, drafter, reference_tokenizer, mt_bench(2), warmup=warm, **kwargs)
    fields = lambda r: (r["id"], r["turn"], r["output_ids"], r["stats"]["accepted_per_step"], r["stats"]["reused_tokens"],  # noqa: E731
                        r["same_as_baseline"])
    assert [fields(r) for r in got[True]] == [fields(r) for r in got[False]]
    assert [r["stats"]["reused_tokens"] > 0 for r in got[True]] == [False, True, True, True]  # turn 1 of q82: the chat template's head
    assert all(r["stats"]["warmup_s"] > 0 for r in got[True]) and all(r["stats"]["warmup_s"] == 0 for r in got[False])
    assert "A warm-up of the pass's shapes took" in summary_table(summarize(got[True]), "t")


def test_chains_longer_than_a_batched_verify_takes_are_refused_before_decoding(setup) -> None:
    """Batch 1 verifies any chain (a forward longer than DECODE_MAX_TOKENS goes down the prefill path); a batched verify
    is StaticTarget.step, at most 64 tokens a row. Prompt lookup with 70 drafts ran at batch 2 until the first step that
    drafted 64 or more ("step of 71 tokens per row"), hours into an eval cell; a 70-step EAGLE-3 chain at its first step.
    Refused before any model work now, at the limit exactly; trees (their own verify) and batch 1 keep running."""
    from models.static_target import DECODE_MAX_TOKENS

    model, _, prompts, eos, eagle3 = setup
    message = r"--batch-size 2: a batched verify takes at most 63 drafts a step; this drafter drafts up to 70"
    with pytest.raises(ValueError, match=message):
        check_batchable(PromptLookupDrafter(num_draft_tokens=70, vocab_size=8192), 2)
    with pytest.raises(ValueError, match=message):  # generate_batch checks it before its first prefill
        generate_batch(StaticTarget(model, []), PromptLookupDrafter(num_draft_tokens=70, vocab_size=8192), prompts[:2], 8,
                       batch_size=2, eos_token_ids=eos)
    with pytest.raises(ValueError, match=message):
        check_batchable(StaticEagle3Drafter(eagle3, steps=70), 2)
    check_batchable(PromptLookupDrafter(num_draft_tokens=DECODE_MAX_TOKENS - 1, vocab_size=8192), 2)
    check_batchable(PromptLookupDrafter(num_draft_tokens=70, vocab_size=8192), 1)
    # the longest chain a batch takes runs, and equals batch 1 (the repeated prompt drafts long matches)
    target = StaticTarget(model, [])
    long = prompts[:1] + [prompts[0] * 3]
    pld = lambda: PromptLookupDrafter(num_draft_tokens=DECODE_MAX_TOKENS - 1, vocab_size=8192)  # noqa: E731
    alone = [generate(target, pld(), p, 24, eos_token_ids=eos) for p in long]
    batched = generate_batch(StaticTarget(model, []), pld(), long, 24, batch_size=2, eos_token_ids=eos)
    assert [r.tokens for r in batched] == [r.tokens for r in alone]
    assert [r.stats.accepted_per_step for r in batched] == [r.stats.accepted_per_step for r in alone]


@pytest.mark.parametrize("drafter_kind", ["dflash", "eagle3"])
def test_a_tree_smaller_than_it_is_deep_decodes_the_targets_tokens(setup, drafter_kind) -> None:
    """Two nodes under a depth of three (DFlash's block of 4, EAGLE-3's 3 steps): the accepted path's padding pointed past
    the verify's rows, an index error at batch 1 and batched (the eager drafters decoded it). Greedy: the target's own
    tokens, batched equal to batch 1."""
    model, dflash, prompts, eos, eagle3 = setup
    make = {"dflash": lambda: (StaticTarget(model, [1, 3]), StaticDFlashDrafter(dflash, model.get_input_embeddings(),
                                                                                model.get_output_embeddings(), tree_topk=3, tree_tokens=2)),
            "eagle3": lambda: (StaticTarget(model, [1, 3, 4]), StaticEagle3Drafter(eagle3, tree_topk=2, tree_tokens=2))}[drafter_kind]
    alone = batch_one(setup, "none", prompts[:3], 16, eos=eos)
    one = [generate(*make(), p, 16, eos_token_ids=eos) for p in prompts[:3]]
    assert [r.tokens for r in one] == [r.tokens for r in alone]
    batched = generate_batch(*make(), prompts[:3], 16, batch_size=2, eos_token_ids=eos)
    assert [(r.tokens, r.stats.accepted_per_step) for r in batched] == [(r.tokens, r.stats.accepted_per_step) for r in one]


def test_a_static_drafters_trees_on_an_eager_target_are_one_line(setup) -> None:
    """A static drafter's trees verify through StaticTarget.tree_greedy; with a CachedTarget they failed deep inside
    (``allocate() got an unexpected keyword argument 'batch'``). Its chains run there."""
    from models.target import CachedTarget

    model, _, prompts, eos, eagle3 = setup
    with pytest.raises(ValueError, match=r"StaticEagle3Drafter's trees run on a StaticTarget; with a CachedTarget"):
        generate(CachedTarget(model, [1, 3, 4]), StaticEagle3Drafter(eagle3, tree_topk=2, tree_tokens=6), prompts[0], 4, eos_token_ids=eos)
