"""EAGLE-3 export: round trips (SGLang and speculators layouts), engine layer ids, windows, speculators'
own config and model classes, the gate, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig

from train import engines
from train.export import ExportError, eagle3_logits, export, from_sglang_name, sglang_eagle3_names, to_sglang_name
from models.eagle3 import Eagle3DraftModel, build_draft_vocab, make_eagle3_config

LAYER_IDS = [1, 3, 5]
DRAFT_VOCAB = 1000


@pytest.fixture(scope="module")
def target_config(reference_target_path):
    return AutoConfig.from_pretrained(reference_target_path)


def make_source(tmp_path: Path, target_config, num_layers: int = 1, window: int | None = 16, name: str = "src", **flags) -> Path:
    torch.manual_seed(0)
    layer_types = (["sliding_attention"] + ["full_attention"] * (num_layers - 1)) if window else ["full_attention"] * num_layers
    config = make_eagle3_config(target_config, num_hidden_layers=num_layers, target_layer_ids=LAYER_IDS, layer_types=layer_types,
                                sliding_window=window, draft_vocab_size=DRAFT_VOCAB, ttt_length=3, **flags)
    model = Eagle3DraftModel(config)
    with torch.no_grad():  # RMSNorm weights start at 1: perturb them so a mix-up would show
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.add_(0.1 * torch.randn_like(p))
    g = torch.Generator().manual_seed(0)
    ids, counts = torch.randint(0, config.vocab_size, (4000,), generator=g), torch.randint(1, 100, (4000,), generator=g)
    model.set_draft_vocab(*build_draft_vocab(Counter(dict(zip(ids.tolist(), counts.tolist()))), config.vocab_size, DRAFT_VOCAB))
    src = tmp_path / name
    model.save_pretrained(src)
    return src


def features_and_ids(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return torch.randn(1, 24, 3 * 512, generator=g), torch.randint(0, vocab, (1, 24), generator=g)


def test_engine_layer_ids_and_sglang_names() -> None:
    # SGLang: set_eagle3_layers_to_capture adds 1 and captures a layer's input -> our ids unchanged.
    assert engines.engine_layer_ids([1, 15, 28], "eagle3_sglang") == [1, 15, 28]
    # vLLM / speculators: ids are the layer whose input is captured -> ours + 1 (defaults 2, n//2, n-3).
    assert engines.engine_layer_ids([1, 15, 28], "eagle3_vllm") == [2, 16, 29]
    assert to_sglang_name("layers.0.hidden_norm.weight") == "midlayer.hidden_norm.weight"
    assert to_sglang_name("layers.1.input_layernorm.weight") == "additional_layers.0.hidden_norm.weight"
    assert to_sglang_name("layers.2.self_attn.q_proj.weight") == "additional_layers.1.self_attn.q_proj.weight"
    for name in ("layers.0.input_layernorm.weight", "layers.2.input_layernorm.weight", "layers.1.mlp.up_proj.weight", "fc.weight", "d2t"):
        assert from_sglang_name(to_sglang_name(name)) == name
    command = engines.sglang_eagle3_command("T", "D", 4, 2048)
    assert "--speculative-num-steps 4" in command and "--speculative-num-draft-tokens 5" in command
    assert command.endswith("--speculative-draft-window-size 2047") and "window" not in engines.sglang_eagle3_command("T", "D", 4)


@pytest.mark.parametrize("num_layers", [1, 2])
def test_sglang_round_trip(tmp_path: Path, target_config, reference_target_path, num_layers: int) -> None:
    src = make_source(tmp_path, target_config, num_layers)
    report = export(src, tmp_path / "sg32", fmt="sglang", target=str(reference_target_path), dtype="float32")
    assert report["max_abs_logit_diff"] == 0.0
    assert report["target_layer_ids"] == LAYER_IDS
    config = json.loads((tmp_path / "sg32" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["model_type"] == "llama"
    assert config["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": LAYER_IDS, "use_aux_hidden_state": True}
    assert config["draft_vocab_size"] == DRAFT_VOCAB and config["target_hidden_size"] == 512 and config["vocab_size"] == 8192
    assert config["layer_types"][0] == "sliding_attention" and config["sliding_window"] == 16
    assert config["rope_theta"] == 1e6 and config["tie_word_embeddings"] is False and "target_layer_ids" not in config
    weights = load_file(tmp_path / "sg32" / "model.safetensors")
    assert set(weights) == sglang_eagle3_names(num_layers)
    assert weights["d2t"].dtype == torch.int64 and weights["t2d"].dtype == torch.bool
    ours = Eagle3DraftModel.from_pretrained(src).eval()
    assert torch.equal(weights["midlayer.hidden_norm.weight"], ours.layers[0].hidden_norm.weight)
    if num_layers == 2:
        assert torch.equal(weights["additional_layers.0.hidden_norm.weight"], ours.layers[1].input_layernorm.weight)
        assert "--speculative-draft-window-size 15" in report["commands"]["sglang"] and report["notes"]
        # Our loader, SGLang names mapped back: the same logits as the source drafter (2 TTT steps).
        again = Eagle3DraftModel.from_pretrained(src).eval()
        again.load_state_dict({from_sglang_name(k): v for k, v in weights.items()})
        features, ids = features_and_ids(8192)
        assert torch.equal(eagle3_logits(ours, features, ids, 2), eagle3_logits(again, features, ids, 2))
    assert "--speculative-algorithm EAGLE3" in report["commands"]["sglang"] and "--speculative-num-steps 3" in report["commands"]["sglang"]

    report16 = export(src, tmp_path / "sg16", fmt="sglang", target=str(reference_target_path))
    assert report16["max_abs_logit_diff"] <= 1e-2 and 0 < report16["max_abs_logit_diff_vs_fp32"] < 0.5 and report16["dtype"] == "bfloat16"
    assert load_file(tmp_path / "sg16" / "model.safetensors")["fc.weight"].dtype == torch.bfloat16


def test_no_window_and_sglang_refusals(tmp_path: Path, target_config, reference_target_path) -> None:
    src = make_source(tmp_path, target_config, 1, window=None)
    report = export(src, tmp_path / "full", fmt="sglang", dtype="float32")
    assert report["sliding_window"] is None and "--speculative-draft-window-size" not in report["commands"]["sglang"]
    assert json.loads((tmp_path / "full" / "config.json").read_text())["sliding_window"] is None
    src31 = make_source(tmp_path, target_config, 1, name="src31", fc_norm=True, norm_output=True)
    with pytest.raises(ExportError, match="fc_norm=true .* SGLang"):
        export(src31, tmp_path / "sg31", fmt="sglang", dtype="float32")
    assert not (tmp_path / "sg31").exists()
    src_nbf = make_source(tmp_path, target_config, 1, name="src_nbf", norm_before_fc=True)
    with pytest.raises(ExportError, match="norm_before_fc=true .* SGLang"):
        export(src_nbf, tmp_path / "sg_nbf", fmt="sglang", dtype="float32")
    with pytest.raises(ValueError, match="fc_norm .* norm_before_fc .* set one"):
        make_source(tmp_path, target_config, 1, name="both", fc_norm=True, norm_before_fc=True)
    with pytest.raises(ExportError, match="EAGLE-3 drafter; its formats are sglang and speculators"):
        export(src, tmp_path / "df", fmt="dflash", dtype="float32")


@pytest.mark.parametrize("fc_norm", [True, False], ids=["fc_norm", "norm_before_fc"])
def test_speculators_format_with_speculators_classes(tmp_path: Path, target_config, reference_target_path, fc_norm: bool) -> None:
    from speculators import SpeculatorModelConfig  # installed --no-deps by the test command
    from speculators.models.eagle3 import Eagle3DraftModel as SpecEagle3
    from speculators.models.eagle3 import Eagle3SpeculatorConfig

    src = make_source(tmp_path, target_config, 2, fc_norm=fc_norm, norm_before_fc=not fc_norm, norm_output=True)
    report = export(src, tmp_path / "spec", fmt="speculators", target=str(reference_target_path), dtype="float32")
    assert report["max_abs_logit_diff"] == 0.0 and report["target_layer_ids"] == [i + 1 for i in LAYER_IDS]
    assert '"method": "eagle3"' in report["commands"]["vllm"] and '"num_speculative_tokens": 3' in report["commands"]["vllm"]

    loaded = SpeculatorModelConfig.from_pretrained(str(tmp_path / "spec"))
    assert isinstance(loaded, Eagle3SpeculatorConfig)
    assert loaded.eagle_aux_hidden_state_layer_ids == [2, 4, 6]
    assert loaded.draft_vocab_size == DRAFT_VOCAB and loaded.target_hidden_size == 512
    assert loaded.fc_norm is fc_norm and loaded.norm_before_fc is not fc_norm and loaded.norm_output is True and loaded.norm_before_residual is False
    layer = loaded.transformer_layer_config
    assert layer.model_type == "llama" and layer.layer_types == ["sliding_attention", "full_attention"] and layer.sliding_window == 16
    assert layer.vocab_size == 8192 and layer.num_hidden_layers == 2
    assert loaded.speculators_config.algorithm == "eagle3"
    assert loaded.speculators_config.proposal_methods[0].speculative_tokens == 3
    assert loaded.speculators_config.verifier.architectures == ["Qwen3ForCausalLM"]

    # speculators' own model class: every tensor of ours is one of its parameters/buffers with its
    # shape and nothing of its own is missing but the verifier-owned ones it fills from the target.
    weights = load_file(tmp_path / "spec" / "model.safetensors")
    theirs = SpecEagle3(loaded)
    result = theirs.load_state_dict(weights, strict=False)
    assert result.unexpected_keys == []
    assert sorted(result.missing_keys) == ["verifier_lm_head.weight", "verifier_norm.weight"]
    # from_pretrained with the verifier (the local reference target) attached: our values survive.
    model = SpecEagle3.from_pretrained(str(tmp_path / "spec"))
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in weights.items())
    assert model.target_layer_ids == [2, 4, 6] and model.sliding_window == 16 and model.sliding_window_indices == [0]

    with pytest.raises(ExportError, match="--format speculators needs the target"):
        export(src, tmp_path / "spec2", fmt="speculators", dtype="float32")


def test_a_full_vocabulary_exports_without_a_draft_vocabulary_for_speculators(tmp_path: Path, target_config, reference_target_path) -> None:
    """A drafter whose draft vocabulary is the target's whole one (the default 32,000 capped at a smaller vocabulary:
    the reference target's 8,192): speculators' class registers no d2t / t2d then, and vLLM 0.32 refused the two
    tensors ("no module or parameter named 'draft_id_to_target_id'"). The export leaves them out; speculators' class
    takes every tensor; our reader puts the identity back and the logits are the source's."""
    from speculators import SpeculatorModelConfig
    from speculators.models.eagle3 import Eagle3DraftModel as SpecEagle3

    from infer.speculators_checkpoint import load_model, read_config

    torch.manual_seed(0)
    config = make_eagle3_config(target_config, num_hidden_layers=1, target_layer_ids=LAYER_IDS, layer_types=["sliding_attention"],
                                sliding_window=16, draft_vocab_size=32000, ttt_length=3, norm_before_fc=True)
    assert config.draft_vocab_size == config.vocab_size == 8192
    model = Eagle3DraftModel(config)
    src = tmp_path / "full"
    model.save_pretrained(src)
    report = export(src, tmp_path / "spec", fmt="speculators", target=str(reference_target_path), dtype="float32")
    assert report["max_abs_logit_diff"] == 0.0
    weights = load_file(tmp_path / "spec" / "model.safetensors")
    assert "d2t" not in weights and "t2d" not in weights
    theirs = SpecEagle3(SpeculatorModelConfig.from_pretrained(str(tmp_path / "spec")))
    result = theirs.load_state_dict(weights, strict=False)
    assert result.unexpected_keys == [] and sorted(result.missing_keys) == ["verifier_lm_head.weight", "verifier_norm.weight"]
    ours = load_model(tmp_path / "spec", read_config(tmp_path / "spec"), torch.float32).eval()
    features, ids = features_and_ids(config.vocab_size)
    torch.testing.assert_close(eagle3_logits(ours, features, ids), eagle3_logits(model.eval(), features, ids), rtol=0, atol=0)


def test_refuses_a_deleted_tensor_and_writes_nothing(tmp_path: Path, target_config) -> None:
    src = make_source(tmp_path, target_config, 2)
    weights = load_file(src / "model.safetensors")
    del weights["layers.1.input_layernorm.weight"]
    save_file(weights, str(src / "model.safetensors"))
    with pytest.raises(ExportError, match=r"missing tensor 'layers\.1\.input_layernorm\.weight'"):
        export(src, tmp_path / "out", fmt="sglang", dtype="float32")
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_refuses_an_unbuilt_draft_vocabulary(tmp_path: Path, target_config) -> None:
    src = make_source(tmp_path, target_config, 1)
    weights = load_file(src / "model.safetensors")
    weights["t2d"] = torch.zeros_like(weights["t2d"])
    save_file(weights, str(src / "model.safetensors"))
    with pytest.raises(ExportError, match="t2d marks 0 target ids, expected draft_vocab_size=1000"):
        export(src, tmp_path / "out", fmt="sglang", dtype="float32")


@pytest.mark.slow  # the quick tier stays under 3 minutes (README); the full suite runs it
def test_cli(tmp_path: Path, target_config, reference_target_path, capsys) -> None:
    from train.export import main

    src = make_source(tmp_path, target_config, 1)
    assert main([str(src), str(tmp_path / "out"), "--target", str(reference_target_path)]) == 0  # in-process: one start-up saved
    out = capsys.readouterr().out
    assert "reload max |Δ logits|" in out and "--speculative-algorithm EAGLE3" in out  # default for EAGLE-3: sglang
    assert "--speculative-draft-window-size 15" in out
    bad = subprocess.run([sys.executable, "-m", "train.export", str(src), str(tmp_path / "out2"), "--format", "dflash"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0
    assert "EAGLE-3 drafter" in bad.stderr and not (tmp_path / "out2").exists()
    # the SGLang export handed to our loop (a new user's first try, found by a README walkthrough): one line pointing at
    # the exports the loop reads, where it named the architecture alone
    from infer.loading import read_drafter_config

    with pytest.raises(ValueError, match=r"an EAGLE-3 export in SGLang's layout \(--format sglang\), which SGLang serves; this "
                                         r"loop reads the run's own export \(RUN/export\) or its speculators export"):
        read_drafter_config(tmp_path / "out")


def test_config_export_formats_per_drafter_kind() -> None:
    from compose import compose_train

    from train.trainer import to_train_config

    eagle = to_train_config(compose_train(["experiment=eagle3_swa_tiny", "output_dir=/tmp/x"]))
    assert eagle.trainer.export_formats == ["sglang", "speculators"]
    assert to_train_config(compose_train(["drafter=eagle3", "output_dir=/tmp/x"])).trainer.export_formats == ["sglang", "speculators"]
    assert to_train_config(compose_train(["experiment=dflash_swa_tiny", "output_dir=/tmp/x"])).trainer.export_formats == ["dflash"]
    with pytest.raises(ValueError, match=r"trainer.export_formats: 'dflash' is a DFlash layout; drafter.kind=eagle3") as err:
        to_train_config(compose_train(["experiment=eagle3_swa_tiny", "trainer.export_formats=[sglang,dflash]", "output_dir=/tmp/x"]))
    assert "\n" not in str(err.value)


def test_config_refuses_a_window_sglang_cannot_serve_at_start_up() -> None:
    """SGLang's --speculative-draft-window-size is W - 1 (``engines.sglang_draft_window_size``), so a window of 1 has no
    SGLang flag: refused when the config is read, not by the sglang export after the whole training (which ended the run
    with a ValueError before run.json and the speculators export were written)."""
    from compose import compose_train

    from train.trainer import to_train_config

    with pytest.raises(ValueError, match=r"drafter.sliding_window=1 with trainer.export_formats=\['sglang', 'speculators'\]") as err:
        to_train_config(compose_train(["experiment=eagle3_swa_tiny", "drafter.sliding_window=1", "output_dir=/tmp/x"]))
    assert "\n" not in str(err.value)
    # served by vLLM alone, or a window SGLang can express: accepted
    to_train_config(compose_train(["experiment=eagle3_swa_tiny", "drafter.sliding_window=1", "trainer.export_formats=[speculators]",
                                   "output_dir=/tmp/x"]))
    to_train_config(compose_train(["experiment=eagle3_swa_tiny", "drafter.sliding_window=2", "output_dir=/tmp/x"]))
