"""``python -m eval``: MT-Bench (both turns, long prefill), prompt files, resumable sweeps, clear errors.

The loop's own correctness is tested in test_infer_*; here the references are the records
themselves (turn 2's prompt is rebuilt from the chat with the model's first answer, τ is recomputed
from the per-step counts) and greedy losslessness (every turn equals the autoregressive baseline).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoTokenizer

from eval.__main__ import main
from infer.prompts import chat_ids, first_turn_content
from models.dflash import DFlashDraftModel, make_dflash_config

pytestmark = pytest.mark.usefixtures("single_cpu_thread")


@pytest.fixture(scope="module")
def runs_dir(tiny_qwen3_path, tmp_path_factory) -> Path:
    """A finished-looking training run: run.json naming the builtin target and a drafter export."""
    root = tmp_path_factory.mktemp("outputs")
    torch.manual_seed(0)
    config = make_dflash_config(AutoConfig.from_pretrained(tiny_qwen3_path), num_hidden_layers=2, block_size=4, mask_token_id=3,
                                target_layer_ids=[1, 3, 5], layer_types=["sliding_attention", "full_attention"], sliding_window=64)
    export = root / "run1" / "export"
    DFlashDraftModel(config).save_pretrained(export)
    (root / "run1" / "run.json").write_text(json.dumps({"target": {"path": "builtin:tiny-qwen3"}, "export": str(export)}))
    return root


def test_mtbench_both_turns_with_prefill(runs_dir, tiny_qwen3_path, tmp_path) -> None:
    out = tmp_path / "mt"
    rc = main(["mtbench", "--runs-dir", str(runs_dir), "--window", "2048", "--num-questions", "2", "--max-new-tokens", "12",
               "--prefill-tokens", "300", "--out", str(out)])
    assert rc == 0
    result = json.loads((out / "results.json").read_text())
    records = result["records"]
    assert [(r["id"], r["turn"]) for r in records] == [("81", 1), ("81", 2), ("82", 1), ("82", 2)]
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3_path)
    first = records[0]
    messages = [{"role": "user", "content": first_turn_content(tokenizer, first["question"], 300, offset=0)}]
    assert first["prompt_tokens"] == len(chat_ids(tokenizer, messages)) and first["prompt_tokens"] >= 300
    messages += [{"role": "assistant", "content": first["output_text"]}, {"role": "user", "content": records[1]["question"]}]
    assert records[1]["prompt_tokens"] == len(chat_ids(tokenizer, messages))  # turn 2 follows the model's own answer
    steps = [a for r in records for a in r["stats"]["accepted_per_step"]]
    assert result["summary"]["tau"] == pytest.approx(sum(a + 1 for a in steps) / len(steps))
    assert result["summary"]["same_as_baseline"] == 1.0 and result["summary"]["speedup"] > 0
    assert result["config"]["drafter"].endswith("export") and result["config"]["target"] == "builtin:tiny-qwen3"
    assert "| turns | τ |" in (out / "summary.md").read_text()


def test_prompts_file_and_its_errors(runs_dir, tmp_path, capsys) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "Say hi."}\n{"turns": ["One?", "Two?"], "id": "x"}\n'
                       '{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "Three?"}]}\n')
    out = tmp_path / "p"
    assert main(["prompts", "--runs-dir", str(runs_dir), "--prompts", str(prompts), "--max-new-tokens", "6", "--no-baseline",
                 "--wandb", "--out", str(out)]) == 0
    records = json.loads((out / "results.json").read_text())["records"]
    assert [(r["id"], r["turn"]) for r in records] == [("1", 1), ("x", 1), ("x", 2), ("3", 1)]
    assert list((out / "wandb").glob("offline-run-*/run-*.wandb"))  # the W&B run (offline here: no API key)
    prompts.write_text('{"prompt": "ok"}\n{"prompt": \n')
    assert main(["prompts", "--runs-dir", str(runs_dir), "--prompts", str(prompts), "--out", str(tmp_path / "q")]) == 2
    assert f"{prompts}:2: not valid JSON" in capsys.readouterr().err
    assert not (tmp_path / "q").exists()  # nothing half-written


def test_the_category_table_has_prompt_lookups_tau_beside(runs_dir, tmp_path) -> None:
    """Found by review (2026-12-06's third session): the per-category τ table carried no prompt-lookup τ (every τ table
    carries it). Its row is prompt lookup's τ per category, recomputed here from prompt lookup's own records."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "What is 2 + 2?", "category": "math"}\n{"prompt": "Write a line about rain.", "category": "writing"}\n'
                       '{"prompt": "What is 3 * 5?", "category": "math"}\n')
    out = tmp_path / "p"
    assert main(["prompts", "--runs-dir", str(runs_dir), "--prompts", str(prompts), "--max-new-tokens", "8", "--no-baseline",
                 "--out", str(out)]) == 0
    pld_records = [json.loads(line) for line in (out / "partial" / "pld_prefill-0.jsonl").read_text().splitlines() if line.strip()]
    want = {}
    for r in pld_records:
        want.setdefault(r["category"], []).extend(r["stats"]["accepted_per_step"])
    want = {c: sum(a + 1 for a in steps) / len(steps) for c, steps in sorted(want.items())}
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert summary["prompt_lookup"]["tau_by_category"] == pytest.approx(want)
    table = (out / "summary.md").read_text()
    assert "| category | math | writing |" in table
    assert f"| prompt lookup τ | {want['math']:.3f} | {want['writing']:.3f} |" in table


@pytest.mark.parametrize("line,message", [
    ('{"turns": 5}', "'turns' is int 5; expected a list of user messages"),
    ('{"turns": "Hello?"}', "'turns' is str 'Hello?'; expected a list"),  # not five one-letter turns
    ('{"turns": ["Hi", 3]}', "the user turns must be non-empty strings"),
    ('{"messages": 7}', "'messages' is int 7; expected a list of {role, content} objects"),
    ('{"messages": [{"role": "system", "content": "s"}]}', "the user turns must be non-empty strings"),
    ('["Hi"]', "expected a JSON object with 'prompt', 'turns' or 'messages'"),
    ('{"text": "Hi"}', "expected a field 'prompt', 'turns' or 'messages'"),
    # results resume by (id, turn): a second record of an id (the first line's, its line number) got the other's answers
    ('{"id": "1", "prompt": "again"}', "id '1' is line 1's too; expected one record per id"),
    ('{"id": 1, "turns": ["again"]}', "id '1' is line 1's too"),
])
def test_prompts_file_names_the_bad_line(tmp_path, line, message) -> None:
    from infer.prompts import prompts_file

    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "fine"}\n\n' + line + "\n")
    with pytest.raises(ValueError) as caught:
        prompts_file(path)
    assert str(caught.value).startswith(f"{path}:3: ") and message in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("argv,message", [
    (["mtbench", "--window", "0"], "--window '0'; expected 'trained', 'none' or a positive integer"),
    (["prompts", "--prompts", "/nonexistent.jsonl"], "--prompts /nonexistent.jsonl: no such file"),
    (["prompts", "--prompts", "/tmp"], "--prompts /tmp: a folder; expected a JSONL file of prompts"),
    (["mtbench", "--prefill-tokens", "40000", "--num-questions", "1"], "more than the target's max_position_embeddings=32768"),
    (["sweep", "--prefills", "0", "32700", "--num-questions", "1"], "behind 32700 prefill tokens"),
    (["mtbench", "--drafter", "/nonexistent"], "--drafter='/nonexistent': no such folder; expected a training run folder"),
    (["mtbench", "--engine", "zlab", "--drafter-weights", "int8"], "--engine zlab: --drafter-weights int8 is our loop's"),
    (["mtbench", "--device", "bogus"], "--device 'bogus'; expected auto, cpu, cuda or cuda:N"),
    (["mtbench", "--max-new-tokens", "0"], "--max-new-tokens 0; expected >= 2"),  # was said mid-cell, an empty partial/ left
    (["sweep", "--max-new-tokens", "1"], "--max-new-tokens 1; expected >= 2 (the first new token comes from the prefill"),  # τ 0, then a ZeroDivisionError
    (["sweep", "--windows", "none", "none", "--num-questions", "1"], "--windows: none given twice; expected each once"),
    (["sweep", "--prefills", "0", "0", "--num-questions", "1"], "--prefills: 0 given twice; expected each once"),
    (["mtbench", "--prefill-tokens", "-5"], "--prefill-tokens -5; expected filler token counts >= 0"),
    (["mtbench", "--backend", "flashinfer", "--batch-size", "4"],
     "--batch-size 4: batched decoding runs on the static target; --backend flashinfer decodes at"),  # a traceback mid-cell
    (["mtbench", "--temperature", "nan"], "--temperature nan; expected a finite value >= 0"),
    (["mtbench", "--temperature", "0.7", "--top-p", "2"], "--top-p 2.0; expected 0 < top_p <= 1"),  # was named top_p=2.0
    (["mtbench", "--temperature", "0.7", "--seed", str(2**70)], f"--seed {2**70}; expected a signed 64-bit integer"),
    (["sweep", "--prefills", "0", "-1"], "--prefills -1; expected filler token counts >= 0"),
    # found by review (2026-12-06's sixth session): ignored, exit 0, the value written into the results' titles
    (["mtbench", "--drafter", "pld", "--window", "32"], "--window 32 sets a trained drafter's attention window; prompt lookup"),
    (["sweep", "--prefill-tokens", "100", "--prefills", "0"], "--prefill-tokens 100 sets mtbench's and prompts' filler; a sweep's are --prefills"),
    (["mtbench", "--tree-topk", "2", "--temperature", "0.7"], "--temperature 0.7: tree drafting (--tree-topk/--tree-tokens) is greedy only"),
])
def test_bad_input_is_one_clear_line(runs_dir, tmp_path, capsys, argv, message) -> None:
    assert main([*argv, "--runs-dir", str(runs_dir), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("error:") == 1
    assert not (tmp_path / "o").exists()  # nothing written for a refused command


def test_a_training_run_folder_is_refused_as_out(runs_dir, tmp_path, capsys) -> None:
    """Found by review (2026-12-06's sixth session): ``--out`` at a training run folder wrote results.json, settings.json,
    summary.md and partial/ beside its run.json and checkpoints."""
    run = runs_dir / "run1"
    before = sorted(p.name for p in run.iterdir())
    assert main(["mtbench", "--drafter", str(run), "--num-questions", "1", "--max-new-tokens", "4", "--runs-dir", str(runs_dir),
                 "--out", str(run)]) == 2
    assert f"error: --out {run}: holds run.json, a training run or an exported drafter" in capsys.readouterr().err
    assert sorted(p.name for p in run.iterdir()) == before


def test_an_unknown_dtype_is_refused_by_the_parser(runs_dir, tmp_path, capsys) -> None:
    """A dtype torch has no name for was a traceback from deep in the loading (``getattr(torch, 'float99')``)."""
    with pytest.raises(SystemExit) as caught:
        main(["mtbench", "--dtype", "float99", "--runs-dir", str(runs_dir), "--out", str(tmp_path / "o")])
    assert caught.value.code == 2
    assert "argument --dtype: invalid choice: 'float99'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_drafter_folder_that_holds_no_drafter_is_one_clear_line(runs_dir, tmp_path, capsys) -> None:
    """An empty folder, a file, and an export without --target: each named in one line before any model loads (an empty
    folder read as "--drafter given without --target")."""
    empty, file = tmp_path / "empty", tmp_path / "model.safetensors"
    empty.mkdir()
    file.write_text("")
    export = tmp_path / "export"
    export.mkdir()
    (export / "config.json").write_text("{}")
    for drafter, message in ((empty, f"--drafter='{empty}': no run.json or config.json there, and no speculators checkpoint in it"),
                             (file, f"--drafter='{file}': a file, not a folder"),
                             (export, "--drafter given without --target (a training run folder records its target")):
        assert main(["mtbench", "--drafter", str(drafter), "--runs-dir", str(runs_dir), "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("error:") == 1 and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()


def test_out_at_or_under_a_file_is_one_clear_line(runs_dir, tmp_path, capsys) -> None:
    file = tmp_path / "results.json"
    file.write_text("{}")
    for out in (file, file / "sub"):
        assert main(["mtbench", "--num-questions", "1", "--runs-dir", str(runs_dir), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"--out {out}: {file} is a file; expected a results folder" in err and "Traceback" not in err
    assert file.read_text() == "{}"


def test_a_malformed_run_json_is_named(runs_dir, tmp_path, capsys) -> None:
    run_json = tmp_path / "runs" / "run1" / "run.json"
    run_json.parent.mkdir(parents=True)
    run_json.write_text('{"target": ')  # cut off
    assert main(["mtbench", "--runs-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "o")]) == 2
    assert f"error: {run_json}: not valid JSON" in capsys.readouterr().err
    __import__("shutil").copytree(runs_dir / "run1" / "export", run_json.parent / "export")
    run_json.write_text(json.dumps({"export": str(runs_dir / "run1" / "export")}))  # an export, but no target recorded
    assert main(["mtbench", "--runs-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "o")]) == 2
    assert f"error: {run_json}: field 'target' is None" in capsys.readouterr().err


def test_resume_files_of_another_shape_are_named(tmp_path) -> None:
    from eval.__main__ import read_cell
    from eval.runner import open_partial, read_partial

    record = {"id": "81", "turn": 1, "output_ids": [1], "output_text": "a", "stats": {}}
    partial = tmp_path / "partial" / "cell.jsonl"
    partial.parent.mkdir()
    partial.write_text(json.dumps(record) + "\n" + json.dumps({**record, "turn": 2})[:-9])  # the last line cut off by a kill
    assert list(read_partial(partial)) == [("81", 1)]
    with open_partial(partial) as sink:  # the next record starts its own line, not the cut one's
        sink.write(json.dumps({**record, "turn": 2}) + "\n")
    assert list(read_partial(partial)) == [("81", 1), ("81", 2)]
    for line in ("[1, 2]", '{"id": "81"}', '{"id": "81", "turn": 1}'):
        partial.write_text(json.dumps(record) + "\n" + line + "\n")
        with pytest.raises(ValueError, match=rf"cell.jsonl:2: not a finished turn's record"):
            read_partial(partial)
    cell = tmp_path / "cell.json"
    for text, message in (('{"summary": {', "not valid JSON"), ('{"summary": {}}', "expected a finished cell with 'summary' and 'records'")):
        cell.write_text(text)
        with pytest.raises(ValueError, match=f"cell.json: {message}"):
            read_cell(cell)


@pytest.mark.slow
def test_a_prefill_some_turn_may_outgrow_is_refused_before_decoding(reference_tokenizer) -> None:
    """MT-Bench behind 32,000 filler tokens on the reference target (32,768 positions), 256 new tokens a turn: the first
    20 questions fit; question 105's second turn may not (an H100 sweep stopped there after its first 20 questions,
    benchmarks/results/issue25_fresh_rows_h100/sweep80.sh), so 25 questions are refused at once, and the prefill the
    error suggests fits. The bound counts an earlier answer at max_new_tokens + 16: a real answer of that many tokens,
    decoded and re-templated, must not need more."""
    from eval.runner import check_context_fits, turn_prompt
    from infer.prompts import filler_ids, mt_bench

    conversations = mt_bench(None)
    check_context_fits(reference_tokenizer, conversations[:20], [0, 32000], 256, 32768)
    with pytest.raises(ValueError, match=r"question 105 turn 2 may need \d+ positions behind 32000 prefill tokens") as error:
        check_context_fits(reference_tokenizer, conversations[:25], [0, 32000], 256, 32768)
    suggested = int(str(error.value).split("every question fits behind ")[1].split()[0])
    assert 31000 <= suggested < 32000
    check_context_fits(reference_tokenizer, conversations[:25], [suggested], 256, 32768)
    with pytest.raises(ValueError):
        check_context_fits(reference_tokenizer, conversations[:25], [suggested + 1], 256, 32768)
    for index in (0, 24):  # a 256-token answer (filler text), decoded and templated into the second prompt
        answer = reference_tokenizer.decode(filler_ids(reference_tokenizer, 256, offset=1000 * index), skip_special_tokens=True)
        real = len(turn_prompt(reference_tokenizer, conversations[index], index, 1, [answer, ""], 32000)) + 256
        bound = len(turn_prompt(reference_tokenizer, conversations[index], index, 1, ["", ""], 32000)) + (256 + 16) + 256
        assert real <= bound


def test_int8_drafter_weights_keep_the_output_and_get_their_own_folder(runs_dir, monkeypatch, tmp_path) -> None:
    """``--drafter-weights int8``: the same turns as the target alone (the baseline check), the summary's drafter labelled,
    and a default results folder apart from the model-weights run's (a rerun of one never resumes the other)."""
    monkeypatch.chdir(tmp_path)
    argv = ["mtbench", "--runs-dir", str(runs_dir), "--num-questions", "1", "--max-new-tokens", "10"]
    assert main(argv + ["--drafter-weights", "int8"]) == 0 and main(argv) == 0
    folders = sorted((tmp_path / "outputs" / "eval" / "mtbench").iterdir())
    assert len(folders) == 2
    results = [json.loads((f / "results.json").read_text()) for f in folders]
    int8 = next(r for r in results if r["config"].get("drafter_weights") == "int8")
    assert int8["summary"]["same_as_baseline"] == 1.0 and "int8 weights" in (folders[results.index(int8)] / "summary.md").read_text()


def test_no_training_run_is_a_clear_error(tmp_path, capsys) -> None:
    assert main(["mtbench", "--runs-dir", str(tmp_path)]) == 2
    assert "no finished training run" in capsys.readouterr().err


def test_sweep_writes_matrix_plot_and_resumes(runs_dir, tmp_path, monkeypatch) -> None:
    out = tmp_path / "sweep"
    argv = ["sweep", "--runs-dir", str(runs_dir), "--windows", "none", "8", "--prefills", "0", "100", "--num-questions", "1",
            "--max-new-tokens", "6", "--out", str(out)]
    assert main(argv) == 0
    cells = sorted(p.name for p in (out / "cells").iterdir())
    assert cells == ["window-8_prefill-0.json", "window-8_prefill-100.json", "window-none_prefill-0.json", "window-none_prefill-100.json"]
    table = (out / "sweep.md").read_text()
    assert "| none |" in table and "| 8 |" in table and (out / "tau_vs_context.png").stat().st_size > 1000
    # τ kept and the turns whose target text is the same as at prefill 0, recomputed from the cell files
    cell = {name: json.loads((out / "cells" / name).read_text()) for name in cells}
    kept_table = table.split("**τ kept**")[1].split("**turns with")[0]
    text_table = table.split("**turns with the same target text as at prefill 0**")[1]
    for w in ("none", "8"):
        zero, long = cell[f"window-{w}_prefill-0.json"], cell[f"window-{w}_prefill-100.json"]
        assert f"| {w} | 100% | {long['summary']['tau'] / zero['summary']['tau']:.0%} |" in kept_table
        by_turn = {(r["id"], r["turn"]): r["output_ids"] for r in zero["records"]}
        same = sum(by_turn[(r["id"], r["turn"])] == r["output_ids"] for r in long["records"])
        assert f"| {w} | {len(by_turn)}/{len(by_turn)} | {same}/{len(by_turn)} |" in text_table
        # one question: every bootstrap draw is that question, so the interval is the kept τ itself
        kept = long['summary']['tau'] / zero['summary']['tau']
        assert f"| {w} | 100%-100% | {kept:.0%}-{kept:.0%} |" in table.split("**τ kept, 95% interval**")[1].split("**turns with")[0]
    (out / "cells" / "window-8_prefill-100.json").unlink()
    calls = []
    import eval.runner as runner

    real = runner.generate
    monkeypatch.setattr(runner, "generate", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    assert main(argv) == 0
    assert calls == []  # the missing cell's turns were all in its partial file: nothing decoded again
    resumed = (out / "sweep.md").read_text()
    assert "| prompt lookup |" in resumed and resumed.split("**τ kept**")[1] == table.split("**τ kept**")[1]
    # the same folder with two questions: the one-question cells were reused (the sweep mixed prompt sets); now each
    # cell is made again, its first question's turns read back from the partial files, the second's decoded
    calls.clear()
    assert main([a if a != "1" else "2" for a in argv]) == 0
    for name in cells:
        again = json.loads((out / "cells" / name).read_text())
        # each cell names its own prefill (the single-cell commands' --prefill-tokens default, 0, was written before)
        assert again["config"]["prefill"] == again["config"]["prefill_tokens"] == int(name.split("prefill-")[1].split(".")[0])
        assert again["config"]["num_questions"] == 2 and len({r["id"] for r in again["records"]}) == 2
        first = [r for r in again["records"] if r["id"] == cell[name]["records"][0]["id"]]
        assert [r["output_ids"] for r in first] == [r["output_ids"] for r in cell[name]["records"]]
    assert calls  # the second question's turns were decoded


def test_run_folder_window_warning_and_prompt_lookup_beside(runs_dir, tiny_qwen3_path, tmp_path, capsys) -> None:
    out = tmp_path / "o"
    assert main(["mtbench", "--drafter", str(runs_dir / "run1"), "--window", "128", "--num-questions", "2", "--max-new-tokens", "10",
                 "--out", str(out), "--target", str(tiny_qwen3_path)]) == 0  # the folder the run's builtin name resolves to
    err = capsys.readouterr().err
    assert err.count("--window 128 is beyond the W=64 this drafter was trained with") == 1 and "is not the target" not in err
    result = json.loads((out / "results.json").read_text())
    assert result["config"]["target"] == str(Path(tiny_qwen3_path).resolve()) and result["config"]["run"] == str(runs_dir / "run1")
    pld = [json.loads(line) for line in (out / "partial" / "pld_prefill-0.jsonl").read_text().splitlines()]
    # greedy decoding is lossless with either drafter: prompt lookup decoded the same tokens, its τ is its own
    assert [r["output_ids"] for r in pld] == [r["output_ids"] for r in result["records"]]
    steps = [a for r in pld for a in r["stats"]["accepted_per_step"]]
    assert result["summary"]["prompt_lookup"]["tau"] == pytest.approx(sum(a + 1 for a in steps) / len(steps))
    assert "| τ | prompt lookup τ |" in (out / "summary.md").read_text()


def test_interrupt_keeps_finished_turns_and_the_same_command_resumes(runs_dir, tmp_path, monkeypatch, capsys) -> None:
    argv = ["mtbench", "--runs-dir", str(runs_dir), "--num-questions", "2", "--max-new-tokens", "8", "--no-pld", "--no-baseline",
            "--out", str(tmp_path / "o")]
    import eval.runner as runner

    real, calls = runner.generate, []

    def interrupted(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(runner, "generate", interrupted)
    assert main(argv) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("interrupted (Ctrl-C or SIGTERM)")
    assert not (tmp_path / "o" / "results.json").exists()
    assert len((tmp_path / "o" / "partial" / "window-trained_prefill-0.jsonl").read_text().splitlines()) == 2
    monkeypatch.setattr(runner, "generate", real)
    assert main(argv) == 0
    resumed = json.loads((tmp_path / "o" / "results.json").read_text())["records"]
    assert "Prompt lookup's τ: not run (--no-pld)." in (tmp_path / "o" / "summary.md").read_text()  # the table's "-" said
    assert main([*argv[:-1], str(tmp_path / "fresh")]) == 0
    fresh = json.loads((tmp_path / "fresh" / "results.json").read_text())["records"]
    assert [(r["id"], r["turn"], r["output_ids"], r["stats"]["accepted_per_step"]) for r in resumed] == \
        [(r["id"], r["turn"], r["output_ids"], r["stats"]["accepted_per_step"]) for r in fresh]


@pytest.mark.parametrize("drafts, header, shown", [(7, "(1..7)", 7), (8, "(1..8)", 8), (15, "(1..8 of 15)", 8), (0, "(none)", 0)])
def test_summary_table_names_the_positions_it_shows(drafts, header, shown) -> None:
    from eval.report import summary_table

    summary = {"acceptance_by_position": [round(0.9 - 0.05 * i, 2) for i in range(drafts)], "tau": 3.0, "turns": 2,
               "tokens_per_s": 10.0, "mean_prompt_tokens": 5.0, "mean_latency_s": 1.0,
               "time_split": {"draft": 0.2, "verify": 0.7, "other": 0.1}}
    header_line, _, row = summary_table(summary, "t").splitlines()[2:5]
    assert header_line.endswith(f"acceptance by position {header} |")
    cells = row.rstrip(" |").rsplit("| ", 1)[1].split()
    assert cells == (["-"] if shown == 0 else [f"{0.9 - 0.05 * i:.2f}" for i in range(shown)])


def test_sweep_tables_kept_and_same_text() -> None:
    from eval.report import sweep_tables

    def cell(tau, pld):
        return {"tau": tau, "tokens_per_s": 1.0, "prompt_lookup": {"tau": pld}}

    cells = {("none", 0): cell(4.0, 5.0), ("none", 100): cell(1.0, 6.0), ("64", 0): cell(4.0, 5.0), ("64", 100): cell(3.0, 6.0)}
    texts = {(w, p): {("a", 1): [1, 2, 3], ("a", 2): [4, 5] if p == 0 or w == "64" else [4, 6]} for w, p in cells}
    table = sweep_tables(cells, texts)
    kept = table.split("**τ kept**")[1].split("**turns")[0]
    assert "| none | 100% | 25% |" in kept and "| 64 | 100% | 75% |" in kept and "| prompt lookup | 100% | 120% |" in kept
    same = table.split("**turns with the same target text as at prefill 0**")[1]
    assert "| none | 2/2 | 1/2 |" in same and "| 64 | 2/2 | 2/2 |" in same
    assert "**turns with" not in sweep_tables(cells)  # no texts given: no such table
    assert "steps with drafts" not in table  # cells made before the loop counted steps without drafts
    for (_, p), c in cells.items():
        c["prompt_lookup"]["tau_drafting_steps"] = 6.5 if p == 0 else 7.25
    assert "| prompt lookup, steps with drafts (vLLM's count) | 6.500 | 7.250 |" in sweep_tables(cells)


@pytest.mark.parametrize("line", ['["What?"]', '{"turns": []}', '{"turns": ["Hi", null]}', '{"question_id": 1}'])
def test_mt_bench_reader_names_the_bad_line(tmp_path, line) -> None:
    from infer.prompts import mt_bench_questions

    path = tmp_path / "question.jsonl"
    path.write_text('{"question_id": 81, "turns": ["One?"]}\n' + line + "\n")
    with pytest.raises(ValueError, match=rf"^{path}:2: field 'turns' must be a non-empty list of strings$"):
        mt_bench_questions(path)
    assert len(mt_bench_questions()) == 80  # the bundled copy reads


def test_a_folder_of_other_settings_is_refused_not_mixed(runs_dir, tmp_path, capsys) -> None:
    """A results folder keeps what its turns were made with (``settings.json``). A rerun into it with another sampling
    setting (an explicit ``--out`` reused), or after the prompts file changed (the default folder's hash names the file,
    not its text), resumed the old turns under the new config; now one line names the setting. The same command resumes,
    and what only changes the speed (``--batch-size``) does not count."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "Say hi.", "id": "a"}\n')
    out = tmp_path / "o"
    base = ["prompts", "--prompts", str(prompts), "--runs-dir", str(runs_dir), "--drafter", "pld", "--target", "builtin:tiny-qwen3",
            "--max-new-tokens", "4", "--no-baseline", "--out", str(out)]
    assert main(base) == 0
    turns = lambda: [(r["id"], r["output_ids"], r["stats"]["accepted_per_step"]) for r in json.loads((out / "results.json").read_text())["records"]]  # noqa: E731
    first = turns()
    assert main([*base, "--batch-size", "2"]) == 0 and turns() == first
    capsys.readouterr()
    assert main([*base, "--temperature", "0.7"]) == 2
    err = capsys.readouterr().err
    assert "holds results made with temperature=0.0, this run has 0.7" in err and err.count("\n") == 1
    prompts.write_text('{"prompt": "Say bye.", "id": "a"}\n')
    assert main(base) == 2 and "holds results made with prompts_sha256=" in capsys.readouterr().err


def test_turns_without_their_baseline_get_it_when_resumed_at_batch_one(runs_dir, tmp_path, capsys) -> None:
    """A batched run writes each turn after its drafter pass and again after the baseline's; killed between the two and
    resumed at batch 1 (a speed setting: the same folder), its turns without a baseline made the summary fail with a
    KeyError (or, none having one, print no speedup and exit 0). The resumed turns now run their baseline."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "Say hi.", "id": "a"}\n{"prompt": "Count to three.", "id": "b"}\n')
    out = tmp_path / "o"
    base = ["prompts", "--prompts", str(prompts), "--runs-dir", str(runs_dir), "--drafter", "pld", "--target", "builtin:tiny-qwen3",
            "--max-new-tokens", "6", "--out", str(out)]
    assert main([*base, "--batch-size", "2"]) == 0
    partial = out / "partial" / "window-trained_prefill-0_baseline.jsonl"
    records = [json.loads(line) for line in partial.read_text().splitlines()]
    want = {r["id"]: r["output_ids"] for r in records}
    # the drafter's pass alone, as a kill before the baseline's leaves it (the second record of each turn gone)
    drafter_pass = [{k: v for k, v in r.items() if k not in ("baseline_stats", "same_as_baseline")} for r in records][:2]
    partial.write_text("".join(json.dumps(r) + "\n" for r in drafter_pass))
    (out / "results.json").unlink()
    assert main([*base, "--batch-size", "1"]) == 0
    result = json.loads((out / "results.json").read_text())
    assert all(r["same_as_baseline"] is True and "baseline_stats" in r for r in result["records"])
    assert {r["id"]: r["output_ids"] for r in result["records"]} == want and result["summary"]["speedup"] > 0


def test_a_folder_whose_run_was_refused_before_any_result_takes_the_corrected_command(tmp_path) -> None:
    """settings.json is written before decoding and some refusals come after it (trees with sampling): the folder held
    no result, but the corrected command was refused as "holds results made with temperature=0.5"."""
    from eval.__main__ import check_settings

    out = tmp_path / "o"
    (out / "partial").mkdir(parents=True)
    (out / "settings.json").write_text(json.dumps({"temperature": 0.5}))
    (out / "partial" / "window-64_prefill-0.jsonl").write_text("")  # opened, nothing finished
    check_settings(out, {"temperature": 0.0})
    (out / "partial" / "window-64_prefill-0.jsonl").write_text('{"id": "81", "turn": 1}\n')  # a finished turn: refused
    with pytest.raises(ValueError, match=r"holds results made with temperature=0.5, this run has 0.0"):
        check_settings(out, {"temperature": 0.0})


@pytest.mark.skipif(sys.platform != "linux", reason="forked CPU workers are Linux's")
def test_a_cpu_worker_ends_with_the_process_that_forked_it(tmp_path) -> None:
    """``--cpu-workers``: a SIGKILL (or an unhandled SIGTERM) to eval's process left its forked workers decoding and then
    blocked forever, each holding the model. ``die_with_parent`` in a worker forked by a process that is then killed:
    the worker ends too."""
    import signal
    import subprocess
    import time

    script = ("import os, sys, time\n"
              "sys.path[:0] = [%r]\n"
              "from eval.runner import die_with_parent\n"
              "parent = os.getpid()\n"
              "pid = os.fork()\n"
              "if pid == 0:\n"
              "    die_with_parent(parent)\n"
              "    time.sleep(120)\n"
              "    os._exit(0)\n"
              "print(pid, flush=True)\n"
              "time.sleep(120)\n") % str(Path(__file__).resolve().parents[1])
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child = int(proc.stdout.readline())
    time.sleep(0.5)  # the child has made its call

    def alive(pid: int) -> bool:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return False
        return state not in ("Z", "X")  # a zombie nobody reaped has ended

    assert alive(child)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 10
    while alive(child) and time.time() < deadline:
        time.sleep(0.1)
    if alive(child):
        os.kill(child, signal.SIGKILL)
        pytest.fail("the worker outlived the process that forked it")


def test_tables_say_why_prompt_lookups_tau_is_absent_or_on_other_prompts() -> None:
    """A τ table without prompt lookup's (--no-pld, or the drafter is prompt lookup) showed a bare "-", and a sampled run's
    later turns (each pass's own answers in the prompt) were not marked: each is a line under the table now."""
    from eval.report import summary_table, sweep_tables

    summary = {"turns": 4, "tau": 2.0, "acceptance_by_position": [0.5, 0.3], "tokens_per_s": 10.0, "mean_prompt_tokens": 70,
               "mean_latency_s": 0.2, "time_split": {"draft": 0.3, "verify": 0.7, "other": 0.0}}
    assert "Prompt lookup's τ" not in summary_table(summary, "t")
    note = "sampled (temperature 0.7): a later turn's prompt holds each pass's own sampled answers"
    assert f"Prompt lookup's τ: {note}." in summary_table({**summary, "prompt_lookup_note": note}, "t")
    cells = {(w, p): {"tau": 2.0, "tokens_per_s": 10.0, "prompt_lookup_note": "not run (--no-pld)"} for w in ("none", "64") for p in (0, 64)}
    assert sweep_tables(cells).count("Prompt lookup's τ: not run (--no-pld).") == 1


def test_prompt_lookup_beside_an_engine_counts_as_the_engine_counts() -> None:
    """Found by review (2026-12-06's third session): an engine's τ (vLLM's counters) counts each turn's last step with
    the drafts it accepted past the token budget; prompt lookup's τ beside it (our loop) did not: the ratio leaned to
    the drafter. Beside an engine, prompt lookup's records count as ``GenerationStats.untrimmed_steps`` does."""
    from eval.runner import as_engine_counts, summarize
    from infer.generate import GenerationStats

    stats = [GenerationStats(prompt_tokens=5, new_tokens=7, block_size=4, accepted_per_step=[3, 1, 2], accepted_past_end=1, decode_s=1.0),
             GenerationStats(prompt_tokens=5, new_tokens=3, block_size=4, accepted_per_step=[1, 0], accepted_past_end=0, decode_s=1.0),
             GenerationStats(prompt_tokens=5, new_tokens=1, block_size=4, accepted_per_step=[], decode_s=1.0)]
    records = [{"id": str(i), "turn": 1, "category": None, "prompt_tokens": 5, "latency_s": 1.0, "stats": s.to_dict()}
               for i, s in enumerate(stats)]
    counted = as_engine_counts(records)
    assert [r["stats"]["accepted_per_step"] for r in counted] == [s.untrimmed_steps for s in stats] == [[3, 1, 3], [1, 0], []]
    assert summarize(counted)["tau"] == pytest.approx((4 + 2 + 4 + 2 + 1) / 5)
    assert summarize(records)["tau"] == pytest.approx((4 + 2 + 3 + 2 + 1) / 5)  # ours, trimmed, untouched
