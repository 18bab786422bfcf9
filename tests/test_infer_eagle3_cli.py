"""An EAGLE-3 drafter folder (``Eagle3DraftModel.save_pretrained``) through ``load_models``, ``python -m infer``
(chain and tree flags) and ``python -m eval`` unchanged (chains batched too); bad options are one clear line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from eval.__main__ import main as eval_main
from infer.__main__ import main as infer_main
from models.eagle3 import Eagle3Drafter, StaticEagle3Drafter
from infer.loading import drafting_label, load_models
from models.eagle3 import Eagle3DraftModel, make_eagle3_config

pytestmark = pytest.mark.usefixtures("single_cpu_thread")


@pytest.fixture(scope="module")
def eagle3_dir(reference_target_path, tmp_path_factory) -> Path:
    torch.manual_seed(0)
    config = make_eagle3_config(AutoConfig.from_pretrained(reference_target_path), num_hidden_layers=1, target_layer_ids=[1, 3, 4],
                                layer_types=["sliding_attention"], sliding_window=8, draft_vocab_size=1024, ttt_length=3)
    path = tmp_path_factory.mktemp("eagle3") / "export"
    model = Eagle3DraftModel(config)
    model.d2t.copy_(torch.arange(1024) * 7 % 8192 - torch.arange(1024))  # a draft vocabulary that is not the first ids
    model.t2d[torch.arange(1024) * 7 % 8192] = True
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def accepting_eagle3_dir(reference_target_path, reference_tokenizer, tmp_path_factory) -> Path:
    """An EAGLE-3 folder whose drafts the target accepts (``bigram_eagle3``: a bigram head read off the target's greedy
    replies to the prompts the batching tests below decode, the CLI's three and MT-Bench's first three questions): the
    random drafter of ``eagle3_dir`` accepted nothing, so "batched equals batch 1" compared the target's tokens and zeros."""
    from transformers import AutoModelForCausalLM

    from infer.prompts import long_prompt_ids, mt_bench_questions
    from infer_helpers import bigram_eagle3

    model = AutoModelForCausalLM.from_pretrained(reference_target_path, dtype=torch.float32).eval()
    texts = CLI_PROMPTS + [q["turns"][0] for q in mt_bench_questions()[:3]]
    path = tmp_path_factory.mktemp("eagle3_bigram") / "export"
    bigram_eagle3(model, [long_prompt_ids(reference_tokenizer, t) for t in texts]).save_pretrained(path)
    return path


CLI_PROMPTS = ["Hi", "Tell me a story about a cat.", "Why is the sky blue?"]


def test_load_models_detects_eagle3(reference_target_path, eagle3_dir) -> None:
    target, drafter, _ = load_models(str(reference_target_path), str(eagle3_dir), window=4, draft_steps=2, tree_topk=3, tree_tokens=7)
    assert isinstance(drafter, StaticEagle3Drafter) and target.feature_layer_ids == [1, 3, 4]  # trees at batch 1 too
    _, eager, _ = load_models(str(reference_target_path), str(eagle3_dir), tree_topk=3, tree_tokens=7, attention_backend="flashinfer")
    assert type(eager) is Eagle3Drafter and eager.tree
    assert drafter.tree and drafter.steps == 2 and drafter.windows == [4] and drafter.verify_tokens == 8
    assert torch.equal(drafter.model.d2t, torch.arange(1024) * 7 % 8192 - torch.arange(1024))
    _, chain, _ = load_models(str(reference_target_path), str(eagle3_dir))
    assert not chain.tree and chain.steps == 3 and chain.block_size == 4 and chain.windows == [8]
    assert isinstance(chain, StaticEagle3Drafter)  # chains: the fixed-shape drafter (captured on a GPU)
    assert (drafting_label(drafter), drafting_label(chain)) == ("EAGLE-3 tree top-3, 7 nodes, depth 2", "EAGLE-3 chain of 3")
    with pytest.raises(ValueError, match="is an EAGLE-3 drafter: --tree-redraft is a DFlash option"):
        load_models(str(reference_target_path), str(eagle3_dir), tree_topk=3, tree_redraft=1)
    _, int8_chain, _ = load_models(str(reference_target_path), str(eagle3_dir), drafter_weights="int8")
    assert isinstance(int8_chain, StaticEagle3Drafter) and drafting_label(int8_chain) == "EAGLE-3 chain of 3, int8 weights"
    assert int8_chain.with_window(4).weights == "int8"


@pytest.mark.parametrize("flags", [[], ["--draft-steps", "2", "--tree-topk", "3", "--tree-tokens", "6"], ["--drafter-weights", "int8"]])
def test_cli_chain_and_tree(reference_target_path, eagle3_dir, tmp_path, capsys, flags) -> None:
    out = tmp_path / "stats.json"
    rc = infer_main(["--target", str(reference_target_path), "--drafter", str(eagle3_dir), "--question", "81", "--max-new-tokens", "8",
                     "--baseline", "--window", "4", "--json", str(out), *flags])
    assert rc == 0
    assert "identical output: True" in capsys.readouterr().err
    stats = json.loads(out.read_text())["speculative"]
    assert stats["block_size"] == (3 if "--tree-topk" in flags else 4) and stats["new_tokens"] == 8


def test_cli_prints_prompt_lookups_tau_on_the_same_prompts(reference_target_path, eagle3_dir, tmp_path, capsys) -> None:
    """A trained drafter's tau came alone; prompt lookup's on the same prompt(s) stands beside it now (as many drafts a
    step as the drafter's block), the same number a run of ``--drafter pld`` gives; ``--no-pld`` says it did not run."""
    common = ["--target", str(reference_target_path), "--question", "81", "--max-new-tokens", "12"]
    assert infer_main([*common, "--drafter", str(eagle3_dir), "--json", str(tmp_path / "d.json")]) == 0
    err = capsys.readouterr().err
    assert "[prompt lookup] tau " in err and "on the same prompt (3 drafts a step" in err
    assert infer_main([*common, "--drafter", "pld", "--draft-steps", "3", "--json", str(tmp_path / "p.json")]) == 0
    assert "[prompt lookup]" not in capsys.readouterr().err  # prompt lookup itself: its own tau is the one printed
    beside = json.loads((tmp_path / "d.json").read_text())["prompt_lookup"]
    alone = json.loads((tmp_path / "p.json").read_text())["speculative"]
    assert beside["accepted_per_step"] == alone["accepted_per_step"] and beside["tau"] == alone["tau"]
    assert infer_main([*common, "--drafter", str(eagle3_dir), "--no-pld"]) == 0
    assert "[prompt lookup] not run (--no-pld)" in capsys.readouterr().err
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Tell me about cats. Cats are"}\n{"prompt": "List three colors: red, green,"}\n')
    batch = ["--target", str(reference_target_path), "--prompts", str(prompts), "--max-new-tokens", "10", "--batch-size", "2"]
    assert infer_main([*batch, "--drafter", str(eagle3_dir), "--json", str(tmp_path / "b.json")]) == 0
    assert "prompt lookup on the same prompts (3 drafts a step): tau " in capsys.readouterr().err
    assert infer_main([*batch, "--drafter", "pld", "--draft-steps", "3", "--json", str(tmp_path / "bp.json")]) == 0
    assert json.loads((tmp_path / "b.json").read_text())["prompt_lookup_tau"] == json.loads((tmp_path / "bp.json").read_text())["tau"]


@pytest.mark.parametrize("batch_size", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_eval_mtbench_runs_eagle3_unchanged(reference_target_path, eagle3_dir, tmp_path, batch_size) -> None:
    out = tmp_path / "mt"
    rc = eval_main(["mtbench", "--target", str(reference_target_path), "--drafter", str(eagle3_dir), "--window", "4", "--num-questions",
                    str(batch_size), "--max-new-tokens", "8", "--batch-size", str(batch_size), "--out", str(out)])
    assert rc == 0
    result = json.loads((out / "results.json").read_text())
    assert result["summary"]["same_as_baseline"] == 1.0 and len(result["summary"]["acceptance_by_position"]) == 3


def test_eval_draft_steps_sets_the_chain_and_prompt_lookups_drafts(reference_target_path, eagle3_dir, tmp_path) -> None:
    """``--draft-steps 5`` on a drafter trained with 3 TTT steps: chains of 5 (batched too), prompt lookup beside with 5."""
    out = tmp_path / "mt"
    rc = eval_main(["mtbench", "--target", str(reference_target_path), "--drafter", str(eagle3_dir), "--num-questions", "2",
                    "--max-new-tokens", "8", "--batch-size", "2", "--draft-steps", "5", "--out", str(out)])
    assert rc == 0
    result = json.loads((out / "results.json").read_text())
    assert {r["stats"]["block_size"] for r in result["records"]} == {6}
    assert len(result["summary"]["acceptance_by_position"]) == 5 and len(result["summary"]["prompt_lookup"]["acceptance_by_position"]) == 5
    assert result["summary"]["same_as_baseline"] == 1.0


@pytest.mark.slow  # five eval runs (15 s); the quick tier stays under 3 minutes (README)
def test_eval_tree_drafting_is_lossless_and_batches(reference_target_path, accepting_eagle3_dir, tmp_path, capsys) -> None:
    """``--tree-topk/--tree-tokens`` in eval: every turn equals the target alone, steps as deep as the tree; batched
    (static trees, and with prompt lookup's branch) every turn's tokens and accepted counts are batch 1's."""
    base = ["mtbench", "--target", str(reference_target_path), "--drafter", str(accepting_eagle3_dir), "--num-questions", "1",
            "--max-new-tokens", "12", "--draft-steps", "2", "--tree-topk", "3", "--tree-tokens", "6"]
    assert eval_main(base + ["--out", str(tmp_path / "tree")]) == 0
    result = json.loads((tmp_path / "tree" / "results.json").read_text())
    assert result["summary"]["same_as_baseline"] == 1.0
    assert {r["stats"]["block_size"] for r in result["records"]} == {3}
    assert max(a for r in result["records"] for a in r["stats"]["accepted_per_step"]) == 2  # whole paths of the tree accepted
    assert len(result["summary"]["prompt_lookup"]["acceptance_by_position"]) == 2
    # prompt lookup's chain as one more branch: still lossless; steps as deep as the longer of the two, prompt lookup beside as deep
    assert eval_main(base + ["--tree-lookup", "4", "--out", str(tmp_path / "hybrid")]) == 0
    hybrid = json.loads((tmp_path / "hybrid" / "results.json").read_text())
    assert hybrid["summary"]["same_as_baseline"] == 1.0 and hybrid["config"]["tree_lookup"] == 4
    assert {r["stats"]["block_size"] for r in hybrid["records"]} == {5} and len(hybrid["summary"]["prompt_lookup"]["acceptance_by_position"]) == 4
    assert eval_main(base + ["--num-questions", "3", "--out", str(tmp_path / "one")]) == 0
    assert eval_main(base + ["--num-questions", "3", "--batch-size", "2", "--out", str(tmp_path / "b")]) == 0
    one, batched = (json.loads((tmp_path / d / "results.json").read_text())["records"] for d in ("one", "b"))
    assert [(r["id"], r["turn"], r["output_ids"], r["stats"]["accepted_per_step"]) for r in batched] == \
        [(r["id"], r["turn"], r["output_ids"], r["stats"]["accepted_per_step"]) for r in one]
    assert sum(a > 0 for r in one for a in r["stats"]["accepted_per_step"]) >= 5  # counts that a batching bug would move
    assert eval_main(base + ["--tree-lookup", "4", "--batch-size", "2", "--out", str(tmp_path / "bh")]) == 0  # the hybrid batched
    batched = json.loads((tmp_path / "bh" / "results.json").read_text())
    assert batched["summary"]["tau"] == hybrid["summary"]["tau"]
    assert [r["stats"]["accepted_per_step"] for r in batched["records"]] == [r["stats"]["accepted_per_step"] for r in hybrid["records"]]


@pytest.mark.parametrize("argv,message", [
    (["--tree-topk", "0"], "--tree-topk 0"),
    (["--tree-topk", "2", "--tree-tokens", "500"], "--tree-tokens 500"),
    (["--draft-steps", "0"], "--draft-steps 0"),
    (["--window", "0"], "--window '0'"),
    (["--tree-topk", "2", "--temperature", "0.5"], "tree drafting is greedy only"),
    (["--tree-lookup", "4"], "--tree-lookup 4: prompt lookup's branch joins a tree; give --tree-topk/--tree-tokens too"),
    (["--tree-topk", "2", "--tree-lookup", "-1"], "--tree-lookup -1; expected an int >= 0"),
])
def test_bad_options_are_one_line(reference_target_path, eagle3_dir, capsys, argv, message) -> None:
    base = ["--target", str(reference_target_path), "--drafter", str(eagle3_dir), "--prompt", "Hi", "--max-new-tokens", "4"]
    assert infer_main(base + argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("error:") == 1


def test_run_folder_gives_target_and_drafter_and_window_warns(reference_target_path, eagle3_dir, tmp_path, capsys) -> None:
    """``--drafter RUN`` (python -m train's output_dir) needs no --target: run.json records it."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "export").symlink_to(eagle3_dir)  # the trainer exports into its run folder (output_dir/export)
    (run / "run.json").write_text(json.dumps({"target": {"path": str(reference_target_path)}, "export": str(run / "export")}))
    assert infer_main(["--drafter", str(run), "--prompt", "Hi", "--max-new-tokens", "4", "--window", "16", "--device", "auto"]) == 0
    err = capsys.readouterr().err
    assert err.count("--window 16 is beyond the W=8 this drafter was trained with") == 1 and "[speculative]" in err
    assert "is not the target" not in err
    other = tmp_path / "other_target"  # the same shapes (it loads), another config: a model the drafter was not trained on
    other.mkdir()
    for f in Path(reference_target_path).iterdir():
        if f.is_file() and f.name != "config.json":
            (other / f.name).symlink_to(f)
    config = json.loads((Path(reference_target_path) / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "rope_theta": 2 * config.get("rope_theta", 10000)}))
    assert infer_main(["--drafter", str(run), "--target", str(other), "--prompt", "Hi", "--max-new-tokens", "2"]) == 0
    assert f"warning: --target {other} is not the target the run {run} was trained on" in capsys.readouterr().err
    (run / "run.json").write_text(json.dumps({"target": {"path": str(reference_target_path)}, "export": None}))
    assert infer_main(["--drafter", str(run), "--prompt", "Hi"]) == 2
    assert "the run has no export" in capsys.readouterr().err
    assert infer_main(["--prompt", "Hi"]) == 2
    assert "--target is required unless --drafter is a training run folder" in capsys.readouterr().err


def test_prompt_lookup_drafter_is_lossless_and_drafts_from_the_context(reference_target_path, capsys) -> None:
    from infer.prompt_lookup import PromptLookupDrafter

    drafter = PromptLookupDrafter(num_draft_tokens=4, max_ngram=2)
    # the most recent earlier occurrence of the longest suffix: [5, 6] last seen before position 7, followed by 9, 1
    assert drafter.propose([5, 6, 7, 8, 5, 6, 9, 1, 5, 6]) == [9, 1, 5, 6]
    assert drafter.propose([1, 2, 3, 4]) == []  # no earlier match: nothing (vLLM's ngram proposer)
    assert drafter.propose([3, 1, 2, 3]) == [1, 2, 3]  # a 1-gram match near the end: only what follows it
    assert infer_main(["--target", str(reference_target_path), "--drafter", "pld", "--question", "81", "--max-new-tokens", "24",
                       "--baseline"]) == 0
    assert "identical output: True" in capsys.readouterr().err


def test_cli_prompts_file_batched_equals_one_prompt_at_a_time(reference_target_path, eagle3_dir, tmp_path, capsys) -> None:
    """``python -m infer --prompts F --batch-size 2``: each prompt's text and acceptance are those of ``--prompt`` alone."""
    questions = ["Write a haiku about rain.", "Name three rivers in Europe.", "How do I sort a list in Python?"]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": q}) + "\n" for q in questions))
    common = ["--target", str(reference_target_path), "--drafter", str(eagle3_dir), "--max-new-tokens", "12", "--threads", "1"]
    singles = []
    for q in questions:
        out = tmp_path / "one.json"
        assert infer_main([*common, "--prompt", q, "--json", str(out)]) == 0
        singles.append((capsys.readouterr().out.strip(), json.loads(out.read_text())["speculative"]["accepted_per_step"]))
    out = tmp_path / "many.json"
    assert infer_main([*common, "--prompts", str(prompts), "--batch-size", "2", "--json", str(out)]) == 0
    printed = capsys.readouterr().out.strip().split("### ")[1:]
    report = json.loads(out.read_text())
    assert report["prompts"] == 3 and report["batch_size"] == 2
    assert [(text.split("\n", 1)[1].strip(), p["accepted_per_step"]) for text, p in zip(printed, report["per_prompt"])] == singles


def test_cli_batch_size_mistakes_are_one_line_and_trees_batch(reference_target_path, accepting_eagle3_dir, tmp_path, capsys) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "Hi"}) + "\n")
    common = ["--target", str(reference_target_path), "--drafter", str(accepting_eagle3_dir), "--max-new-tokens", "4", "--threads", "1"]
    assert infer_main([*common, "--prompt", "Hi", "--batch-size", "2"]) == 2
    assert capsys.readouterr().err.strip() == "error: --batch-size 2; expected >= 1, and above 1 only with --prompts FILE"
    # trees on the static caches at every batch size (batch 1: one row of the batched loop): the same text and τ
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in CLI_PROMPTS))
    tree = ["--prompts", str(prompts), "--tree-topk", "2", "--tree-tokens", "4", "--draft-steps", "2", "--max-new-tokens", "12"]
    capsys.readouterr()
    assert infer_main([*common, *tree, "--batch-size", "1"]) == 0
    one = capsys.readouterr()
    assert infer_main([*common, *tree, "--batch-size", "2"]) == 0
    two = capsys.readouterr()
    assert one.out == two.out and one.out.count("### ") == 3
    assert one.err.split("| tau ")[-1] == two.err.split("| tau ")[-1]  # "tau T over S steps"
    assert float(one.err.split("| tau ")[-1].split()[0]) > 1.3  # drafts accepted: a batching bug would move the count


@pytest.mark.parametrize("argv,message", [
    (["--prompt", "  "], "--prompt '  ' is empty; expected the user message"),
    (["--prompt", "Hi", "--device", "bogus"], "--device 'bogus'; expected auto, cpu, cuda or cuda:N"),
    (["--prompt", "Hi", "--device", "cuda:99"], "--device cuda:99: this machine has"),
    (["--prompt", "Hi", "--json", "{tmp}"], "a folder; expected a file path to write the statistics to"),
    (["--prompt", "Hi", "--drafter", "pld", "--draft-steps", "0"], "--draft-steps 0; expected >= 1"),  # was: 0 read as the default 15
    (["--prompt", "Hi", "--max-new-tokens", "0"], "--max-new-tokens 0; expected >= 1"),  # was said after the target loaded
    # decoded a 40K-token prompt on the 32K target for minutes, exit 0
    (["--prompt", "Hi", "--prefill-tokens", "40000"], "the prompt: 400"),
    (["--prompts", "{tmp}/p.jsonl", "--prefill-tokens", "40000"], "record 1: 400"),
])
def test_bad_cli_values_are_one_line_before_generating(reference_target_path, tmp_path, capsys, argv, message) -> None:
    """Each used to end in a traceback (some after the whole generation), or ran on silently with another value."""
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    (tmp_path / "p.jsonl").write_text('{"prompt": "Hi"}\n')
    assert infer_main(["--target", str(reference_target_path), "--max-new-tokens", "2", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("error:") == 1 and "Traceback" not in err


def test_bad_target_threads_and_dtype_exit_2_in_one_line(tmp_path, capsys) -> None:
    """A folder that is no model (transformers: five lines about tokenizers), a file, a missing path (a malformed hub id);
    --threads 0 (was exit status 1); --dtype float17 (was an AttributeError traceback)."""
    (tmp_path / "file.txt").write_text("x")
    for target, what in [(tmp_path, "no config.json there"), (tmp_path / "file.txt", "a file, not a folder"),
                         (tmp_path / "missing", "no such folder")]:
        assert infer_main(["--target", str(target), "--prompt", "Hi"]) == 2
        err = capsys.readouterr().err
        assert f"error: --target={str(target)!r}: {what}; expected a Hugging Face model folder" in err and err.count("\n") == 1
    with pytest.raises(SystemExit) as exit_:
        infer_main(["--target", str(tmp_path), "--prompt", "Hi", "--threads", "0"])
    assert exit_.value.code == 2 and "error: --threads 0; expected >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        infer_main(["--target", str(tmp_path), "--prompt", "Hi", "--dtype", "float17"])
    assert exit_.value.code == 2 and "invalid choice: 'float17'" in capsys.readouterr().err


def test_a_recorded_target_that_moved_is_named_as_recorded(tmp_path, capsys) -> None:
    """A training run folder as --drafter whose recorded target is gone: the one line says the target came from the
    record, not from a --target flag that was never given."""
    export = tmp_path / "run" / "export"
    export.mkdir(parents=True)
    (export / "config.json").write_text("{}")
    gone = tmp_path / "moved-model"
    (tmp_path / "run" / "run.json").write_text(json.dumps({"export": str(export), "target": {"path": str(gone)}}))
    assert infer_main(["--drafter", str(tmp_path / "run"), "--prompt", "Hi"]) == 2
    err = capsys.readouterr().err
    assert f"error: target (recorded with the drafter)={str(gone)!r}: no such folder; expected a Hugging Face model folder" in err
    assert err.count("\n") == 1


def test_a_missing_prompts_file_or_drafter_is_named_before_any_model_loads(tmp_path, capsys) -> None:
    """--prompts and --drafter are checked before the target loads (a missing prompts file surfaced after an 8B target's
    minute of loading; a missing drafter as 'no config.json there' after it): with a target that is no model folder at all,
    the error still names them, so nothing was loaded first."""
    no_target = str(tmp_path / "no-target")
    assert infer_main(["--target", no_target, "--prompts", str(tmp_path / "missing.jsonl")]) == 2
    err = capsys.readouterr().err
    assert f"error: --prompts {tmp_path / 'missing.jsonl'}: no such file; expected a JSONL file of prompts" in err and err.count("\n") == 1
    assert infer_main(["--target", no_target, "--drafter", str(tmp_path / "missing"), "--prompt", "Hi"]) == 2
    err = capsys.readouterr().err
    assert f"error: --drafter='{tmp_path / 'missing'}': no such folder; expected a training run folder" in err and err.count("\n") == 1
