"""Export: round trip on the reference target, z-lab's own loader, the validation gate, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from train import engines
from train.export import ExportError, draft_logits, export
from models.dflash import DFlashDraftModel, make_dflash_config
from models.target import TargetModel

LAYER_IDS = [1, 3, 5]


@pytest.fixture(scope="module")
def target(reference_target_path) -> TargetModel:
    return TargetModel.from_pretrained(str(reference_target_path), "cpu")


def make_source(tmp_path: Path, target: TargetModel, block_causal: bool = True, window: int = 16) -> Path:
    torch.manual_seed(0)
    config = make_dflash_config(target.config, num_hidden_layers=3, block_size=8, mask_token_id=3, target_layer_ids=LAYER_IDS,
                                layer_types=["sliding_attention", "sliding_attention", "full_attention"], sliding_window=window,
                                sliding_block_causal=block_causal)
    model = DFlashDraftModel(config)
    with torch.no_grad():  # RMSNorm weights start at 1: perturb them so a mix-up would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    src = tmp_path / "src"
    model.save_pretrained(src)
    return src


def test_round_trip_same_logits(tmp_path: Path, target: TargetModel, reference_target_path) -> None:
    src = make_source(tmp_path, target)
    report = export(src, tmp_path / "out32", target=str(reference_target_path), dtype="float32")
    assert report["max_abs_logit_diff"] == 0.0
    sglang = export(src, tmp_path / "sglang", fmt="sglang", target=str(reference_target_path), dtype="float32")
    assert sglang["max_abs_logit_diff"] == 0.0  # SGLang's DFLASH reads the z-lab layout: same files
    assert (tmp_path / "sglang" / "config.json").read_text() == (tmp_path / "out32" / "config.json").read_text()
    report16 = export(src, tmp_path / "out16", target=str(reference_target_path), dtype="bfloat16")
    assert report16["max_abs_logit_diff"] <= 1e-2 and 0 < report16["max_abs_logit_diff_vs_fp32"] < 0.5
    ours = DFlashDraftModel.from_pretrained(src).eval()
    reloaded = DFlashDraftModel.from_pretrained(tmp_path / "out32").eval()
    features = torch.randn(1, 40, 3 * 512)
    block = torch.tensor([[11] + [3] * 7])
    assert torch.equal(draft_logits(ours, features, block, target.embed_tokens, target.lm_head),
                       draft_logits(reloaded, features, block, target.embed_tokens, target.lm_head))
    config = json.loads((tmp_path / "out32" / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert config["dflash_config"] == {"target_layer_ids": LAYER_IDS, "block_size": 8, "mask_token_id": 3}
    assert config["block_size"] == 8 and config["num_target_layers"] == 8
    assert config["layer_types"] == ["sliding_attention", "sliding_attention", "full_attention"]
    assert config["sliding_window"] == 16 and config["use_sliding_window"] is True
    assert config["rope_theta"] == 1e6 and config["rope_parameters"]["rope_theta"] == 1e6 and config["rope_scaling"] is None
    assert "sliding_block_causal" not in config and "is_causal" not in config
    assert "sglang.launch_server" in report["commands"]["sglang"] and '"num_speculative_tokens": 7' in report["commands"]["vllm"]


@pytest.mark.parametrize("block_causal,window", [(True, 16), (False, 16), (False, 5), (True, 5)])
def test_zlab_dflash_loader_gives_the_same_draft_logits(tmp_path: Path, target: TargetModel, reference_target_path, block_causal: bool, window: int) -> None:
    """z-lab's reference implementation (PyPI ``dflash``) loads our export; same logits on the
    same inputs, with context features taken its way (hidden_states[id + 1]) from the real target."""
    import dflash.model as zlab  # a dev dependency: a missing package fails, it does not skip

    src = make_source(tmp_path, target, block_causal, window)
    export(src, tmp_path / "out", target=str(reference_target_path), dtype="float32")
    theirs = zlab.DFlashDraftModel.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    ours = DFlashDraftModel.from_pretrained(tmp_path / "out").eval()
    assert theirs.target_layer_ids == LAYER_IDS and theirs.block_size == 8 and theirs.mask_token_id == 3

    ids = torch.randint(16, 8192, (1, 41))
    ctx_len = 40  # block anchored at position 40: context 0..39 (W=16 cuts it in sliding layers)
    with torch.no_grad():
        out = target.model(ids, output_hidden_states=True)
    their_features = zlab.extract_context_feature(out.hidden_states, theirs.target_layer_ids)[:, :ctx_len]
    our_features = target.capture(ids, LAYER_IDS).features[:, :ctx_len]
    assert torch.equal(their_features, our_features)  # the layer-id rule, stated by z-lab's own code

    block = torch.tensor([[int(ids[0, ctx_len])] + [3] * 7])
    with torch.no_grad():
        hidden = theirs(position_ids=torch.arange(ctx_len + 8)[None], noise_embedding=target.embed_tokens(block),
                        target_hidden=their_features)
        their_logits = theirs.compute_logits(hidden, target.lm_head)
    our_logits = draft_logits(ours, our_features, block, target.embed_tokens, target.lm_head)
    torch.testing.assert_close(our_logits, their_logits.float(), atol=2e-4, rtol=1e-4)


def test_window_rule_matches_zlab() -> None:
    """W keys visible including the query itself, in z-lab's mask as in ours; FlashInfer gets W - 1."""
    import dflash.model as zlab

    q = torch.zeros(1, 1, 4, 8)
    k = torch.zeros(1, 1, 30, 8)
    mask = zlab._attention_mask(q, k, is_causal=True, sliding_window=5)[0, 0]
    assert mask.sum(-1).tolist() == [5, 5, 5, 5]
    assert mask[-1].nonzero().flatten().tolist() == [25, 26, 27, 28, 29]
    assert engines.flashinfer_window_left(5) == 4 and engines.flashinfer_window_left(None) == -1
    assert engines.engine_layer_ids([1, 9, 17], "dflash") == [1, 9, 17]
    assert engines.engine_layer_ids([1, 9, 17], "speculators") == [2, 10, 18]  # speculators' converter: z-lab id + 1


def test_sglang_draft_window_size_shows_the_drafter_its_w_keys() -> None:
    """SGLang's ``--speculative-draft-window-size N`` is read as a window_left (sglang 0.5.23: llama_eagle3.py sets
    RadixAttention.sliding_window_size = N; FA3 runs window_size=(N, 0), FlashInfer window_left=N: keys p-N .. p). Our W
    (keys p-W+1 .. p, the query included) must come out as the same mask, element by element."""
    for w in (2, 5, 16, 2048):
        n = engines.sglang_draft_window_size(w)
        size = w + 40
        reference = [[p - w + 1 <= k <= p for k in range(size)] for p in range(size)]  # Hugging Face's sliding_window
        sglang = [[p - n <= k <= p for k in range(size)] for p in range(size)]  # window_left = n
        assert sglang == reference, w
    with pytest.raises(ValueError, match="sliding_window=1"):
        engines.sglang_draft_window_size(1)


def test_refuses_a_deleted_tensor_and_writes_nothing(tmp_path: Path, target: TargetModel) -> None:
    src = make_source(tmp_path, target)
    weights = load_file(src / "model.safetensors")
    del weights["layers.1.self_attn.k_norm.weight"]
    save_file(weights, str(src / "model.safetensors"))
    with pytest.raises(ExportError, match=r"missing tensor 'layers\.1\.self_attn\.k_norm\.weight'"):
        export(src, tmp_path / "out", dtype="float32")
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_refuses_a_misshaped_tensor(tmp_path: Path, target: TargetModel) -> None:
    src = make_source(tmp_path, target)
    weights = load_file(src / "model.safetensors")
    weights["fc.weight"] = weights["fc.weight"][:, :1024].contiguous()
    save_file(weights, str(src / "model.safetensors"))
    with pytest.raises(ExportError, match=r"tensor 'fc\.weight' has shape \(512, 1024\), expected \(512, 1536\)"):
        export(src, tmp_path / "out", dtype="float32")


@pytest.mark.slow  # the quick tier stays under 3 minutes (README); the full suite runs it
def test_cli_from_a_run_checkpoint_and_bad_input(tmp_path: Path) -> None:
    from compose import compose_train

    from train.trainer import train

    train(compose_train(["experiment=dflash_swa_tiny", "trainer.max_steps=2", "trainer.progress=false",
                         "trainer.export=false", "data.num_eval=0", f"output_dir={tmp_path / 'run'}"]))
    assert not (tmp_path / "run" / "export").exists()  # so the exporter takes the newest checkpoint
    proc = subprocess.run([sys.executable, "-m", "train.export", str(tmp_path / "run"), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "reload max |Δ logits|" in proc.stdout and "--speculative-algorithm DFLASH" in proc.stdout
    assert (tmp_path / "out" / "model.safetensors").exists()
    bad = subprocess.run([sys.executable, "-m", "train.export", str(tmp_path / "nothing"), str(tmp_path / "out2")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "expected a run folder" in bad.stderr


def test_speculators_format_loads_with_speculators_config_classes(tmp_path: Path, target: TargetModel, reference_target_path) -> None:
    from speculators import SpeculatorModelConfig  # installed --no-deps by the test command
    from speculators.models.dflash import DFlashSpeculatorConfig as spec_config

    src = make_source(tmp_path, target, block_causal=False, window=16)
    report = export(src, tmp_path / "spec", fmt="speculators", target=str(reference_target_path), dtype="float32")
    assert report["max_abs_logit_diff"] == 0.0
    loaded = SpeculatorModelConfig.from_pretrained(str(tmp_path / "spec"))
    assert isinstance(loaded, spec_config)
    assert loaded.aux_hidden_state_layer_ids == [i + 1 for i in LAYER_IDS]  # speculators' convention
    assert loaded.block_size == 8 and loaded.mask_token_id == 3 and loaded.draft_vocab_size == 8192
    assert loaded.sliding_window_non_causal is True and loaded.target_hidden_size == 512
    layer = loaded.transformer_layer_config
    assert layer.layer_types == ["sliding_attention", "sliding_attention", "full_attention"] and layer.sliding_window == 16
    assert loaded.speculators_config.algorithm == "dflash"
    assert loaded.speculators_config.proposal_methods[0].speculative_tokens == 7
    assert loaded.speculators_config.verifier.architectures == ["Qwen3ForCausalLM"]
    weights = load_file(tmp_path / "spec" / "model.safetensors")
    assert torch.equal(weights["lm_head.weight"], target.lm_head.weight) and "fc.weight" in weights
    # vLLM 0.32's DFlash loader refuses parameters it does not have (it once failed on verifier_lm_head)
    assert not any(k.startswith("verifier_") for k in weights)
    with pytest.raises(ExportError, match="--format speculators needs the target"):
        export(src, tmp_path / "spec2", fmt="speculators", dtype="float32")


def test_a_zlab_layout_reexported_for_speculators_keeps_its_causality(tmp_path: Path, target: TargetModel, reference_target_path) -> None:
    """A z-lab-layout folder (our ``dflash`` export, or a published checkpoint) says a non-causal block with z-lab's
    ``is_causal: false``, not our ``sliding_block_causal``: re-exported as speculators it keeps
    ``sliding_window_non_causal: true`` (it was read as causal, and vLLM would have served the block causally), and the
    export's gate reloads the drafter the written config describes, so a flipped flag shows as a logit mismatch."""
    src = make_source(tmp_path, target, block_causal=False, window=16)
    export(src, tmp_path / "zlab", fmt="dflash", target=str(reference_target_path), dtype="float32")
    zlab = json.loads((tmp_path / "zlab" / "config.json").read_text())
    assert zlab["is_causal"] is False and "sliding_block_causal" not in zlab
    report = export(tmp_path / "zlab", tmp_path / "spec", fmt="speculators", target=str(reference_target_path), dtype="float32")
    assert report["max_abs_logit_diff"] == 0.0
    assert json.loads((tmp_path / "spec" / "config.json").read_text())["sliding_window_non_causal"] is True


@pytest.mark.parametrize("layer_types,block_causal,expected", [
    (["sliding_attention", "sliding_attention"], True, False),
    (["sliding_attention", "sliding_attention"], False, True),
    (["full_attention", "full_attention"], True, True),
    (["sliding_attention", "full_attention"], False, True),
    (["sliding_attention", "full_attention"], True, None),  # causal sliding + bidirectional full: one flag cannot say it
])
def test_speculators_causality_flag_per_drafter_shape(layer_types, block_causal, expected) -> None:
    from train.export import speculators_non_causal

    config = {"layer_types": layer_types, "sliding_block_causal": block_causal}
    if expected is None:
        with pytest.raises(ExportError, match="one causality flag for every layer.*export --format dflash"):
            speculators_non_causal(config)
        from compose import compose_train
        from train.trainer import to_train_config

        with pytest.raises(ValueError, match="trainer.export_formats=.*one causality flag"):  # refused at start-up, not after training
            to_train_config(compose_train(["experiment=dflash_swa_tiny", "drafter.layer_types=[sliding_attention,full_attention]",
                                          "trainer.export_formats=[dflash,speculators]"]))
    else:
        assert speculators_non_causal(config) is expected


def test_bad_sources_and_outputs_are_one_line_and_keep_what_is_there(tmp_path: Path, capsys) -> None:
    """Malformed run.json / config.json, a truncated model.safetensors or state.pt, a config without its layer ids: each
    used to be a traceback. An existing folder that is not an export used to be deleted whole by the rename; a file as
    the output, or in its path, a traceback."""
    from transformers import Qwen3Config

    from train.export import main

    small = Qwen3Config(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=8, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=8, max_position_embeddings=512)
    config = make_dflash_config(small, num_hidden_layers=1, block_size=4, mask_token_id=5, target_layer_ids=[1, 3],
                                layer_types=["full_attention"], sliding_window=None)
    good = tmp_path / "good"
    DFlashDraftModel(config).save_pretrained(good)
    config_dict = json.loads((good / "config.json").read_text())

    def source(name: str, files: dict[str, str | bytes]) -> Path:
        path = tmp_path / name
        path.mkdir()
        for file in ("config.json", "model.safetensors"):
            (path / file).write_bytes((good / file).read_bytes())
        for file, content in files.items():
            (path / file).write_bytes(content.encode() if isinstance(content, str) else content)
        return path

    no_ids = {**config_dict, "dflash_config": {"block_size": 4, "mask_token_id": 5}}
    cases = [
        (source("run_json", {"run.json": "{"}), r"run\.json: not valid JSON \(Expecting property name"),
        (source("config_json", {"config.json": '{"architectures": ['}), r"config\.json: not valid JSON"),
        (source("config_list", {"config.json": "[1]"}), r"config\.json: a JSON list; expected an object"),
        (source("no_ids", {"config.json": json.dumps(no_ids)}), r"config dflash_config\.target_layer_ids=None; expected a non-empty list"),
        (source("truncated", {"model.safetensors": (good / "model.safetensors").read_bytes()[:3000]}),
         r"model\.safetensors: not a readable safetensors file .*truncated or corrupt"),
        (source("state", {"state.pt": b"not a checkpoint"}), r"state\.pt: not a readable checkpoint"),
        (good / "config.json", r"config\.json: a file; expected a run folder"),
    ]
    for src, message in cases:
        with pytest.raises(ExportError, match=message):
            export(src, tmp_path / "out", dtype="float32")
        assert not (tmp_path / "out").exists()
    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("keep me")
    with pytest.raises(ExportError, match=r"mine: exists and is not an export \(holds 'notes\.txt'\)"):
        export(good, user, dtype="float32")
    assert (user / "notes.txt").read_text() == "keep me"
    with pytest.raises(ExportError, match=r"notes\.txt: a file; expected a new output folder"):
        export(good, user / "notes.txt", dtype="float32")
    with pytest.raises(ExportError, match=r"notes\.txt is a file; expected the output folder's place"):
        export(good, user / "notes.txt" / "out", dtype="float32")
    assert export(good, tmp_path / "out", dtype="float32")["max_abs_logit_diff"] == 0.0
    assert export(good, tmp_path / "out", dtype="float32")["max_abs_logit_diff"] == 0.0  # a previous export is replaced
    assert main([str(good), str(tmp_path / "out2"), "--target", str(tmp_path)]) == 2  # a ValueError, not only ExportError
    err = capsys.readouterr().err
    assert f"error: --target={str(tmp_path)!r}: no config.json there" in err and "Traceback" not in err and not (tmp_path / "out2").exists()


def _small_source(tmp_path: Path, name: str = "good", **config_changes) -> tuple[Path, dict]:
    """A one-layer DFlash drafter for an 8-layer, 96-token target shape (seconds to export)."""
    from transformers import Qwen3Config

    small = Qwen3Config(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=8, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=8, max_position_embeddings=512)
    config = make_dflash_config(small, **{"num_hidden_layers": 2, "block_size": 4, "mask_token_id": 5, "target_layer_ids": [1, 3],
                                          "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8, **config_changes})
    path = tmp_path / name
    DFlashDraftModel(config).save_pretrained(path)
    return path, json.loads((path / "config.json").read_text())


@pytest.mark.parametrize("change,message", [
    ({"layer_types": ["sliding_attention"]}, r"config layer_types=\['sliding_attention'\]; expected a list of num_hidden_layers=2 entries"),
    ({"layer_types": ["sliding_attention", "chunked_attention"]}, r"config layer_types=.*each one of sliding_attention, full_attention"),
    ({"sliding_window": None}, r"config sliding_window=None; expected a positive integer .*sliding layers"),
    ({"sliding_window": 0}, r"config sliding_window=0; expected a positive integer"),
    ({"sliding_window": "16"}, r"config sliding_window='16'; expected a positive integer"),
    ({"dflash_config": {"target_layer_ids": [1, 3], "block_size": 1, "mask_token_id": 5}}, r"config dflash_config\.block_size=1; expected an integer >= 2"),
    ({"dflash_config": {"target_layer_ids": [1, 3], "block_size": 4, "mask_token_id": 96}}, r"config dflash_config\.mask_token_id=96; expected a token id in 0\.\.95"),
    ({"vocab_size": 0}, r"config vocab_size=0; expected a positive integer"),
    ({"sliding_block_causal": "yes"}, r"config sliding_block_causal='yes'; expected true, false or absent"),  # was read as true
])
def test_bad_config_fields_are_one_line_and_write_nothing(tmp_path: Path, change: dict, message: str) -> None:
    """Each of these used to be a traceback (a KeyError, IndexError or huggingface_hub's validation error, which is no
    ValueError) or, for a sliding layer without a window, an export every engine refuses or misreads."""
    src, config = _small_source(tmp_path)
    (src / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ExportError, match=message):
        export(src, tmp_path / "out", dtype="float32")
    assert not (tmp_path / "out").exists()


def test_a_zlab_config_without_layer_types_exports_all_full(tmp_path: Path) -> None:
    """z-lab's layout may leave layer_types out (its loader then runs every layer full): exported as that, not a KeyError."""
    src, config = _small_source(tmp_path, layer_types=["full_attention", "full_attention"], sliding_window=None)
    (src / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k not in ("layer_types", "use_sliding_window")}))
    report = export(src, tmp_path / "out", dtype="float32")
    assert report["max_abs_logit_diff"] == 0.0 and report["layer_types"] == ["full_attention", "full_attention"]


def test_an_export_onto_its_own_source_is_refused(tmp_path: Path) -> None:
    """A run's export/ (or an export folder) given as the output was replaced by the new export: the fp32 drafter gone and
    the run no longer exportable ("architectures=['DFlashSpeculator']; expected DFlashDraftModel")."""
    src, _ = _small_source(tmp_path, "run/export")
    (tmp_path / "run" / "run.json").write_text("{}")
    before = (src / "model.safetensors").read_bytes()
    for source, output in ((src, src), (tmp_path / "run", src)):
        with pytest.raises(ExportError, match=r"is the folder the drafter is read from"):
            export(source, output, dtype="bfloat16")
    assert (src / "model.safetensors").read_bytes() == before


def test_a_run_record_whose_target_is_not_an_object_is_one_line(tmp_path: Path) -> None:
    src, _ = _small_source(tmp_path, "run/export")
    (tmp_path / "run" / "run.json").write_text(json.dumps({"target": "x"}))
    with pytest.raises(ExportError, match=r"run\.json: target='x'; expected an object"):
        export(tmp_path / "run", tmp_path / "out", dtype="float32")


def test_the_wrong_target_is_refused_before_anything_is_written(tmp_path: Path, reference_target_path) -> None:
    """The drafter's sizes and layer ids against the target it is exported with (the loop's own checks at load): a wrong
    target exported with exit 0 (its embedding in the checkpoint, the drafter's vocabulary in the config), or a traceback."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    src, config = _small_source(tmp_path)
    other = Qwen3Config(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=8, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=8, max_position_embeddings=512, architectures=["Qwen3ForCausalLM"])
    Qwen3ForCausalLM(other).save_pretrained(tmp_path / "other_vocab")
    with pytest.raises(ExportError, match=r"config vocab_size=96, but the target .*other_vocab has vocab_size=128"):
        export(src, tmp_path / "out", fmt="speculators", target=str(tmp_path / "other_vocab"), dtype="float32")
    # the reference target: 8 layers, but hidden 512 against the drafter's 32
    with pytest.raises(ExportError, match=r"config hidden_size=32, but the target .* has hidden_size=512"):
        export(src, tmp_path / "out", target=str(reference_target_path), dtype="float32")
    shallow = Qwen3Config(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=8, max_position_embeddings=512, architectures=["Qwen3ForCausalLM"])
    Qwen3ForCausalLM(shallow).save_pretrained(tmp_path / "shallow")
    with pytest.raises(ExportError, match=r"dflash_config\.target_layer_ids=\[1, 3\]; ids must lie in 0\.\.1 .*has 3 layers"):
        export(src, tmp_path / "out", target=str(tmp_path / "shallow"), dtype="float32")
    assert not (tmp_path / "out").exists()


def test_a_dflash_draft_vocabulary_never_built_is_refused(tmp_path: Path, reference_target_path) -> None:
    """An all-zero d2t maps every draft to target ids 0.. in vLLM (it adds d2t): refused as EAGLE-3's already was."""
    src, _ = _small_source(tmp_path, draft_vocab_size=20)
    with pytest.raises(ExportError, match=r"t2d marks 0 target ids, expected draft_vocab_size=20"):
        export(src, tmp_path / "out", fmt="speculators", dtype="float32")


def test_exported_files_are_readable_by_others(tmp_path: Path) -> None:
    """safetensors' save_file writes through mkstemp (0600): a server running as another user could read the config, not
    the weights. The export's files get the umask's normal permissions, as the folder already did."""
    import os
    import stat

    src, _ = _small_source(tmp_path)
    old = os.umask(0o022)
    try:
        export(src, tmp_path / "out", dtype="float32")
    finally:
        os.umask(old)
    for path in (tmp_path / "out", tmp_path / "out" / "config.json", tmp_path / "out" / "model.safetensors"):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o755 if path.is_dir() else 0o644), (path.name, oct(mode))


def test_sglang_is_told_a_bidirectional_sliding_drafter_is_served_causally(tmp_path: Path) -> None:
    """SGLang's DFLASH reads no is_causal (sliding layers run causal there): the export says so beside its command."""
    src, _ = _small_source(tmp_path, sliding_block_causal=False)
    assert any("SGLang's DFLASH serves sliding layers causally" in n for n in export(src, tmp_path / "out", dtype="float32").get("notes", []))
    src2, _ = _small_source(tmp_path, "causal")
    assert not export(src2, tmp_path / "out2", dtype="float32").get("notes")


def test_a_runs_export_folder_finds_the_runs_target(tmp_path: Path) -> None:
    """README: the source may be a run folder, its export/ or a checkpoints/step_* folder. Given export/ directly,
    --format speculators asked for --target although run.json, one folder up, records it."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    small = Qwen3Config(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=8, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=8, max_position_embeddings=512, architectures=["Qwen3ForCausalLM"])
    Qwen3ForCausalLM(small).save_pretrained(tmp_path / "target")
    src, _ = _small_source(tmp_path, "run/export", layer_types=["sliding_attention", "sliding_attention"])  # one causality
    (tmp_path / "run" / "run.json").write_text(json.dumps({"target": {"path": str(tmp_path / "target"),
                                                                      "resolved_path": str(tmp_path / "target")}}))
    report = export(src, tmp_path / "out", fmt="speculators", dtype="float32")
    assert report["max_abs_logit_diff"] == 0.0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["speculators_config"]["verifier"]["name_or_path"] == str(tmp_path / "target")
