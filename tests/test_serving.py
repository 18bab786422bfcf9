"""The serving engines' plumbing that needs no vLLM: counters -> per-step histogram, /metrics parsing, refusals."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from eval.engines import engine_drafter
from infer.serving import ServerEngine, VllmEngine, parse_spec_metrics, steps_from_counters
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
    with pytest.raises(ValueError, match="vLLM's Python not found"):
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


def test_metrics_page_gives_the_counters() -> None:
    """A Prometheus page as vLLM 0.32 writes it (two engines, labels in any order): counters summed per position."""
    page = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="t"} 12.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="t"} 3.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="t"} 36.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="t",position="0"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="t",position="2"} 2.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{position="1",engine="0",model_name="t"} 5.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="t",position="0"} 1.0
vllm:spec_decode_num_accepted_tokens_per_pos_created{engine="0",model_name="t",position="0"} 1.7e9
"""
    assert parse_spec_metrics(page) == {"drafts": 15, "accepted_per_pos": [10, 5, 2]}
    assert parse_spec_metrics("vllm:num_requests_running 0.0\n") is None


def test_unreachable_server_is_one_line(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ValueError, match=rf"server http://127.0.0.1:{port}: unreachable .*OpenAI-compatible") as e:
        ServerEngine(f"http://127.0.0.1:{port}", timeout=5)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("tokens,budget,reason,ended", [
    ([5, 6, 2], 3, None, True),      # the end-of-sequence token returned within the budget
    ([5, 6], 3, None, True),         # fewer tokens than the budget: the engine stopped at (and dropped) its end
    ([5, 6, 7], 3, None, False),     # the budget reached, no end seen: cut
    ([5, 6, 7, 2], 3, None, False),  # an end past the budget does not count
    ([5, 6, 7], 3, "stop", True),    # a server's finish reason decides where it gives one
    ([5, 6], 3, "length", False),
])
def test_a_reply_ended_or_was_cut_at_its_budget(tokens, budget, reason, ended) -> None:
    from infer.serving import reply_ended

    assert reply_ended(tokens, [2], budget, reason) is ended


def test_a_missing_vllm_python_is_refused_before_the_target_loads(tmp_path: Path, capsys, monkeypatch) -> None:
    """The interpreter was looked up in start_engine, after the target (8B at scale) had loaded."""
    from eval.__main__ import main
    from models.target import TargetModel

    def no_load(*a, **k):
        raise AssertionError("the target loaded before vLLM's Python was checked")

    monkeypatch.delenv("SWA_VLLM_PYTHON", raising=False)
    monkeypatch.setattr(TargetModel, "from_pretrained", no_load)
    (tmp_path / "p.jsonl").write_text('{"prompt": "hi"}\n')
    assert main(["prompts", "--prompts", str(tmp_path / "p.jsonl"), "--drafter", "pld", "--target", "builtin:tiny-qwen3",
                 "--engine", "vllm", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "vLLM's Python not found: neither --vllm-python nor SWA_VLLM_PYTHON is set" in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("setting", [None, "/nonexistent/bin/python"])
def test_regeneration_through_vllm_names_its_config_key_when_the_python_is_missing(setting, monkeypatch, tiny_qwen3_path) -> None:
    """Found by review (2026-12-05's fifth session): a training run with ``data.regenerate.engine=vllm`` and no vLLM
    environment was told to pass ``--vllm-python``, a flag the trainer does not have; the error names the config key."""
    from types import SimpleNamespace

    from train.config import RegenerateConfig
    from train.data.regenerate import reply_engine

    monkeypatch.delenv("SWA_VLLM_PYTHON", raising=False)
    target = SimpleNamespace(tokenizer=SimpleNamespace(eos_token_id=2), path=tiny_qwen3_path)
    found = "neither data.regenerate.vllm_python nor SWA_VLLM_PYTHON is set" if setting is None else \
        f"data.regenerate.vllm_python='{setting}' does not exist"
    with pytest.raises(ValueError, match="vLLM's Python not found: " + re.escape(found)) as error:
        reply_engine(RegenerateConfig(enabled=True, engine="vllm", vllm_python=setting), target, 256)
    assert "--vllm-python" not in str(error.value)


def test_regeneration_through_a_server_sends_each_reply_its_own_seed(monkeypatch) -> None:
    """The server client sent the one ``data.regenerate.seed`` with every request: sampled replies to a repeated prompt
    came out alike. Each request now carries its reply's seed (``train.data.regenerate.reply_seed``), the rest of the
    sampling settings unchanged."""
    from train.config import RegenerateConfig
    from train.data.regenerate import EngineReplies, reply_seed

    bodies = []

    def call(self, path, body, raw=False):
        bodies.append(body)
        return {"choices": [{"token_ids": [5, 6], "text": "x", "finish_reason": "length"}]}

    monkeypatch.setattr(ServerEngine, "_call", call)
    server = object.__new__(ServerEngine)  # no server to list models from: the requests are what is checked
    server.url, server.eos, server.concurrency, server.timeout, server.model = "http://unused", [2], 2, 5.0, "m"
    cfg = RegenerateConfig(enabled=True, engine="server", server_url="http://unused", temperature=0.7, top_p=0.9, seed=3,
                           concurrency=2)
    seeds = [reply_seed(cfg.seed, c, 0) for c in range(4)]
    got = sorted(i for i, *_ in EngineReplies(server, cfg).replies([[1, 2]] * 4, [2] * 4, seeds))
    assert got == [0, 1, 2, 3]
    assert sorted(b["seed"] for b in bodies) == sorted(seeds) and len(set(seeds)) == 4
    assert all(b["temperature"] == 0.7 and b["top_p"] == 0.9 for b in bodies)


def test_an_engines_reply_keeps_its_end_of_sequence_token_as_our_loop_does() -> None:
    """Our loop outputs the end-of-sequence token; vLLM's and a server's replies were cut before it, so eval's
    "tokens = target alone" read 0% on every reply that ended before its budget (a lossless engine). Regeneration
    still takes the reply without it."""
    from infer.serving import cut_at_eos, through_eos

    assert through_eos([5, 6, 2, 7, 2], [2]) == [5, 6, 2] and cut_at_eos([5, 6, 2, 7, 2], [2]) == [5, 6]
    assert through_eos([5, 6], [2]) == [5, 6] and through_eos([2], [3, 2]) == [2]


def test_printed_serve_commands_survive_paths_with_spaces_and_quotes() -> None:
    """The spec was built with %s (a quote in the path made it no JSON) and the paths left bare (a space split them)."""
    import shlex

    from train import engines

    target, draft = "/m/my target", '/runs/my "best" run/export_dflash'
    for command in (engines.vllm_dflash_command(target, draft, 16), engines.vllm_eagle3_command(target, draft, 7)):
        words = shlex.split(command)
        assert words[:3] == ["vllm", "serve", target]
        spec = json.loads(words[words.index("--speculative-config") + 1])
        assert spec["model"] == draft and spec["num_speculative_tokens"] in (15, 7)
    for command in (engines.sglang_dflash_command(target, draft), engines.sglang_eagle3_command(target, draft, 7, 2048)):
        words = shlex.split(command)
        assert words[words.index("--model-path") + 1] == target and words[words.index("--speculative-draft-model-path") + 1] == draft
    assert engines.vllm_dflash_command("/m/t", "/d", 16) == \
        'vllm serve /m/t --speculative-config \'{"method": "dflash", "model": "/d", "num_speculative_tokens": 15}\''
