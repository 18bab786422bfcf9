"""A real run's acceptance replayed by the speed benchmark: ``eval.acceptance_trace`` reads eval's outputs, and
``generate(accept_per_step=trace)`` accepts the trace's count at each step (the work of the real loop, the output the
drafts and the target's token after them), on every chain path (the static drafter's step as one call ahead of the host
sync, after it, the eager drafters, EAGLE-3)."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest
import torch

from eval.acceptance_trace import read_acceptance_trace
from infer.generate import generate
from infer_helpers import random_dflash_on_reference, random_eagle3_on_reference
from models.dflash import DFlashDrafter, StaticDFlashDrafter
from models.eagle3 import Eagle3Drafter, StaticEagle3Drafter

pytestmark = pytest.mark.usefixtures("single_cpu_thread")

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def record(turn: int, accepted: list[int], block: int = 16) -> dict:
    return {"id": 81, "turn": turn, "stats": {"accepted_per_step": accepted, "block_size": block}}


def test_every_eval_output_reads_as_the_same_trace(tmp_path) -> None:
    turns = [[0, 3, 15, 1], [2, 2]]
    records = [record(i + 1, t) for i, t in enumerate(turns)]
    (tmp_path / "results.json").write_text(json.dumps({"config": {"tree_topk": None}, "summary": {}, "records": records}))
    # a partial file as eval writes it: a turn again with its baseline added, as a batched pass or a resumed run does
    again = dict(records[0], baseline={"new_tokens": 23})
    (tmp_path / "partial.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [records[0], records[1], again]))
    (tmp_path / "compact.json").write_text(json.dumps({"config": {}, "summary": {"acceptance_by_position": [0.5] * 15},
                                                       "accepted_per_step_by_turn": turns}))
    # in file order: a partial file's turns where each last stands (the rewritten turn 1 after turn 2)
    orders = {"results.json": [0, 3, 15, 1, 2, 2], "partial.jsonl": [2, 2, 0, 3, 15, 1], "compact.json": [0, 3, 15, 1, 2, 2]}
    for name, order in orders.items():
        trace = read_acceptance_trace(tmp_path / name)
        assert trace.counts == order and trace.block_size == 16 and trace.turns == 2
        assert trace.tau == pytest.approx((1 + 4 + 16 + 2 + 3 + 3) / 6)
    # a turn decoded again by a resumed run: its last record's counts stand, not the first's
    redone = record(1, [7, 0])
    (tmp_path / "redone.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [records[0], records[1], redone]))
    assert read_acceptance_trace(tmp_path / "redone.jsonl").counts == [2, 2, 7, 0]
    # found by review (2026-12-06's third session): a record a kill cut off, then the run resumed after it (the line eval
    # itself drops), refused the whole file; gzipped outputs (benchmarks/results keeps cells so) were a decode error
    cut = json.dumps(records[0])[:25] + "\n"
    (tmp_path / "resumed.jsonl").write_text(json.dumps(records[1]) + "\n" + cut + json.dumps(records[0]) + "\n")
    assert read_acceptance_trace(tmp_path / "resumed.jsonl").counts == [2, 2, 0, 3, 15, 1]
    for name in ("results.json", "partial.jsonl"):
        zipped = tmp_path / f"{name}.gz"
        zipped.write_bytes(gzip.compress((tmp_path / name).read_bytes()))
        assert read_acceptance_trace(zipped).counts == orders[name]


def test_a_committed_run_reads_back_its_own_tau() -> None:
    """A compact copy of a real eval run (SmolLM2's DFlash chain on MT-Bench): the trace's τ is the summary's, pooled
    by eval from the same records, and its steps are the summary's count."""
    path = RESULTS / "issue25_smollm2_dflash_redraft_h100" / "mtbench_new_chain_summary.json"
    summary = json.loads(path.read_text())["summary"]
    trace = read_acceptance_trace(path)
    assert len(trace.counts) == summary["steps"] and trace.turns == summary["turns"]
    assert trace.tau == pytest.approx(summary["tau"], rel=1e-12) and trace.block_size == 16
    # thinned evenly to a benchmark run's ~110 steps: the whole run's mix (τ within 5%), where its first 110 steps (a
    # first turn that repeats itself accepts whole blocks) are far from it
    spread = trace.spread(110)
    assert 110 <= len(spread) < 130 and sum(c + 1 for c in spread) / len(spread) == pytest.approx(trace.tau, rel=0.05)
    assert sum(c + 1 for c in trace.counts[:110]) / 110 > 1.5 * trace.tau
    assert trace.spread(len(trace.counts)) == trace.counts and trace.spread(10 ** 9) == trace.counts


@pytest.mark.parametrize("content,message", [
    ("{", "not valid JSON"),
    ('{"summary": {}}', "neither 'records' nor 'accepted_per_step_by_turn'"),
    ('{"records": [{"id": 1}]}', r"records\[0\] has no stats.accepted_per_step"),
    ('{"records": [{"stats": {"accepted_per_step": [1, -2]}}]}', r"records\[0\].stats.accepted_per_step: expected a list of accepted counts"),
    ('{"records": []}', "no verify steps in 0 turns"),
    ('{"config": {"tree_topk": 8}, "records": [{"stats": {"accepted_per_step": [1]}}]}', "a tree run's acceptance"),
    # trees turned on by --tree-tokens alone record tree_topk None: replayed as a chain's before
    ('{"config": {"tree_topk": null, "tree_tokens": 48}, "records": [{"stats": {"accepted_per_step": [1]}}]}',
     r"a tree run's acceptance \(config\.tree_tokens=48\)"),
    ('{"records": [{"stats": {"accepted_per_step": [1], "block_size": 4}}, {"stats": {"accepted_per_step": [1], "block_size": 8}}]}',
     r"block sizes \[4, 8\]"),
    ('{"records": [{"stats": {"accepted_per_step": [4], "block_size": 4}}]}', "accepts 4 drafts, past the records' block size 4"),
    ('{"accepted_per_step_by_turn": {"a": 1}}', "expected a list of lists"),
])
def test_a_bad_trace_file_is_refused_with_its_name_and_field(tmp_path, content, message) -> None:
    path = tmp_path / "trace.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as e:
        read_acceptance_trace(path)
    assert str(path) in str(e.value)
    bad_line = tmp_path / "trace.jsonl"
    bad_line.write_text(json.dumps(record(1, [1])) + "\nnot json\n")
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        read_acceptance_trace(bad_line)


def bonus_tokens_are_the_targets(model, prompt: list[int], run) -> None:
    """Each step's last token is the target's greedy token after everything before it (forced drafts included): checked
    against the Hugging Face model's own forward over the whole sequence. A last step cut at the budget ends on a draft
    (its token after them is past the budget): every step but that one."""
    ids = torch.tensor([prompt + run.tokens])
    greedy = model(ids).logits[0].argmax(-1)  # greedy[p]: the target's token after positions 0 .. p
    steps = run.stats.accepted_per_step
    end = len(prompt)  # index in ids of the prefill's token; each step's token lands at end + accepted + 1
    for accepted in steps[:-1] if run.stats.accepted_past_end else steps:
        end += accepted + 1
        assert int(greedy[end - 1]) == int(ids[0, end]), f"step token at {end}"
    assert end > len(prompt) + len(run.tokens) // 2  # most of the output checked


def test_a_trace_is_replayed_step_by_step_on_every_dflash_path(reference_target_path) -> None:
    model, target, drafter_model, embed, head, prompt = random_dflash_on_reference(reference_target_path)
    trace = [2, 0, 3, 1, 3, 3, 0]  # block 4: 0 .. 3 drafts a step
    runs = {}
    for name, make, ahead in (("static, one call ahead of the sync", StaticDFlashDrafter, True),
                              ("static, after the sync", StaticDFlashDrafter, False),
                              ("eager", DFlashDrafter, False)):
        run = generate(target, make(drafter_model, embed, head), prompt, 40, accept_per_step=trace, run_ahead=ahead)
        steps = run.stats.accepted_per_step
        want = (trace * 10)[:len(steps)]
        assert steps[:-1] == want[:-1] and steps[-1] <= want[-1], name  # the last step trimmed to the budget
        assert len(run.tokens) == 40 == 1 + sum(a + 1 for a in steps) and run.stats.accepted_past_end == want[-1] - steps[-1]
        bonus_tokens_are_the_targets(model, prompt, run)
        runs[name] = run.tokens
    assert len(set(map(tuple, runs.values()))) == 1, runs
    # a trace of one repeated count is the fixed count's mode
    assert generate(target, StaticDFlashDrafter(drafter_model, embed, head), prompt, 30, accept_per_step=[2]).tokens == \
        generate(target, StaticDFlashDrafter(drafter_model, embed, head), prompt, 30, accept_per_step=2).tokens


def test_a_trace_is_replayed_step_by_step_with_eagle3(reference_target_path) -> None:
    model, target, drafter_model, prompt = random_eagle3_on_reference(reference_target_path)
    trace = [1, 3, 0, 2]
    got = [generate(target, d, prompt, 25, accept_per_step=trace) for d in (Eagle3Drafter(drafter_model), StaticEagle3Drafter(drafter_model))]
    assert got[0].tokens == got[1].tokens
    for run in got:
        steps = run.stats.accepted_per_step
        assert steps[:-1] == (trace * 10)[:len(steps) - 1]
        bonus_tokens_are_the_targets(model, prompt, run)


def test_a_trace_the_drafter_cannot_replay_is_refused(reference_target_path) -> None:
    _, target, drafter_model, embed, head, prompt = random_dflash_on_reference(reference_target_path)
    drafter = StaticDFlashDrafter(drafter_model, embed, head)
    with pytest.raises(ValueError, match=r"the trace's step 1 accepts 4; expected an integer 0 .. 3"):
        generate(target, drafter, prompt, 8, accept_per_step=[1, 4])
    with pytest.raises(ValueError, match="an empty trace"):
        generate(target, drafter, prompt, 8, accept_per_step=[])
    with pytest.raises(ValueError, match="a trace of 2 counts needs a chain drafter"):
        generate(target, None, prompt, 8, accept_per_step=[1, 2])


def test_the_speed_benchmark_replays_a_trace_as_the_run_drafted_it() -> None:
    """``benchmarks/decode_speed.py``'s rows for a trace: DFlash's whole block replays a block-16 run's counts, EAGLE-3
    drafts the run's chain of 15, a DFlash verify of 3 drafts cannot replay a run that accepted more (skipped with
    why), and the eager drafters run the fixed τ only."""
    from benchmarks.decode_speed import forcings

    trace = read_acceptance_trace(RESULTS / "issue25_smollm2_dflash_redraft_h100" / "mtbench_new_chain_summary.json")
    [fixed, replay] = forcings("dflash", 0, [3], [trace], 256)
    assert fixed == (3, 2, None, None)
    tau, forced, got, skipped = replay
    assert got is trace and skipped is None and forced == trace.spread(math.ceil(256 / trace.tau) + 1) and tau == max(forced) + 1
    assert forcings("eagle3", 0, [3], [trace], 256)[1][0] == 16  # a chain of 15, as the run drafted
    assert "skipped: a chain of 3 drafts accepts at most 3 a step" in forcings("dflash", 3, [3], [trace], 256)[1][3]
    assert [row[0] for row in forcings("eagle3-eager", 0, [2, 3], [trace], 256)] == [3]


def test_decoding_speed_counts_the_tokens_the_decode_steps_made(reference_target_path) -> None:
    """A generation's first token comes from the prefill's forward, timed as ``prefill_s``: ``tokens_per_s`` divides the
    other tokens by ``decode_s`` (the first counted too, it read N/(N-1) high: 0.4% at 256 tokens, which moved the
    8B-shape bandwidth fractions read at their 75% line). The autoregressive loop makes one token a decode step."""
    _, target, drafter_model, embed, head, prompt = random_dflash_on_reference(reference_target_path)
    alone = generate(target, None, prompt, 9)
    assert alone.stats.new_tokens == 9 and alone.stats.decoded_tokens == 8 == len(alone.stats.accepted_per_step)
    assert alone.stats.tokens_per_s == pytest.approx(8 / alone.stats.decode_s)
    run = generate(target, StaticDFlashDrafter(drafter_model, embed, head), prompt, 9, accept_per_step=[2])
    assert run.stats.decoded_tokens == sum(a + 1 for a in run.stats.accepted_per_step) == 8
