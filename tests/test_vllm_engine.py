"""A real engine in the loop: vLLM (CPU build, its own environment) serves our exports.

Drafters trained a few steps on the reference target, exported, served by vLLM: EAGLE-3
(``--format speculators``, with speculators' ``norm_before_fc`` and ``norm_output``) and an all-sliding DFlash (``--format dflash``) give exactly our loop's
acceptance (the per-step histogram rebuilt from vLLM's counters equals ours) and our tokens, which equal
the target's own greedy tokens; the DFlash ``--format speculators`` export loads and decodes losslessly;
regeneration through vLLM (in process and through ``vllm serve``) equals the target's greedy replies;
what vLLM refuses is one line.

Needs vLLM's Python in ``SWA_VLLM_PYTHON`` (``.ci/vllm-env`` makes one); skipped without it unless
``SWA_VLLM_REQUIRED=1`` (CI), where a missing vLLM fails. Marked slow: ``-m "not slow"`` skips them.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import socket
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from compose import compose_train

from infer.generate import pooled_acceptance

VLLM_PYTHON = os.environ.get("SWA_VLLM_PYTHON")
if not (VLLM_PYTHON and Path(VLLM_PYTHON).exists()):
    if os.environ.get("SWA_VLLM_REQUIRED") == "1":
        raise RuntimeError(f"SWA_VLLM_REQUIRED=1 but SWA_VLLM_PYTHON={VLLM_PYTHON!r} is not vLLM's Python")
    pytest.skip("vLLM's environment not set up (SWA_VLLM_PYTHON; see .ci/vllm-env)", allow_module_level=True)

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(1200)]

# "Hi": a reply that ends before the 48-token budget (the target's end-of-turn token is output, by our loop and by vLLM's
# engine as eval reads it: cut before it, eval's "tokens = target alone" read 0% on such replies)
PROMPTS = ["What is the capital of France?", "Write a short poem about the sea.", "Explain what a hash table is.",
           "Give me three tips for learning to cook.", "Hi"]
NEW_TOKENS = 48


def on_policy_settings(reference_target_path, root: Path) -> list[str]:
    """Overrides that train a drafter on the reference target's own replies to the test prompts (data.regenerate)."""
    data = root / "prompts_to_learn.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": p}, {"role": "assistant", "content": "."}]}) + "\n"
                            for p in PROMPTS))
    return ["target=qwen3_27m_sharegpt", f"target.path={reference_target_path}", f"data.path={data}", "data.num_eval=0",
            "data.regenerate.enabled=true", f"data.regenerate.max_new_tokens={NEW_TOKENS + 16}", "data.regenerate.engine=ours",
            "trainer.batch_size=4", "trainer.eval_every=1000", "trainer.checkpoint_every=1000", "trainer.loop_eval_prompts=0",
            "trainer.progress=false", "trainer.lr=3e-3", "trainer.warmup_ratio=0.05"]


def train_eagle3(out: Path, common: list[str], *extra: str) -> Path:
    """EAGLE-3 in the small recipes' shape (speculators' defaults): one norm over the concatenated features, the normed
    state fed to the next step; vLLM reads both from the export's config (input_norm, norm_output)."""
    from train.trainer import train

    train(compose_train(["experiment=eagle3_swa_tiny", *common, "trainer.max_steps=60", "drafter.draft_vocab_size=1024",
                         "drafter.norm_before_fc=true", "drafter.norm_output=true",
                         "trainer.export_formats=[speculators]", *extra, f"output_dir={out}"]))
    return out


@pytest.fixture(scope="module")
def drafters(reference_target_path, tmp_path_factory) -> dict[str, Path]:
    """EAGLE-3 (one sliding layer) and DFlash (two sliding layers) trained on-policy on the test prompts: the target
    regenerates the replies (data.regenerate) and the drafters learn them, so drafts are accepted often and the
    comparison covers multi-token steps, in a minute of CPU each."""
    root = tmp_path_factory.mktemp("vllm_drafters")
    common = on_policy_settings(reference_target_path, root)
    from train.trainer import train

    train_eagle3(root / "eagle3", common)
    # DFlash with AdamW, not the tiny recipe's Muon: on a 2-core CPU without bf16 hardware Muon's fp32 Newton-Schulz made
    # this run 135 s against AdamW's 73 s, and what vLLM is compared on is the export, not how it was trained (Muon's
    # training runs in test_train_pipeline's tiny experiments and test_optim). 16 anchors a row, not the recipe's 32:
    # the replies are 64 tokens; this run took 123 s on one core with 32, ~60 s with 16 (regeneration included)
    train(compose_train(["experiment=dflash_swa_tiny", *common, "trainer.max_steps=80", "drafter.num_anchors=16",
                         "drafter.layer_types=[sliding_attention,sliding_attention]",
                         "trainer.optimizer=adamw", "trainer.export_formats=[dflash,speculators]", f"output_dir={root / 'dflash'}"]))
    return {"eagle3": root / "eagle3", "dflash": root / "dflash"}


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("vllm_prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return path


def run_eval(run: Path, prompts: Path, out: Path, *extra: str) -> dict:
    from eval.__main__ import main

    code = main(["prompts", "--prompts", str(prompts), "--drafter", str(run), "--max-new-tokens", str(NEW_TOKENS), "--no-pld",
                 "--out", str(out), "--vllm-python", VLLM_PYTHON, *extra])
    assert code == 0
    return json.loads((out / "results.json").read_text())


@pytest.fixture(scope="module")
def eagle3_in_vllm(drafters, prompts_file, tmp_path_factory) -> dict:
    """In-process vLLM over the EAGLE-3 export, with our target's greedy tokens beside (``--baseline``): the records both
    the comparison with our loop and the one with ``vllm serve`` read, so vLLM starts and decodes them once, not twice."""
    return run_eval(drafters["eagle3"], prompts_file, tmp_path_factory.mktemp("eagle3_vllm"), "--engine", "vllm", "--baseline")


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_vllm_gives_our_loops_acceptance_and_tokens(kind: str, drafters, prompts_file, tmp_path: Path, reference_target_path,
                                                    request) -> None:
    """Prompts of ~18 tokens and 48 new ones pass the window of 64, so the window binds in the later steps.

    EAGLE-3: vLLM's per-step histogram equals our loop's exactly (it differs under windows 63, 65 or none) on every prompt
    where the drafter (trained here, so its weights depend on the CPU's arithmetic) has no near-tie: on an AVX-512
    machine on all four; on a 2-core AVX2 EPYC one prompt had two steps moved (tokens identical, 10 steps against vLLM's
    12), so one prompt may move two. DFlash, measured on vLLM 0.32's CPU build: tokens identical, histograms equal on most
    prompts, one or two steps of ~20 moved on the others (drafter top-2 margins of ~2e-3 decide them; rounding the
    weights to bf16 moves our own counts as much); no inference window of ours reproduces all of vLLM's, so it is not a
    window convention. Pinned as measured."""
    export = drafters[kind] / ("export_speculators" if kind == "eagle3" else "export_dflash")
    # our loop reads what vLLM loads (DFlash: the bf16 export; EAGLE-3: the run, whose fp32 weights the export keeps)
    ours = run_eval(export if kind == "dflash" else drafters[kind], prompts_file, tmp_path / "ours", "--no-baseline",
                    "--target", str(reference_target_path))
    vllm = (request.getfixturevalue("eagle3_in_vllm") if kind == "eagle3"
            else run_eval(drafters[kind], prompts_file, tmp_path / "vllm", "--engine", "vllm", "--baseline"))
    assert vllm["config"]["engine_drafter"] == str(export)
    exact = prompts_with_equal_histograms(ours, vllm, kind)
    assert exact >= (len(PROMPTS) - 1 if kind == "eagle3" else len(PROMPTS) // 2)
    if kind == "eagle3":  # vLLM's summary is its steps pooled; with every prompt matched, ours pooled too
        block = len(ours["summary"]["acceptance_by_position"]) + 1
        steps = {"ours": [s for r in ours["records"] for s in untrimmed(r)],
                 "vllm": [s for r in vllm["records"] for s in r["stats"]["accepted_per_step"]]}
        for who in ("vllm",) + (("ours",) if exact == len(PROMPTS) else ()):
            tau, by_position = pooled_acceptance(steps[who], block)
            assert tau == pytest.approx(vllm["summary"]["tau"], abs=1e-12), who
            assert by_position == pytest.approx(vllm["summary"]["acceptance_by_position"], abs=1e-12), who
    # drafts were accepted: the comparison covered multi-token steps (DFlash 1.49 with "Hi" among the prompts, on a 2-core
    # AVX-512 EPYC; over the first four 1.5-1.6)
    assert ours["summary"]["tau"] > 1.3 and any(a >= 2 for r in ours["records"] for a in r["stats"]["accepted_per_step"])
    assert any(r["stats"]["new_tokens"] < NEW_TOKENS for r in vllm["records"])  # a reply ended before its budget


def test_vllm_serves_a_two_layer_eagle3_export(reference_target_path, prompts_file, tmp_path: Path) -> None:
    """EAGLE-3 with two decoder layers (both sliding, W = 64; the second a Llama layer over the first's output;
    speculators' ``num_hidden_layers: 2``): vLLM loads the export and decodes the target's greedy tokens, and its per-step acceptance
    histogram is our loop's (measured on a 2-core AVX-512 EPYC: equal on all five prompts; one may move two steps, as
    for one layer)."""
    run = train_eagle3(tmp_path / "eagle3_two_layers", on_policy_settings(reference_target_path, tmp_path), "drafter.num_hidden_layers=2",
                       "drafter.layer_types=[sliding_attention,sliding_attention]")
    assert json.loads((run / "export_speculators" / "config.json").read_text())["transformer_layer_config"]["num_hidden_layers"] == 2
    ours = run_eval(run, prompts_file, tmp_path / "ours", "--no-baseline", "--target", str(reference_target_path))
    vllm = run_eval(run, prompts_file, tmp_path / "vllm", "--engine", "vllm", "--baseline")
    assert vllm["config"]["engine_drafter"] == str(run / "export_speculators")
    assert prompts_with_equal_histograms(ours, vllm, "eagle3, two layers") >= len(PROMPTS) - 1
    assert ours["summary"]["tau"] > 1.3  # the drafter drafts: multi-token steps were compared


def prompts_with_equal_histograms(ours: dict, vllm: dict, label: str) -> int:
    """Prompt by prompt: the same tokens, vLLM's the target's own greedy ones, and at most two steps moved between the
    histograms of accepted drafts per verify step. Returns on how many prompts the histograms are equal."""
    exact = 0
    for a, b in zip(ours["records"], vllm["records"], strict=True):
        assert a["output_ids"] == b["output_ids"], (label, a["id"])
        assert b["same_as_baseline"], (label, a["id"])  # vLLM's tokens are the target's own greedy tokens
        # the histogram of accepted drafts per verify step, rebuilt from vLLM's counters, against our loop's counted as
        # vLLM counts: with the drafts the last step accepted past the token budget (we cut those from τ)
        mine, theirs = Counter(untrimmed(a)), Counter(b["stats"]["accepted_per_step"])
        moved = sum(((mine - theirs) + (theirs - mine)).values()) // 2
        exact += moved == 0
        assert moved <= 2, (label, a["id"], sorted(mine.items()), sorted(theirs.items()))
    return exact


def untrimmed(record: dict) -> list[int]:
    steps = list(record["stats"]["accepted_per_step"])
    steps[-1] += record["stats"]["accepted_past_end"]
    return steps


def target_greedy(reference_target_path, prompts: list[list[int]], n: int) -> list[list[int]]:
    from infer.generate import generate
    from infer.loading import eos_ids
    from models.target import CachedTarget, TargetModel

    target = TargetModel.from_pretrained(str(reference_target_path), "cpu")
    cached, eos = CachedTarget(target.model, []), eos_ids(target.tokenizer, target.model)
    return [[t for t in generate(cached, None, p, n, eos_token_ids=eos).tokens if t not in eos] for p in prompts]


def test_dflash_speculators_export_loads_and_is_lossless(drafters, reference_target_path, reference_tokenizer) -> None:
    from infer.prompts import chat_ids
    from infer.serving import VllmEngine

    export = drafters["dflash"] / "export_speculators"
    config = json.loads((export / "config.json").read_text())
    assert config["speculators_model_type"] == "dflash" and "verifier_lm_head.weight" not in json.dumps(config)
    prompts = [chat_ids(reference_tokenizer, [{"role": "user", "content": p}]) for p in PROMPTS[:2]]
    eos = [reference_tokenizer.convert_tokens_to_ids("<|im_end|>")]
    with VllmEngine(VLLM_PYTHON, str(reference_target_path), str(export), "dflash", config["block_size"] - 1, eos, 2048) as engine:
        got = [engine.generate(p, NEW_TOKENS) for p in prompts]
    assert [tokens for tokens, _ in got] == target_greedy(reference_target_path, prompts, NEW_TOKENS)
    assert all(stats["accepted_per_step"] for _, stats in got)  # it really speculated


def test_vllm_refuses_a_broken_target_in_one_line(tmp_path: Path, reference_target_path) -> None:
    from infer.serving import VllmEngine

    broken = tmp_path / "broken"
    broken.mkdir()
    for f in Path(reference_target_path).iterdir():
        if f.is_file() and f.name != "config.json":
            (broken / f.name).symlink_to(f)
    (broken / "config.json").write_text(json.dumps({"model_type": "qwen3", "architectures": ["NoSuchForCausalLM"]}))
    with pytest.raises(ValueError, match=rf"vLLM refused target {broken}: ") as e:
        VllmEngine(VLLM_PYTHON, str(broken), None, None, 0, [], 512)
    assert "\n" not in str(e.value)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def eagle3_server(drafters, reference_target_path):
    """``vllm serve`` of the reference target with the EAGLE-3 export, as a user runs it."""
    from infer.loading import load_models

    _, drafter, _ = load_models(str(reference_target_path), str(drafters["eagle3"] / "export"), "cpu", "float32", "trained", "sdpa")
    port = free_port()
    spec = json.dumps({"method": "eagle3", "model": str(drafters["eagle3"] / "export_speculators"),
                       "num_speculative_tokens": drafter.block_size - 1})
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    log = open(drafters["eagle3"] / "vllm_serve.log", "w")
    # `vllm serve` itself, by its module: the CPU wheel's `vllm` script looks up a distribution named `vllm` and stops
    # (it is installed as `vllm-cpu`)
    proc = subprocess.Popen([VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(reference_target_path),
                             "--port", str(port), "--dtype", "float32", "--max-model-len", "2048", "--enforce-eager",
                             "--max-num-seqs", "1", "--seed", "0", "--speculative-config", spec],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 600
        while time.time() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited {proc.returncode}: {(drafters['eagle3'] / 'vllm_serve.log').read_text()[-2000:]}")
            try:
                import urllib.request

                urllib.request.urlopen(url + "/v1/models", timeout=2).read()
                break
            except OSError:
                time.sleep(2)
        else:
            raise RuntimeError("vllm serve did not answer within 600 s")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_server_mode_gives_the_in_process_engines_numbers(drafters, prompts_file, eagle3_server, eagle3_in_vllm, tmp_path: Path) -> None:
    served = run_eval(drafters["eagle3"], prompts_file, tmp_path / "server", "--server", eagle3_server, "--baseline")
    assert eagle3_in_vllm["summary"]["engine"] == "vllm"
    for a, b in zip(eagle3_in_vllm["records"], served["records"], strict=True):
        assert a["output_ids"] == b["output_ids"] and b["same_as_baseline"]
        assert Counter(a["stats"]["accepted_per_step"]) == Counter(b["stats"]["accepted_per_step"])
    assert served["summary"]["engine"] == "server"


@pytest.mark.parametrize("engine", ["vllm", "server"])
def test_regeneration_through_vllm_equals_the_targets_greedy_replies(engine: str, reference_target_path, eagle3_server,
                                                                     tmp_path: Path) -> None:
    from test_regenerate import check_greedy_replies, conversations_to_regenerate

    from models.target import TargetModel
    from train.config import RegenerateConfig
    from train.data.chat import ChatRenderer
    from train.data.regenerate import reply_engine, regenerate_conversations

    target = TargetModel.from_pretrained(str(reference_target_path), "cpu")
    renderer = ChatRenderer(target.tokenizer)
    cfg = RegenerateConfig(enabled=True, max_new_tokens=12, engine=engine, concurrency=2, vllm_python=VLLM_PYTHON,
                           server_url=eagle3_server)
    replies = reply_engine(cfg, target, 1024)
    try:
        out, stats = regenerate_conversations(conversations_to_regenerate(), replies, renderer, cfg, max_length=1024, progress=False)
    finally:
        replies.close()
    assert stats["turns_regenerated"] == 4
    check_greedy_replies(target, renderer, conversations_to_regenerate(), out, 12)


def test_a_drafter_shape_vllm_cannot_run_is_one_line(drafters, reference_target_path, tmp_path: Path) -> None:
    """A DFlash drafter mixing sliding and full layers needs vLLM's V2 model runner (Triton: GPU only): on the CPU
    build it is refused at start-up, and the refusal reaches the user as one line naming the drafter."""
    from infer.serving import VllmEngine

    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for f in (drafters["dflash"] / "export_dflash").iterdir():
        if f.is_file() and f.name != "config.json":
            (mixed / f.name).symlink_to(f)
    config = json.loads((drafters["dflash"] / "export_dflash" / "config.json").read_text())
    config["layer_types"] = ["sliding_attention", "full_attention"]
    (mixed / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=rf"vLLM refused target .* with dflash drafter {mixed}: .*mixed sliding/full dflash drafts") as e:
        VllmEngine(VLLM_PYTHON, str(reference_target_path), str(mixed), "dflash", config["block_size"] - 1, [], 512)
    assert "\n" not in str(e.value)


def test_sampled_regeneration_through_vllm_gives_a_repeated_prompt_its_own_replies(reference_target_path) -> None:
    """vLLM's worker was sent the one ``data.regenerate.seed`` for every prompt: a prompt sampled four times got four
    identical replies (as ``ours`` did, fixed with ``reply_seed``). Each reply has its own seed now (the worker's
    SamplingParams per prompt), and a second pass through the same engine gives the same replies. The server client's
    per-request seeds: ``tests/test_serving.py``."""
    from test_regenerate import one_turn_conversations

    from models.target import TargetModel
    from train.config import RegenerateConfig
    from train.data.chat import ChatRenderer
    from train.data.regenerate import reply_engine, regenerate_conversations

    target = TargetModel.from_pretrained(str(reference_target_path), "cpu")
    renderer = ChatRenderer(target.tokenizer)
    cfg = RegenerateConfig(enabled=True, max_new_tokens=8, engine="vllm", concurrency=4, vllm_python=VLLM_PYTHON,
                           temperature=1.0, seed=0)
    replies, runs = reply_engine(cfg, target, 1024), []
    try:
        for _ in range(2):
            out, _ = regenerate_conversations(one_turn_conversations(["Tell me a joke"] * 4), replies, renderer, cfg,
                                              max_length=1024, progress=False)
            runs.append([c.messages[1]["content"] for c in out])
    finally:
        replies.close()
    assert len(set(runs[0])) == 4, runs[0]
    assert runs[1] == runs[0]


# vLLM's side of the RoPE check below: each export folder's config through vLLM's own loader, then the rotary
# embedding its Llama / Qwen3 layers build from it (get_rope with the text config's rope_parameters); its cos/sin at the
# reference's positions against the saved Hugging Face tables
_VLLM_ROPE = """
import sys, torch
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.transformers_utils.config import get_config
for folder in sys.argv[1:]:
    text = get_config(folder, trust_remote_code=False).get_text_config()
    with set_current_vllm_config(VllmConfig()):
        rope = get_rope(text.head_dim, max_position=text.max_position_embeddings, is_neox_style=True,
                        rope_parameters=text.rope_parameters, dtype=torch.float32)
    ref = torch.load(folder + "/hf_rope.pt")
    cos, sin = rope.cos_sin_cache[ref["positions"]].chunk(2, dim=-1)
    print("DIFF", folder, max((cos.repeat(1, 2) - ref["cos"]).abs().max().item(), (sin.repeat(1, 2) - ref["sin"]).abs().max().item()))
"""


def test_vllm_reads_a_gpt_oss_drafters_yarn_rope_as_trained(tmp_path: Path) -> None:
    """gpt-oss's RoPE is YaRN with ``truncate: false`` (Hugging Face's default for the architecture; engines' YaRN
    truncates the correction range unless told). The drafters copy the target's ``rope_parameters``; each export's config
    (EAGLE-3 speculators, DFlash z-lab, DFlash speculators) read by vLLM's loader gives vLLM's rotary tables equal to the
    ones the drafter trained with (Hugging Face's, positions up to 128K). The same exports with ``truncate`` flipped give
    tables that differ: the comparison sees the field."""
    from infer_helpers import tiny_gpt_oss
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from models.dflash import make_dflash_config
    from models.eagle3 import make_eagle3_config
    from train.export import dflash_config_json, eagle3_speculators_config_json, speculators_config_json

    target_config = tiny_gpt_oss().config
    assert target_config.rope_parameters["truncate"] is False
    positions = torch.tensor([0, 1, 100, 4095, 5000, 60000, 131071])

    def exports(config, folder: Path) -> list[Path]:
        rope = dict(config.rope_parameters)
        eagle3 = make_eagle3_config(config, num_hidden_layers=1, target_layer_ids=[0, 1, 2], layer_types=["sliding_attention"],
                                    sliding_window=64, draft_vocab_size=64)
        dflash = make_dflash_config(config, num_hidden_layers=1, block_size=4, mask_token_id=3, target_layer_ids=[0, 1, 2],
                                    layer_types=["sliding_attention"], sliding_window=64)
        cos, sin = LlamaRotaryEmbedding(eagle3)(torch.zeros(1), positions[None])  # the tables the drafters train with
        assert dict(dflash.rope_parameters) == rope == dict(eagle3.rope_parameters)
        jsons = {"eagle3_speculators": eagle3_speculators_config_json(eagle3.to_dict(), "tiny-gpt-oss", ["GptOssForCausalLM"], 3),
                 "dflash": dflash_config_json(dflash.to_dict()),
                 "dflash_speculators": speculators_config_json(dflash.to_dict(), config, "tiny-gpt-oss")}
        out = []
        for name, config_json in jsons.items():
            (folder / name).mkdir(parents=True)
            (folder / name / "config.json").write_text(json.dumps(config_json))
            torch.save({"positions": positions, "cos": cos[0], "sin": sin[0]}, folder / name / "hf_rope.pt")
            out.append(folder / name)
        return out

    as_trained = exports(target_config, tmp_path / "as_trained")
    flipped_config = copy.deepcopy(target_config)
    flipped_config.rope_parameters["truncate"] = True
    flipped = exports(flipped_config, tmp_path / "flipped")
    for folder in flipped:  # vLLM reads the flipped config, compared with the tables of the config as trained
        shutil.copy(tmp_path / "as_trained" / folder.name / "hf_rope.pt", folder / "hf_rope.pt")
    run = subprocess.run([VLLM_PYTHON, "-c", _VLLM_ROPE, *map(str, as_trained + flipped)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    diffs = {line.split()[1]: float(line.split()[2]) for line in run.stdout.splitlines() if line.startswith("DIFF ")}
    assert len(diffs) == 6, run.stdout
    for folder in as_trained:
        assert diffs[str(folder)] < 1e-5, (folder.name, diffs)
    for folder in flipped:
        assert diffs[str(folder)] > 1e-2, (folder.name, diffs)
