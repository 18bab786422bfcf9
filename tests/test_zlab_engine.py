"""z-lab's reference DFlash loop (PyPI ``dflash``) as an eval engine: over our export it decodes the target's greedy
tokens with the same acceptance as our loop, step by step; the steps are read from where its target forwards start."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from infer.generate import generate
from infer.prompts import long_prompt_ids, mt_bench_questions
from eval.engines import engine_drafter
from infer.zlab_engine import ZlabEngine, steps_from_anchors
from models.dflash import DFlashDrafter
from models.static_target import StaticTarget
from train.export import export
from infer_helpers import memorised_dflash_drafter

LAYERS = [1, 3, 5]

pytestmark = pytest.mark.usefixtures("single_cpu_thread")


def test_steps_from_anchors() -> None:
    # prompt of 10; the prefill gave the token at 10; verify blocks anchored at 10, 13 and 14; 8 new tokens (10 .. 17)
    assert steps_from_anchors([10, 13, 14], 10, 8) == [2, 0, 2]
    assert steps_from_anchors([], 10, 1) == []  # the prefill's token alone


def test_our_layout_without_a_zlab_export_is_refused(tmp_path: Path) -> None:
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "config.json").write_text(json.dumps({"dflash_config": {}, "sliding_block_causal": True}))
    with pytest.raises(ValueError, match=r"not a DFlash export in z-lab's layout.*--format dflash"):
        engine_drafter(str(tmp_path / "export"), "dflash", "zlab")
    (tmp_path / "export_dflash").mkdir()
    (tmp_path / "export_dflash" / "config.json").write_text(json.dumps({"dflash_config": {}}))
    assert engine_drafter(str(tmp_path / "export"), "dflash", "zlab") == str(tmp_path / "export_dflash")


def test_a_draft_vocabulary_goes_to_vllm_in_speculators_layout_and_not_to_zlab(tmp_path: Path) -> None:
    (tmp_path / "export").mkdir()
    config = {"dflash_config": {}, "sliding_block_causal": True, "draft_vocab_size": 300}
    (tmp_path / "export" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="draft_vocab_size=300.*use --engine ours or vllm"):
        engine_drafter(str(tmp_path / "export"), "dflash", "zlab")
    with pytest.raises(ValueError, match=r"not a DFlash export in speculators' layout.*--format speculators"):
        engine_drafter(str(tmp_path / "export"), "dflash", "vllm")
    (tmp_path / "export_speculators").mkdir()
    (tmp_path / "export_speculators" / "config.json").write_text(json.dumps({"speculators_model_type": "dflash"}))
    assert engine_drafter(str(tmp_path / "export"), "dflash", "vllm") == str(tmp_path / "export_speculators")


@pytest.fixture(scope="module")
def setup(reference_target_path, tmp_path_factory, run_shared_dir):
    model = AutoModelForCausalLM.from_pretrained(reference_target_path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(reference_target_path)
    questions = [q["turns"][0] for q in mt_bench_questions()[:3]]
    prompts = [long_prompt_ids(tokenizer, q) for q in questions]
    # the loop tests' drafter (test_infer_generate's, trained once per run): it memorised prompts[:2] and reads LAYERS
    drafter = memorised_dflash_drafter(model, tokenizer, run_shared_dir)
    root = tmp_path_factory.mktemp("zlab")
    drafter.save_pretrained(root / "ours")
    export(root / "ours", root / "export_dflash", fmt="dflash", target=str(reference_target_path), dtype="float32")
    return model, prompts, drafter, root


@pytest.mark.slow
def test_zlab_loop_accepts_what_ours_accepts(setup) -> None:
    model, prompts, drafter_model, root = setup
    engine = ZlabEngine(model, engine_drafter(str(root / "ours"), "dflash", "zlab"), eos=[])  # our layout: the run's export_dflash beside it
    assert engine.drafter == str(root / "export_dflash")
    target = StaticTarget(model, LAYERS, compile_layers=False)
    ours = DFlashDrafter(drafter_model, model.get_input_embeddings(), model.get_output_embeddings())
    accepted = 0
    try:
        for prompt in prompts:  # two memorised, one not
            want = model.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False, eos_token_id=None,
                                  pad_token_id=0)[0, len(prompt):].tolist()
            tokens, stats = engine.generate(prompt, 40)
            mine = generate(target, ours, prompt, max_new_tokens=40)
            assert tokens == want == mine.tokens
            assert stats["accepted_per_step"] == mine.stats.accepted_per_step
            assert stats["engine"] == "zlab" and stats["tau"] == pytest.approx(mine.stats.tau)
            accepted += sum(stats["accepted_per_step"])
            # an end-of-sequence token inside a step: both loops stop after it and count the same steps
            eos = want[17]
            stop = want.index(eos) + 1
            stopping = ZlabEngine(model, str(root / "export_dflash"), eos=[eos])
            tokens, stats = stopping.generate(prompt, 40)
            stopping.close()  # its hook off the target
            mine = generate(target, ours, prompt, max_new_tokens=40, eos_token_ids=[eos])
            assert tokens == want[:stop] == mine.tokens
            assert stats["accepted_per_step"] == mine.stats.accepted_per_step
    finally:
        engine.close()
    assert accepted > 20  # the drafter is accepted: multi-token steps are exercised


@pytest.mark.slow
def test_eval_cli_runs_zlab_engine(setup, reference_target_path, tmp_path: Path) -> None:
    """``python -m eval prompts --engine zlab``: z-lab's τ and our target's tokens in the records; EAGLE-3 or prompt
    lookup are refused in one line."""
    _, _, _, root = setup
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"turns": [mt_bench_questions()[0]["turns"][0]]}) + "\n")
    cmd = [sys.executable, "-m", "eval", "prompts", "--prompts", str(prompts), "--target", str(reference_target_path),
           "--max-new-tokens", "24", "--dtype", "float32", "--no-pld"]
    run = subprocess.run(cmd + ["--drafter", str(root / "export_dflash"), "--engine", "zlab", "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads((tmp_path / "out" / "results.json").read_text())
    record = result["records"][0]
    assert record["stats"]["engine"] == "zlab" and record["same_as_baseline"] is True
    assert result["summary"]["engine"] == "zlab" and "engine: zlab" in run.stdout
    refused = subprocess.run(cmd + ["--drafter", "pld", "--engine", "zlab"], capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1].startswith("error: --engine zlab")
