"""``python -m eval --engine vllm``'s plumbing that needs no vLLM: counters -> per-step histogram, and refusals."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from eval.engines import VllmEngine, engine_drafter, steps_from_counters
from infer.generate import pooled_acceptance


def test_counters_give_back_the_per_step_histogram() -> None:
    """vLLM reports, per draft position k, how many verify steps accepted more than k drafts; that fixes the
    histogram of accepted drafts per step, so pooled τ and acceptance by position equal the per-step ones."""
    rng = random.Random(0)
    for _ in range(50):
        k = rng.randint(1, 8)
        steps = [rng.randint(0, k) for _ in range(rng.randint(0, 40))]
        per_pos = [sum(a > i for a in steps) for i in range(k)]  # vllm:spec_decode_num_accepted_tokens_per_pos
        rebuilt = steps_from_counters(len(steps), per_pos)
        assert sorted(rebuilt) == sorted(steps)
        assert pooled_acceptance(rebuilt, k + 1) == pooled_acceptance(steps, k + 1)
    with pytest.raises(ValueError, match="not a tail distribution"):
        steps_from_counters(3, [4, 1])


def test_engine_needs_vllms_python(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--engine vllm needs vLLM's Python"):
        VllmEngine(str(tmp_path / "no-python"), "t", None, None, 0, [], 128)


def test_our_own_layout_is_refused_with_the_export_command(tmp_path: Path) -> None:
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "config.json").write_text(json.dumps({"architectures": ["Eagle3DraftModel"]}))
    with pytest.raises(ValueError, match=r"python -m train.export .*export_speculators --format speculators"):
        engine_drafter(str(tmp_path / "export"), "eagle3")
    (tmp_path / "export_speculators").mkdir()
    (tmp_path / "export_speculators" / "config.json").write_text(json.dumps({"speculators_model_type": "eagle3"}))
    assert engine_drafter(str(tmp_path / "export"), "eagle3") == str(tmp_path / "export_speculators")


def test_cli_refuses_what_vllm_cannot_run(tmp_path: Path, capsys) -> None:
    from eval.__main__ import main

    (tmp_path / "p.jsonl").write_text('{"prompt": "hi"}\n')
    common = ["prompts", "--prompts", str(tmp_path / "p.jsonl"), "--drafter", "pld", "--target", "builtin:tiny-qwen3",
              "--engine", "vllm", "--out", str(tmp_path / "out")]
    assert main(common + ["--window", "64"]) == 2  # refused before any model loads
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "--engine vllm runs the window the export was trained with" in err
    assert main(common + ["--temperature", "0.7"]) == 2
    assert "greedy only" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
