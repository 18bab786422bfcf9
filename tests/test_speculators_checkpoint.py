"""Drafters trained by vLLM speculators (0.9.0) loaded into our models (infer/speculators_checkpoint.py): built with
speculators' own classes the way its trainer builds them (``create_transformer_layer_config`` +
``from_training_args``), saved by its own checkpointer, loaded through ``python -m eval``'s path; our drafts and
logits equal speculators' own forward (the independent reference) on the same inputs, eval decodes losslessly,
and our own speculators export reads back to our model's logits."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest
import torch

# speculators is imported by the tests that use it (its import takes ~5 s, paid by every xdist worker collecting)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("speculators") is None,
                                reason="speculators is not installed (the README's test command installs it)")

from infer import speculators_checkpoint  # noqa: E402
from infer.loading import read_drafter_config, resolve_run  # noqa: E402
from models.dflash import DFlashDraftModel, LayerMaskSpec, dense_mask, make_dflash_config, sliding_block_causal  # noqa: E402
from models.eagle3 import Eagle3DraftModel, build_draft_vocab, make_eagle3_config  # noqa: E402
from models.target import TargetModel  # noqa: E402

SPEC_IDS = [2, 4, 6]  # speculators' ids (input of layer k) = ours [1, 3, 5] + 1
WINDOW = 64  # > T: the two trainers' window rules agree below W (module docstring of speculators_checkpoint)
T, BLOCK, MASK, DRAFT_VOCAB, STEPS = 24, 4, 3, 1000, 3


@pytest.fixture(scope="module")
def target(reference_target_path) -> TargetModel:
    return TargetModel.from_pretrained(str(reference_target_path), "cpu", dtype="float32")


def perturbed_and_bf16(model: torch.nn.Module) -> torch.nn.Module:
    """Norms moved off 1 (a mix-up would show) and every weight made bf16-exact, so the trainer's bf16 save is lossless."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
            p.copy_(p.to(torch.bfloat16).float())
    return model.eval()


def spec_layer_config(target_path: Path, arch: str, full: tuple[int, ...] = (1,)):
    from speculators.train.cli import create_transformer_layer_config

    return create_transformer_layer_config(verifier_name_or_path=str(target_path), num_layers=2, draft_arch=arch, hidden_act=None,
                                           sliding_window=WINDOW, full_attention_indices=list(full))


def spec_draft_vocab(vocab_size: int):
    g = torch.Generator().manual_seed(0)
    ids, counts = torch.randint(0, vocab_size, (4000,), generator=g), torch.randint(1, 100, (4000,), generator=g)
    return build_draft_vocab(Counter(dict(zip(ids.tolist(), counts.tolist()))), vocab_size, DRAFT_VOCAB)


def spec_dflash(target_path: Path, non_causal: bool, draft_vocab: bool = False):
    from speculators.models.dflash import DFlashDraftModel as SpecDFlash

    layers = spec_layer_config(target_path, "qwen3")
    d2t, t2d = spec_draft_vocab(layers.vocab_size) if draft_vocab else (None, None)
    torch.manual_seed(0)
    model = SpecDFlash.from_training_args(layers, t2d=t2d, d2t=d2t, verifier_name_or_path=str(target_path), target_layer_ids=SPEC_IDS,
                                          block_size=BLOCK, mask_token_id=MASK,
                                          draft_vocab_size=DRAFT_VOCAB if draft_vocab else layers.vocab_size,
                                          sliding_window_non_causal=non_causal, draft_attn_impl="eager")
    return perturbed_and_bf16(model)


def spec_eagle3(target_path: Path, full: tuple[int, ...] = (1,), **flags):
    from speculators.models.eagle3 import Eagle3DraftModel as SpecEagle3

    layers = spec_layer_config(target_path, "llama", full)
    d2t, t2d = spec_draft_vocab(layers.vocab_size)
    torch.manual_seed(0)
    model = SpecEagle3.from_training_args(layers, t2d=t2d, d2t=d2t, verifier_name_or_path=str(target_path), target_layer_ids=SPEC_IDS,
                                          draft_vocab_size=DRAFT_VOCAB, ttt_steps=STEPS, draft_attn_impl="eager",
                                          norm_before_residual=flags.pop("norm_before_residual", False), **flags)
    return perturbed_and_bf16(model)


def trainer_save(model, save_path: Path, epoch: int = 0) -> Path:
    """speculators' trainer save (train/checkpointer.py SingleGPUCheckpointer: bf16 save_pretrained into SAVE/<epoch>)."""
    from speculators.train.checkpointer import SingleGPUCheckpointer

    SingleGPUCheckpointer(save_path).save_checkpoint(model, torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1), epoch)
    return save_path / str(epoch)


def inputs(vocab: int):
    g = torch.Generator().manual_seed(5)
    return torch.randn(1, T, 3 * 512, generator=g), torch.randint(0, vocab, (1, T), generator=g)


def load_ours(path: Path) -> torch.nn.Module:
    config = read_drafter_config(path)
    return speculators_checkpoint.load_model(path, config).float()


@torch.no_grad()
def our_dflash_logits(model: DFlashDraftModel, target: TargetModel, features, ids) -> torch.Tensor:
    """Every block anchored at 0 .. T - B - 1 at once (training layout) -> [N * B, V] (Vd with a draft vocabulary)."""
    anchors = torch.arange(T - BLOCK)[None]
    ctx_valid = torch.ones(1, T, dtype=torch.bool)
    cfg = model.config
    masks = {t: dense_mask(anchors, ctx_valid, BLOCK, LayerMaskSpec.for_layer(t, cfg.sliding_window, sliding_block_causal(cfg)))
             for t in set(cfg.layer_types)}
    block_ids = torch.full((1, anchors.numel() * BLOCK), MASK)
    block_ids[:, ::BLOCK] = ids[:, anchors[0]]
    positions = (anchors[0, :, None] + torch.arange(BLOCK)).reshape(1, -1)
    return model.head(target.lm_head)(model(target.embed_tokens(block_ids), features, positions, masks))[0]


@pytest.mark.parametrize("non_causal, draft_vocab", [(False, False), (True, False), (False, True)])
def test_dflash_checkpoint_matches_speculators_forward(tmp_path: Path, target: TargetModel, reference_target_path, non_causal: bool,
                                                      draft_vocab: bool) -> None:
    spec = spec_dflash(reference_target_path, non_causal, draft_vocab)
    path = trainer_save(spec, tmp_path / "save")
    saved = json.loads((path / "config.json").read_text())
    assert saved["speculators_model_type"] == "dflash" and saved["sliding_window_non_causal"] is non_causal
    ours = load_ours(path)
    assert ours.target_layer_ids == [1, 3, 5] and ours.block_size == BLOCK and ours.mask_token_id == MASK
    assert ours.config.layer_types == ["sliding_attention", "full_attention"] and ours.config.sliding_window == WINDOW
    assert sliding_block_causal(ours.config) is not non_causal
    assert ours.has_draft_vocab is draft_vocab
    if draft_vocab:  # speculators' reduced head: the verifier's rows of the draft ids, as ours builds it
        assert torch.equal(ours.d2t, spec.d2t) and torch.equal(ours.t2d, spec.t2d)
        torch.testing.assert_close(ours.lm_head.weight, target.lm_head.weight[ours.draft_ids_in_target()].to(torch.bfloat16).float())

    features, ids = inputs(target.vocab_size)
    with torch.no_grad():  # every valid position an anchor (max_anchors = T - B), so select_anchors' draw is the identity
        _, expected, _, _, _ = spec._backbone_forward(features, ids, torch.ones(1, T), torch.randn(1, T, 512),
                                                      torch.zeros(1, T, dtype=torch.long), max_anchors=T - BLOCK)
    got = our_dflash_logits(ours, target, features, ids)
    torch.testing.assert_close(got, expected[0], rtol=0, atol=1e-4)
    drafts = got.view(-1, BLOCK, got.shape[-1]).argmax(-1)[:, 1:]  # slots 1..B-1 are the drafts
    assert torch.equal(drafts, expected[0].view(-1, BLOCK, got.shape[-1]).argmax(-1)[:, 1:])


# the flags apart too (norm_output without norm_before_residual: a loader reading one flag for the other passed when they
# came together), and both layers full (no window to carry: a loader keeping the layer config's window passed)
@pytest.mark.parametrize("flags", [{}, {"fc_norm": True, "norm_output": True, "norm_before_residual": True},
                                   {"norm_before_fc": True, "norm_output": True, "norm_before_residual": True},
                                   {"fc_norm": True, "norm_output": True}, {"full": (0, 1)}],
                         ids=["eagle3", "eagle3.1", "speculators-train-defaults", "norm-output-alone", "all-full"])
def test_eagle3_checkpoint_matches_speculators_forward(tmp_path: Path, target: TargetModel, reference_target_path, flags: dict) -> None:
    from train.eagle3 import shift_left
    from train.export import eagle3_logits

    spec = spec_eagle3(reference_target_path, **dict(flags))
    all_full = flags.pop("full", None) == (0, 1)
    path = trainer_save(spec, tmp_path / "save")
    ours = load_ours(path)
    assert ours.target_layer_ids == [1, 3, 5] and ours.ttt_length == STEPS
    assert ours.config.layer_types == (["full_attention"] * 2 if all_full else ["sliding_attention", "full_attention"])
    assert ours.config.sliding_window == (None if all_full else WINDOW)
    assert torch.equal(ours.d2t, spec.d2t) and torch.equal(ours.t2d, spec.t2d)
    for flag in ("fc_norm", "norm_before_fc", "norm_output", "norm_before_residual"):
        assert bool(getattr(ours.config, flag)) is flags.get(flag, False)

    features, ids = inputs(target.vocab_size)
    captured = []
    hook = spec.lm_head.register_forward_hook(lambda m, a, out: captured.append(out))
    with torch.no_grad():  # speculators' EAGLE-3 reads the tokens already shifted (its data's shift_batch): index t holds x_{t+1}
        spec_drafts = spec(features, shift_left(ids, 1, 0), torch.zeros(1, T, dtype=torch.long), ttt_steps=STEPS)
    hook.remove()
    got = eagle3_logits(ours, features, ids, steps=STEPS)[:, 0]  # [steps, T, Vd]
    torch.testing.assert_close(got, torch.cat(captured), rtol=0, atol=1e-4)
    assert torch.equal(got.argmax(-1), torch.cat(spec_drafts))


@pytest.mark.slow  # ~6 s on one core; the quick tier keeps the loads against speculators' own forward
def test_eval_runs_a_speculators_save_path_losslessly(tmp_path: Path, reference_target_path, capsys) -> None:
    """``python -m eval mtbench --drafter SAVE_PATH``: the best epoch, the verifier it names as the target, tokens = target alone."""
    from eval.__main__ import main

    for kind, model in (("dflash", spec_dflash(reference_target_path, False)), ("eagle3", spec_eagle3(reference_target_path))):
        save = tmp_path / kind
        trainer_save(model, save, 0)
        trainer_save(model, save, 1)
        (save / speculators_checkpoint.BEST_LINK).symlink_to("0", target_is_directory=True)
        target_path, drafter_path, _ = resolve_run(None, str(save))
        assert (target_path, Path(drafter_path)) == (str(reference_target_path), (save / "0").resolve())
        out = tmp_path / f"out-{kind}"
        assert main(["mtbench", "--drafter", str(save), "--num-questions", "1", "--max-new-tokens", "8", "--no-pld", "--out", str(out)]) == 0, \
            capsys.readouterr().err
        result = json.loads((out / "results.json").read_text())
        assert result["summary"]["same_as_baseline"] == 1.0 and result["config"]["target"] == str(reference_target_path)
        assert result["records"][0]["stats"]["accepted_per_step"]


def test_our_speculators_export_reads_back_to_our_logits(tmp_path: Path, target: TargetModel, reference_target_path) -> None:
    from train.export import draft_logits, eagle3_logits, export

    torch.manual_seed(0)
    config = make_dflash_config(target.config, num_hidden_layers=2, block_size=BLOCK, mask_token_id=MASK, target_layer_ids=[1, 3, 5],
                                layer_types=["sliding_attention", "full_attention"], sliding_window=16, sliding_block_causal=False)
    dflash = perturbed_and_bf16(DFlashDraftModel(config))
    dflash.save_pretrained(tmp_path / "dflash")
    export(tmp_path / "dflash", tmp_path / "dflash-spec", fmt="speculators", target=str(reference_target_path), dtype="float32")
    reloaded = load_ours(tmp_path / "dflash-spec")
    assert sliding_block_causal(reloaded.config) is False and reloaded.config.layer_types == config.layer_types
    features, ids = inputs(target.vocab_size)
    block = torch.tensor([[11] + [MASK] * (BLOCK - 1)])
    assert torch.equal(draft_logits(reloaded, features, block, target.embed_tokens, target.lm_head),
                       draft_logits(dflash, features, block, target.embed_tokens, target.lm_head))

    config = make_eagle3_config(target.config, num_hidden_layers=2, target_layer_ids=[1, 3, 5], sliding_window=16, draft_vocab_size=DRAFT_VOCAB,
                                layer_types=["sliding_attention", "full_attention"], ttt_length=STEPS, fc_norm=True)
    eagle3 = perturbed_and_bf16(Eagle3DraftModel(config))
    eagle3.set_draft_vocab(*build_draft_vocab(Counter(range(DRAFT_VOCAB)), config.vocab_size, DRAFT_VOCAB))
    eagle3.save_pretrained(tmp_path / "eagle3")
    export(tmp_path / "eagle3", tmp_path / "eagle3-spec", fmt="speculators", target=str(reference_target_path), dtype="float32")
    reloaded = load_ours(tmp_path / "eagle3-spec")
    assert torch.equal(eagle3_logits(reloaded, features, ids, STEPS), eagle3_logits(eagle3, features, ids, STEPS))


@pytest.mark.parametrize("kind, field, value, message", [
    ("dflash", "sample_from_anchor", True, "sample_from_anchor=True"),
    ("dflash", "draft_vocab_size", 1, "draft_vocab_size=1"),
    ("dflash", "draft_vocab_size", 200000, "draft_vocab_size=200000"),
    ("dflash", "mask_token_id", None, "mask_token_id=None"),
    ("eagle3", "eagle_aux_hidden_state_layer_ids", None, "eagle_aux_hidden_state_layer_ids=None"),
    ("eagle3", "transformer_layer_config.model_type", "qwen3", "transformer_layer_config.model_type='qwen3'"),
    ("eagle3", "speculators_model_type", "mtp", "speculators_model_type='mtp'"),
])
def test_unmappable_fields_fail_in_one_line(tmp_path: Path, kind: str, field: str, value, message: str) -> None:
    layers = {"model_type": "qwen3" if kind == "dflash" else "llama", "vocab_size": 151936, "hidden_size": 512, "num_hidden_layers": 1,
              "layer_types": ["full_attention"]}
    config = {"speculators_model_type": kind, "transformer_layer_config": layers, "draft_vocab_size": 151936, "block_size": 4,
              "mask_token_id": 3, "aux_hidden_state_layer_ids": [2], "eagle_aux_hidden_state_layer_ids": [2, 4, 6]}
    parent, _, key = field.rpartition(".")
    (config[parent] if parent else config)[key] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=message) as error:
        read_drafter_config(tmp_path)
    assert "\n" not in str(error.value) and "config.json" in str(error.value)


def test_an_eagle3_config_without_norm_before_residual_is_refused_in_one_line(tmp_path: Path) -> None:
    """speculators' own config reads a missing norm_before_residual as false, vLLM's reader (``update_eagle3``) as true:
    our loop took false, so the same folder drafted otherwise under vLLM. Neither is guessed; written out, it is read."""
    layers = {"model_type": "llama", "vocab_size": 151936, "hidden_size": 512, "num_hidden_layers": 1, "layer_types": ["full_attention"]}
    config = {"speculators_model_type": "eagle3", "transformer_layer_config": layers, "draft_vocab_size": 151936,
              "eagle_aux_hidden_state_layer_ids": [2, 4, 6]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as error:
        read_drafter_config(tmp_path)
    assert str(error.value) == (f"{tmp_path / 'config.json'}: norm_before_residual=None: expected true or false written out "
                                "(speculators' own config reads a missing one as false, vLLM's as true: the drafts differ)")
    for value in (True, False):
        (tmp_path / "config.json").write_text(json.dumps({**config, "norm_before_residual": value}))
        assert read_drafter_config(tmp_path)["norm_before_residual"] is value
    # found by review (2026-12-06's sixth session): the other flags went through bool(), so the string "false" read as true
    (tmp_path / "config.json").write_text(json.dumps({**config, "norm_before_residual": False, "norm_output": "false"}))
    with pytest.raises(ValueError, match=r"config\.json: norm_output='false': expected true, false or absent"):
        read_drafter_config(tmp_path)
