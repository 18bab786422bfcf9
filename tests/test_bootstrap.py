"""eval/bootstrap.py (and benchmarks/sweep_kept_ci.py over committed sweeps): the pooled τ is the eval's own, the paired
bootstrap is exact where the answer is known."""

from __future__ import annotations

import importlib.util
import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from eval.bootstrap import per_question, pooled_tau, ratio_with_interval

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("sweep_kept_ci", ROOT / "benchmarks" / "sweep_kept_ci.py")
ci = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ci)
SWEEP = ROOT / "benchmarks" / "results" / "issue25_packed_rows_h100" / "sweep_block"


def test_pooled_tau_is_the_eval_summary_tau_of_every_committed_cell() -> None:
    cells = ci.read_cells(SWEEP)
    assert ("trained", 32000) in cells and ("prompt lookup", 0) in cells
    for name in ("window-trained_prefill-0", "window-trained_prefill-32000", "window-none_prefill-32000"):
        cell = json.loads(gzip.decompress((SWEEP / "cells" / f"{name}.json.gz").read_bytes()))  # committed gzipped
        assert pooled_tau(per_question(cell["records"])) == pytest.approx(cell["summary"]["tau"], abs=1e-9)


def test_kept_is_the_ratio_of_pooled_taus_and_its_interval_brackets_it() -> None:
    rng = np.random.default_rng(3)
    base = {str(i): (int(rng.integers(20, 200)), int(rng.integers(10, 60))) for i in range(15)}
    behind = {str(i): (int(rng.integers(20, 200)), int(rng.integers(10, 60))) for i in range(15)}
    behind["extra"] = (1000, 1)  # a question only one cell has is left out of both
    kept, low, high = ratio_with_interval(base, behind, resamples=2000, seed=1)
    # plain loop over the shared questions as the reference
    sb = nb = sp = np_ = 0
    for q in base:
        sb, nb, sp, np_ = sb + base[q][0], nb + base[q][1], sp + behind[q][0], np_ + behind[q][1]
    assert kept == pytest.approx((sp / np_) / (sb / nb), rel=1e-12)
    assert low < kept < high


def test_a_uniform_change_has_a_zero_width_interval_and_disjoint_cells_are_refused() -> None:
    base = {str(i): (10 + 3 * i, 5 + i) for i in range(8)}
    doubled = {q: (2 * s, n) for q, (s, n) in base.items()}
    assert ratio_with_interval(base, base, resamples=500) == pytest.approx((1.0, 1.0, 1.0))
    assert ratio_with_interval(base, doubled, resamples=500) == pytest.approx((2.0, 2.0, 2.0))
    with pytest.raises(ValueError, match="share no question id"):
        ratio_with_interval(base, {"x": (1, 1)})


def test_a_folder_without_cells_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no cells/\\*.json"):
        ci.read_cells(tmp_path)


def test_gzipped_committed_sweeps_read_as_the_device_summarised_them() -> None:
    """A committed sweep with gzipped cells and prompt lookup's partial records (issue 25's strict 32K run): every
    cell's pooled τ is its summary's, and kept with its interval, recomputed here, is what the device's sweep.md printed."""
    folder = ROOT / "benchmarks" / "results" / "issue25_strict32k_h100"
    l15, block = ci.read_cells(folder / "sweep80s_l15"), ci.read_cells(folder / "sweep80s_block")
    assert set(l15) == {("trained", 0), ("trained", 31979), ("none", 0), ("none", 31979)}
    assert set(block) == {("trained", 0), ("trained", 31979), ("prompt lookup", 0), ("prompt lookup", 31979)}
    for path in (folder / "sweep80s_l15" / "cells").glob("*.json.gz"):
        cell = json.loads(gzip.decompress(path.read_bytes()))
        assert pooled_tau(per_question(cell["records"])) == pytest.approx(cell["summary"]["tau"], abs=1e-9), path.name
    printed = {"trained": "104%-119%", "none": "63%-73%"}  # sweep80s_l15/sweep.md, "τ kept, 95% interval"
    assert "| trained | 100%-100% | 104%-119% |" in (folder / "sweep80s_l15" / "sweep.md").read_text()
    for window, interval in printed.items():
        _, low, high = ratio_with_interval(per_question(l15[(window, 0)]), per_question(l15[(window, 31979)]))
        assert f"{low:.0%}-{high:.0%}" == interval, window
    _, low, high = ratio_with_interval(per_question(block[("prompt lookup", 0)]), per_question(block[("prompt lookup", 31979)]))
    assert f"{low:.0%}-{high:.0%}" == "120%-144%"


def test_shards_of_a_sweep_merge_into_the_sweep_and_overlapping_shards_are_refused(tmp_path: Path) -> None:
    """A committed sweep cut by question into two shard folders (as one sweep per GPU writes them) reads back whole."""
    whole = ci.read_cells(SWEEP)
    ids = sorted({str(r["id"]) for records in whole.values() for r in records})
    halves = [set(ids[0::2]), set(ids[1::2])]
    shards = []
    for i, half in enumerate(halves):
        shard = tmp_path / f"shard{i}"
        (shard / "cells").mkdir(parents=True)
        for (window, prefill), records in whole.items():
            name = f"pld_prefill-{prefill}.json" if window == "prompt lookup" else f"window-{window}_prefill-{prefill}.json"
            mine = [r for r in records if str(r["id"]) in half]
            (shard / "cells" / name).write_text(json.dumps({"records": mine}))
        shards.append(shard)
    merged = ci.merge_shards(shards)
    assert set(merged) == set(whole)
    for key, records in whole.items():
        assert pooled_tau(per_question(merged[key])) == pytest.approx(pooled_tau(per_question(records)), abs=1e-12)
        assert sorted(str(r["id"]) for r in merged[key]) == sorted(str(r["id"]) for r in records)
    with pytest.raises(ValueError, match="in two shards"):
        ci.merge_shards([shards[0], shards[0]])


def test_prompt_lookups_rows_are_read_on_the_cells_questions_and_bad_cells_are_named(tmp_path: Path) -> None:
    """Found by review (2026-12-06's third session): a sweep rerun into its folder on fewer questions rebuilds its
    cells on those, but prompt lookup's partial file keeps every question ever decoded there, and its rows were read
    whole (its kept τ over other questions than the drafter's). And a cut or corrupt cell was a traceback."""
    whole = ci.read_cells(SWEEP)
    assert any(window == "prompt lookup" for window, _ in whole)
    ids = sorted({str(r["id"]) for records in whole.values() for r in records})
    fewer = set(ids[: len(ids) // 2])
    folder = tmp_path / "rerun"
    (folder / "cells").mkdir(parents=True)
    (folder / "partial").mkdir()
    for (window, prefill), records in whole.items():
        if window == "prompt lookup":  # every question, as the partial file holds them
            (folder / "partial" / f"pld_prefill-{prefill}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        else:
            mine = [r for r in records if str(r["id"]) in fewer]
            (folder / "cells" / f"window-{window}_prefill-{prefill}.json").write_text(json.dumps({"records": mine}))
    cells = ci.read_cells(folder)
    for (window, prefill), records in cells.items():
        assert {str(r["id"]) for r in records} == fewer, (window, prefill)
    broken = folder / "cells" / "window-2048_prefill-0.json"
    for text in ('{"records": [', '{"summary": {}}'):
        broken.write_text(text)
        with pytest.raises(ValueError, match=rf"^{broken}: not a readable sweep cell"):
            ci.read_cells(folder)


SMOLLM2_EVALS = ROOT / "benchmarks" / "results" / "smollm2_eagle3_6turn_3000_h100_14th" / "evals"
ratios = importlib.util.spec_from_file_location("tau_ratio_intervals", ROOT / "benchmarks" / "tau_ratio_intervals.py")
tau_ratio_intervals = importlib.util.module_from_spec(ratios)
ratios.loader.exec_module(tau_ratio_intervals)


@pytest.mark.parametrize("folder", ["eval_mtbench_k16n384d16", "eval_prompts_k16n384d16"])
def test_drafting_steps_only_is_the_eval_summary_vllm_count(folder: str) -> None:
    """Prompt lookup's τ over its steps with drafts, per question then pooled, is the τ the eval's own summary counted
    (``tau_drafting_steps``, from the whole cell's steps); over every step it is the summary's ``tau``."""
    from eval.runner import read_partial

    d = SMOLLM2_EVALS / folder
    summary = json.loads((d / "results.json").read_text())["summary"]
    pld = list(read_partial(d / "partial" / "pld_prefill-0.jsonl.gz").values())
    mine = list(read_partial(d / "partial" / "window-trained_prefill-0.jsonl.gz").values())
    assert pooled_tau(per_question(mine)) == pytest.approx(summary["tau"], abs=1e-9)
    assert pooled_tau(per_question(pld)) == pytest.approx(summary["prompt_lookup"]["tau"], abs=1e-9)
    assert summary["prompt_lookup"]["steps_without_drafts"] > 0  # the two counts differ here
    assert pooled_tau(per_question(pld, drafting_steps_only=True)) == pytest.approx(
        summary["prompt_lookup"]["tau_drafting_steps"], abs=1e-9)


def test_drafting_steps_only_by_hand_and_a_record_without_the_count_is_refused() -> None:
    # two turns of one question: steps accepting 2, 0 (no draft), 0 (a rejected draft); then 1, 0 (no draft)
    records = [{"id": 7, "turn": 1, "stats": {"accepted_per_step": [2, 0, 0], "steps_without_drafts": 1}},
               {"id": 7, "turn": 2, "stats": {"accepted_per_step": [1, 0], "steps_without_drafts": 1}}]
    assert per_question(records) == {"7": (3 + 1 + 1 + 2 + 1, 5)}
    assert per_question(records, drafting_steps_only=True) == {"7": (3 + 1 + 2, 3)}
    del records[1]["stats"]["steps_without_drafts"]
    assert per_question(records) == {"7": (8, 5)}  # not needed for every step
    with pytest.raises(ValueError, match="question 7 turn 2: no steps_without_drafts"):
        per_question(records, drafting_steps_only=True)


def test_tau_ratio_intervals_prints_both_readings(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    tau_ratio_intervals.main([str(SMOLLM2_EVALS / "eval_mtbench_k16n384d16"), "--resamples", "500"])
    row = capsys.readouterr().out.splitlines()[2].split(" | ")
    assert row[1:5] == ["trained", "0", "80", "5.799"]
    assert row[5] == "2.240" and row[6].startswith("2.589×") and row[7] == "2.891" and row[8].startswith("2.006×")
    (tmp_path / "partial").mkdir()
    with pytest.raises(ValueError, match="no partial/window-"):
        tau_ratio_intervals.main([str(tmp_path)])
    (tmp_path / "partial" / "window-2048_prefill-0.jsonl").write_text("")
    with pytest.raises(ValueError, match="partial/pld_prefill-0.jsonl beside it"):
        tau_ratio_intervals.main([str(tmp_path)])


def test_tau_ratio_intervals_pools_the_questions_both_cells_hold(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A drafter cell cut short (a killed run): τ, prompt lookup's τ and the ratio all pool the questions both hold."""
    src = SMOLLM2_EVALS / "eval_mtbench_k16n384d16" / "partial"
    (tmp_path / "partial").mkdir()
    mine = gzip.decompress((src / "window-trained_prefill-0.jsonl.gz").read_bytes()).decode().splitlines()
    (tmp_path / "partial" / "window-trained_prefill-0.jsonl").write_text("\n".join(mine[:40]) + "\n")
    (tmp_path / "partial" / "pld_prefill-0.jsonl.gz").write_bytes((src / "pld_prefill-0.jsonl.gz").read_bytes())
    tau_ratio_intervals.main([str(tmp_path), "--resamples", "200"])
    row = capsys.readouterr().out.splitlines()[2].split(" | ")
    kept = {json.loads(line)["id"] for line in mine[:40]}
    pld = [r for r in map(json.loads, gzip.decompress((src / "pld_prefill-0.jsonl.gz").read_bytes()).decode().splitlines())
           if r["id"] in kept]
    mine_tau = pooled_tau(per_question([json.loads(line) for line in mine[:40]]))
    assert row[3] == str(len(kept)) and row[4] == f"{mine_tau:.3f}" and row[5] == f"{pooled_tau(per_question(pld)):.3f}"
    assert row[6].startswith(f"{mine_tau / pooled_tau(per_question(pld)):.3f}×")


def test_tau_ratio_intervals_reads_prompt_lookup_from_its_own_run(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """--pld-dirs: prompt lookup's cell from a `--drafter pld` run's folder (there, its cell is named as a drafter's);
    the same records as the cell beside give the same row, digit for digit; a missing cell and a count mismatch refused."""
    folder = SMOLLM2_EVALS / "eval_mtbench_k16n384d16"
    tau_ratio_intervals.main([str(folder), "--resamples", "300"])
    beside = capsys.readouterr().out.splitlines()[2]
    own = tmp_path / "pld16"
    (own / "partial").mkdir(parents=True)
    (own / "partial" / "window-trained_prefill-0.jsonl.gz").write_bytes((folder / "partial" / "pld_prefill-0.jsonl.gz").read_bytes())
    tau_ratio_intervals.main([str(folder), "--pld-dirs", str(own), "--resamples", "300"])
    assert capsys.readouterr().out.splitlines()[2] == beside
    with pytest.raises(ValueError, match="no .*window-trained_prefill-0.jsonl \\(a `python -m eval"):
        tau_ratio_intervals.main([str(folder), "--pld-dirs", str(tmp_path)])
    with pytest.raises(ValueError, match="--pld-dirs: 1 folders for 2 eval folders"):
        tau_ratio_intervals.main([str(folder), str(folder), "--pld-dirs", str(own)])
