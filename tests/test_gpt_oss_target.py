"""Targets the captured ``StaticTarget`` does not run decode losslessly on the eager ``CachedTarget``: gpt-oss (sliding
layers alternating with full ones, attention sinks, experts, half-head RoPE tables) and Mistral (one window on every
layer, no ``layer_types``). Before, gpt-oss did not load at all (``attn_implementation="sdpa"``, which it lacks) and a
Mistral window was silently run as full attention.

References, independent of the code under test: a dense attention with sinks computed element by element, Hugging
Face's own forward with no cache, and greedy decoding by full recomputation (no cache of any kind)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from infer_helpers import PartlyScripted, PartlyScriptedEagle3, tiny_gpt_oss
from models.target import CachedTarget, layer_windows, static_unsupported
from swa_kernels.attention import cached_attention

pytestmark = pytest.mark.usefixtures("single_cpu_thread")
ON_DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"))]


# ----------------------------------------------------------------------------- attention with sinks


def dense_sink_attention(q, k, v, window, sinks, scale):
    """Query i (position K - Q + i) over keys j with p - W < j <= p, each head's denominator plus exp(sink): one
    element at a time, in float64."""
    q_len, hq, _ = q.shape
    k_len, hkv, _ = k.shape
    out = torch.zeros(q.shape, dtype=torch.float64)
    for h in range(hq):
        g = h // (hq // hkv)
        for i in range(q_len):
            p = k_len - q_len + i
            keys = [j for j in range(k_len) if j <= p and (window is None or j > p - window)]
            logits = [float(q[i, h].double() @ k[j, g].double()) * scale for j in keys]
            top = max(logits + [float(sinks[h])])
            weights = [math.exp(x - top) for x in logits]
            denominator = sum(weights) + math.exp(float(sinks[h]) - top)
            for w, j in zip(weights, keys):
                out[i, h] += w / denominator * v[j, g].double()
    return out


@pytest.mark.parametrize("q_len,k_len,window", [(1, 9, None), (5, 9, None), (5, 9, 3), (12, 12, 4), (3, 20, 1)])
def test_sinks_match_a_dense_reference(q_len, k_len, window) -> None:
    torch.manual_seed(q_len * 100 + k_len)
    q, k, v = torch.randn(q_len, 4, 8), torch.randn(k_len, 2, 8), torch.randn(k_len, 2, 8)
    sinks = torch.randn(4) * 3
    got = cached_attention(q, k, v, causal=True, window=window, scale=8 ** -0.5, sinks=sinks)
    torch.testing.assert_close(got.double(), dense_sink_attention(q, k, v, window, sinks, 8 ** -0.5), rtol=1e-5, atol=1e-5)
    plain = cached_attention(q, k, v, causal=True, window=window, scale=8 ** -0.5)
    assert not torch.allclose(got, plain, atol=1e-3)  # the sinks did something


def test_sinks_in_query_chunks_equal_one_pass(monkeypatch) -> None:
    """The per-head mask is bounded by chunking the queries (``SINK_MASK_BYTES``): chunks of a few rows give the same
    output as one pass, windows and the causal edge crossing the chunk boundaries."""
    import swa_kernels.attention as attention

    torch.manual_seed(5)
    q, k, v = torch.randn(23, 4, 8), torch.randn(30, 2, 8), torch.randn(30, 2, 8)
    sinks = torch.randn(4) * 3
    whole = cached_attention(q, k, v, causal=True, window=5, scale=0.3, sinks=sinks)
    monkeypatch.setattr(attention, "SINK_MASK_BYTES", 4 * 31 * 4 * 3)  # three query rows a chunk
    torch.testing.assert_close(cached_attention(q, k, v, causal=True, window=5, scale=0.3, sinks=sinks), whole, rtol=1e-6, atol=1e-6)


def test_sinks_are_refused_on_flashinfer() -> None:
    q = torch.randn(1, 4, 8)
    with pytest.raises(ValueError, match="sinks .* 'sdpa' only"):
        cached_attention(q, torch.randn(3, 2, 8), torch.randn(3, 2, 8), causal=True, window=None, scale=1.0, backend="flashinfer",
                         sinks=torch.zeros(4))


# ----------------------------------------------------------------------------- the cached forward against HF's


def windowed_model(which: str):
    """A tiny random model of each architecture the cached forward runs (``models.target.WINDOW_RULE``), windowed where
    the architecture has windows."""
    import transformers as tf

    common = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                  max_position_embeddings=512)
    moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True)
    torch.manual_seed(0)
    build = {
        "gpt-oss": lambda: tiny_gpt_oss(),
        # sliding_window with no layer_types: every layer windowed
        "mistral": lambda: tf.MistralForCausalLM(tf.MistralConfig(num_hidden_layers=3, sliding_window=6, **common)),
        # layer_types in a Mistral config.json: kept by the config, ignored by Mistral's attention (every layer windowed);
        # they were followed before (two full layers: 51 logits off at layer 0)
        "mistral-types": lambda: tf.MistralForCausalLM(tf.MistralConfig(num_hidden_layers=3, sliding_window=6,
                                                                           layer_types=["full_attention"] * 3, **common)),
        "qwen3-sliding": lambda: tf.Qwen3ForCausalLM(tf.Qwen3Config(num_hidden_layers=3, sliding_window=5, use_sliding_window=True,
                                                                    layer_types=["sliding_attention", "full_attention", "sliding_attention"], **common)),
        "llama": lambda: tf.LlamaForCausalLM(tf.LlamaConfig(num_hidden_layers=3, **common)),
        "qwen2": lambda: tf.Qwen2ForCausalLM(tf.Qwen2Config(num_hidden_layers=3, **common)),
        "mixtral": lambda: tf.MixtralForCausalLM(tf.MixtralConfig(num_hidden_layers=3, num_local_experts=4, num_experts_per_tok=2,
                                                                  sliding_window=None, **common)),
        "qwen2-moe": lambda: tf.Qwen2MoeForCausalLM(tf.Qwen2MoeConfig(num_hidden_layers=3, shared_expert_intermediate_size=32, **moe, **common)),
        # dense first and last layers, experts between: the static target was handed it (layer 0 alone was checked) and crashed
        "qwen3-moe-dense-first": lambda: tf.Qwen3MoeForCausalLM(tf.Qwen3MoeConfig(num_hidden_layers=3, mlp_only_layers=[0, 2], **moe, **common)),
    }
    return build[which]().eval()


@pytest.mark.parametrize("which,windows", [("gpt-oss", [8, None, 8, None]), ("mistral", [6, 6, 6]), ("mistral-types", [6, 6, 6]),
                                           ("qwen3-sliding", [5, None, 5]), ("llama", [None] * 3), ("qwen2", [None] * 3),
                                           ("mixtral", [None] * 3), ("qwen2-moe", [None] * 3), ("qwen3-moe-dense-first", [None] * 3)])
def test_chunked_prefill_and_overwritten_drafts_match_hf(which, windows) -> None:
    """Every architecture the cached forward runs, against Hugging Face's forward with no cache: logits and features
    over odd prefill chunks and drafts written over. The static target refuses all but full-attention gated MLPs."""
    model = windowed_model(which)
    assert layer_windows(model.config) == windows
    assert (static_unsupported(model) is None) == (which in ("llama", "qwen2")), static_unsupported(model)
    torch.manual_seed(1)
    ids = torch.randint(0, 96, (60,))  # several windows long
    target = CachedTarget(model, feature_layer_ids=[1, 0])
    target.allocate(80)
    logits = [target.forward(ids[start:min(start + 13, 40)], start)[0] for start in range(0, 40, 13)]  # odd chunk boundaries
    target.forward(torch.randint(0, 96, (6,)), 40)  # rejected drafts at 40..45 ...
    tail, features = target.forward(ids[40:], 40)  # ... overwritten by the real tokens
    logits.append(tail)
    with torch.no_grad():
        ref = model(ids[None], output_hidden_states=True)
    torch.testing.assert_close(torch.cat(logits), ref.logits[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(features, torch.cat([ref.hidden_states[2][0, 40:], ref.hidden_states[1][0, 40:]], -1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("model_type,extra", [("glm", dict(partial_rotary_factor=0.5)), ("stablelm", dict(partial_rotary_factor=0.5)),
                                              ("gemma", {}), ("gemma3_text", dict(sliding_window=4)), ("cohere2", dict(sliding_window=4)),
                                              ("granite", dict(embedding_multiplier=2.0)), ("olmo2", {}), ("smollm3", {})])
def test_architectures_the_loop_would_run_wrong_are_refused_in_one_line(model_type, extra) -> None:
    """Found by review (2026-12-06's third session): with the full-attention gate gone, these passed the check; GLM and
    StableLM (RoPE on half of each head, paired differently from gpt-oss's half tables) then decoded another model's
    tokens, Gemma 3, Cohere 2, Exaone 4 and OLMo 3 crashed mid-forward; Gemma's scaled embeddings, Granite's multipliers,
    OLMo 2's post-norms and SmolLM3's layers without RoPE would be run as Llama's. Refused by name now, through the
    loop's loading too."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from infer.loading import decoding_target
    from models.static_target import StaticTarget

    config = AutoConfig.for_model(model_type, vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, pad_token_id=0, **extra)
    model = AutoModelForCausalLM.from_config(config).eval()
    want = rf"^target '{model_type}': the inference loop runs gpt_oss, llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe targets"
    for build in (lambda: CachedTarget(model, [0]), lambda: StaticTarget(model, [0]), lambda: decoding_target(model, [0])):
        with pytest.raises(ValueError, match=want) as e:
            build()
        assert "\n" not in str(e.value)


def test_tree_nodes_see_the_window_by_position_not_slot() -> None:
    """A tree verify on a windowed target: node i sits in cache slot start + i at RoPE position start + depth(i); its
    sliding layers see the last W positions of its own path. Nine siblings push the last ones' slots past the window of
    keys they must still see, so a window counted by slot fails here."""
    model = tiny_gpt_oss()
    torch.manual_seed(2)
    prefix = torch.randint(0, 96, (30,))
    parents = [-1] + [0] * 9 + [9]  # a root, nine children, one grandchild under the last child
    nodes = torch.randint(0, 96, (len(parents),))
    depth, mask = [], torch.zeros(len(parents), len(parents), dtype=torch.bool)
    for i, p in enumerate(parents):
        depth.append(0 if p < 0 else depth[p] + 1)
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    target = CachedTarget(model, feature_layer_ids=[])
    target.allocate(64)
    target.forward(prefix, 0)
    got, _ = target.forward(nodes, 30, positions=30 + torch.tensor(depth), mask=mask)
    for i in range(len(parents)):
        path = [j for j in range(i + 1) if mask[i, j]]
        with torch.no_grad():
            want = model(torch.cat([prefix, nodes[path]])[None]).logits[0, -1]
        torch.testing.assert_close(got[i], want, rtol=1e-4, atol=1e-4, msg=f"node {i}")


def test_the_static_target_refuses_and_decoding_target_falls_back(capsys) -> None:
    from infer.loading import decoding_target
    from models.static_target import StaticTarget

    model = tiny_gpt_oss()
    assert static_unsupported(model) == ("target 'gpt_oss': sliding-window layers, attention sinks, a GptOssMLP MLP (not "
                                         "gate/up/down)")
    with pytest.raises(ValueError, match="the static target runs Llama/Qwen-style full-attention layers"):
        StaticTarget(model, [])
    assert isinstance(decoding_target(model, [1]), CachedTarget)
    assert "decoding on the eager cached target" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the loop, lossless


def recomputed_greedy(model, prompt: list[int], n: int) -> list[int]:
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq], device=model.device)).logits[0, -1].argmax()))
    return seq[len(prompt):]


@pytest.mark.parametrize("device", ON_DEVICES)
def test_every_drafter_kind_reproduces_greedy_decoding(device) -> None:
    """gpt-oss on the eager target, prompts longer than its window: the target alone, prompt lookup, a DFlash block and
    EAGLE-3 chains and trees (drafters that propose the right token 70% of the time, so steps accept 0 to all drafts)
    give the tokens of greedy decoding by full recomputation (fp32 on the GPU too: bf16 breaks near-ties differently
    in a verify pass and a one-token step, here and in Hugging Face's own loop)."""
    from collections import Counter

    from infer.generate import generate
    from infer.prompt_lookup import PromptLookupDrafter
    from models.dflash import DFlashDraftModel, DFlashDrafter, make_dflash_config
    from models.eagle3 import Eagle3DraftModel, make_eagle3_config

    model = tiny_gpt_oss().to(device)
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    dflash = DFlashDraftModel(make_dflash_config(model.config, num_hidden_layers=2, block_size=4, mask_token_id=5, target_layer_ids=[0, 1, 2],
                                                 layer_types=["sliding_attention", "full_attention"], sliding_window=6)).eval().to(device)
    eagle3 = Eagle3DraftModel(make_eagle3_config(model.config, num_hidden_layers=1, target_layer_ids=[0, 1, 2], layer_types=["sliding_attention"],
                                                 sliding_window=6, draft_vocab_size=96, ttt_length=3)).eval().to(device)
    target = CachedTarget(model, [0, 1, 2])
    histogram = Counter()
    for i in range(3):
        torch.manual_seed(10 + i)
        prompt = torch.randint(2, 96, (20 + 7 * i,)).tolist()
        want = recomputed_greedy(model, prompt, 24)
        assert generate(target, None, prompt, 24).tokens == want, f"alone, prompt {i}"
        drafters = {
            "prompt lookup": PromptLookupDrafter(num_draft_tokens=5, vocab_size=96),
            "dflash": PartlyScripted(DFlashDrafter(dflash, embed, head), want, len(prompt), p_script=0.7, seed=i),
            "eagle3 chain": PartlyScriptedEagle3(eagle3, want, len(prompt), p_script=0.7, seed=i),
            "eagle3 tree": PartlyScriptedEagle3(eagle3, want, len(prompt), p_script=0.7, seed=i, tree_topk=2, tree_tokens=8),
        }
        for name, drafter in drafters.items():
            got = generate(target, drafter, prompt, 24, prefill_chunk=16)
            assert got.tokens == want, f"{name}, prompt {i}"
            if name != "prompt lookup":
                histogram.update(got.stats.accepted_per_step)
    assert histogram[0] > 0 and histogram[3] > 0, histogram  # rejections and whole blocks/chains both happened


# ----------------------------------------------------------------------------- loading, training's capture, the CLIs


def test_gpt_oss_loads_and_its_capture_matches_hf(tiny_gpt_oss_path) -> None:
    """``attn_implementation`` auto: Hugging Face's choice, eager for gpt-oss (it has no SDPA path; "sdpa" refused it
    before); the features training reads equal HF's hidden states."""
    from models.target import TargetModel

    target = TargetModel.from_pretrained(tiny_gpt_oss_path)
    assert target.config._attn_implementation == "eager"
    torch.manual_seed(3)
    ids = torch.randint(0, target.vocab_size, (2, 40))
    got = target.capture(ids, [1, 2])
    with torch.no_grad():
        ref = target.model(ids, output_hidden_states=True)
    torch.testing.assert_close(got.features, torch.cat([ref.hidden_states[2], ref.hidden_states[3]], -1), rtol=1e-5, atol=1e-5)


def fp4_e2m1(code: torch.Tensor) -> torch.Tensor:
    """OCP MX's FP4 (E2M1) by its bit fields: sign bit 3, exponent bits 1-2 (bias 1; 0 = subnormal), mantissa bit 0."""
    sign = torch.where(code & 8 > 0, -1.0, 1.0)
    exponent, mantissa = (code >> 1) & 3, (code & 1).float()
    return sign * torch.where(exponent == 0, 0.5 * mantissa, 2.0 ** (exponent.float() - 1) * (1 + 0.5 * mantissa))


def test_an_mxfp4_checkpoint_loads_dequantized_without_the_hub(tmp_path, monkeypatch) -> None:
    """gpt-oss is published with its experts in MXFP4 (``*_blocks``: two FP4 values a byte, low nibble first, 32 inputs
    a block; ``*_scales``: one power-of-two exponent a block, bias 127). Where the ``kernels`` package is installed (a
    dependency of transformers 5.25) transformers ran such experts on Triton kernels fetched from the hub: offline, the
    load failed. ``TargetModel.from_pretrained`` dequantizes them at load, with the hub unreachable; every expert weight
    equals an independent decoding of the stored bytes, and the loaded model decodes greedily through our loop."""
    from safetensors.torch import load_file, save_file

    from infer.generate import generate
    from models.builtin_targets import build_tokenizer
    from models.target import TargetModel

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tokenizer = build_tokenizer("chatml")
    model = tiny_gpt_oss(vocab_size=len(tokenizer), intermediate_size=64)  # MXFP4 blocks: inputs in 32s
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    weights, want = load_file(tmp_path / "model.safetensors"), {}
    generator = torch.Generator().manual_seed(0)
    for name in [n for n in weights if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        experts, inputs, outputs = weights.pop(name).shape  # stored [experts, outputs, inputs / 32, 16] bytes
        blocks = torch.randint(0, 256, (experts, outputs, inputs // 32, 16), dtype=torch.uint8, generator=generator)
        scales = torch.randint(122, 131, (experts, outputs, inputs // 32), dtype=torch.uint8, generator=generator)
        values = torch.stack([fp4_e2m1(blocks & 15), fp4_e2m1(blocks >> 4)], -1).reshape(experts, outputs, inputs // 32, 32)
        want[name] = (values * 2.0 ** (scales.float() - 127)[..., None]).reshape(experts, outputs, inputs).transpose(1, 2)
        weights[name + "_blocks"], weights[name + "_scales"] = blocks, scales
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4",  # as gpt-oss-20b's config.json has it
                                     "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                                "model.embed_tokens", "lm_head"]}
    (tmp_path / "config.json").write_text(json.dumps(config))

    target = TargetModel.from_pretrained(str(tmp_path))
    assert len(want) == 2 * target.num_layers
    for name, value in want.items():
        assert torch.equal(target.model.get_parameter(name), value), name  # FP4 times powers of two: exact in fp32
    prompt = torch.randint(2, target.vocab_size, (20,), generator=generator).tolist()
    assert generate(CachedTarget(target.model, [0, 1, 2]), None, prompt, 12).tokens == recomputed_greedy(target.model, prompt, 12)


def test_infer_cli_on_gpt_oss_decodes_at_batch_1_and_refuses_batches_in_one_line(tiny_gpt_oss_path, tmp_path, capsys) -> None:
    from infer.__main__ import main

    assert main(["--target", tiny_gpt_oss_path, "--drafter", "pld", "--prompt", "hi", "--max-new-tokens", "8"]) == 0
    assert "decoding on the eager cached target" in capsys.readouterr().err
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"turns": ["hi"]}\n{"turns": ["hello"]}\n')
    assert main(["--target", tiny_gpt_oss_path, "--drafter", "pld", "--prompts", str(prompts), "--batch-size", "2",
                 "--max-new-tokens", "4"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: --batch-size 2: batched decoding runs on the static target; target 'gpt_oss': sliding-window layers, attention "
        "sinks, a GptOssMLP MLP (not gate/up/down): decodes on the eager cached target, at --batch-size 1")


@pytest.mark.slow
@pytest.mark.parametrize("device", ON_DEVICES)
@pytest.mark.parametrize("experiment", ["dflash_swa_tiny", "eagle3_swa_tiny"])
def test_train_then_eval_on_gpt_oss(experiment, device, tiny_gpt_oss_path, tmp_path, capsys) -> None:
    """The whole path a gpt-oss-20b user takes, at a CPU test's size: train (the loop's own eval on the eager target
    reproducing greedy decoding; on a GPU in bf16 with the target's layers compiled, the defaults there), then
    ``python -m eval`` on the run at batch 1; batch 2 refused in one line."""
    from compose import compose_train

    from eval.__main__ import main as eval_main
    from train.trainer import train

    run = tmp_path / "run"
    metrics = train(compose_train([f"experiment={experiment}", "trainer.max_steps=2", "trainer.progress=false", f"output_dir={run}",
                                   f"target.path={tiny_gpt_oss_path}", "drafter.target_layer_ids=[0,1,2]", "trainer.loop_eval_prompts=1",
                                   f"trainer.device={device}"]))
    assert metrics["steps"] == 2 and metrics["eval/loop_steps"] > 0 and metrics["eval/loop_pld_steps"] > 0
    if device == "cpu":  # fp32: the loop's tokens are greedy decoding's (bf16 may break a near-tie differently)
        assert metrics["eval/loop_same_as_greedy"] == 1.0 and metrics["eval/loop_pld_same_as_greedy"] == 1.0
    out = tmp_path / "eval"
    assert eval_main(["mtbench", "--drafter", str(run), "--num-questions", "1", "--max-new-tokens", "8", "--out", str(out),
                      "--device", device]) == 0
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert summary["turns"] == 2 and summary["prompt_lookup"]["steps"] > 0 and (device != "cpu" or summary["same_as_baseline"] == 1.0)
    assert eval_main(["mtbench", "--drafter", str(run), "--num-questions", "1", "--batch-size", "2", "--out", str(tmp_path / "b2"),
                      "--device", device]) == 2
    assert "decodes on the eager cached target, at --batch-size 1" in capsys.readouterr().err.strip().splitlines()[-1]
    assert not (tmp_path / "b2").exists()


def test_our_regeneration_engine_decodes_gpt_oss_one_prompt_at_a_time(tiny_gpt_oss_path) -> None:
    """``data.regenerate.engine=ours`` on a target only the eager loop runs: each reply greedy decoding's, to its own
    budget (it went to the batched static loop and failed there)."""
    from models.target import TargetModel
    from train.config import RegenerateConfig
    from train.data.regenerate import OurReplies

    target = TargetModel.from_pretrained(tiny_gpt_oss_path)
    engine = OurReplies(target.model, target.tokenizer, RegenerateConfig(enabled=True, max_new_tokens=12, batch_size=2, engine="ours"))
    prompts, budgets = [[200 + i for i in range(8)], [300 + i for i in range(20)]], [12, 3]
    got = {i: tokens for i, tokens, _, _ in engine.replies(prompts, budgets)}
    eos = target.tokenizer.eos_token_id
    for i, prompt in enumerate(prompts):
        want = recomputed_greedy(target.model, prompt, budgets[i])
        assert got[i] == (want[:want.index(eos)] if eos in want else want), i
    assert len(got[0]) == 12 and len(got[1]) == 3
