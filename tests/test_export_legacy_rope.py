"""The export path: a legacy (transformers 4) RoPE config re-exported, and a corrupt speculators export read
by the loop. References: z-lab's own loader (PyPI ``dflash``) and transformers' config classes, never our code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import Qwen3Config

from models.dflash import DFlashDraftModel, make_dflash_config
from train.export import export, speculators_config_json

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}


def _small_target() -> Qwen3Config:
    return Qwen3Config(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=8, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=8, max_position_embeddings=512, architectures=["Qwen3ForCausalLM"])


def _legacy_rope_source(tmp_path: Path) -> Path:
    """A z-lab-layout DFlash folder whose config.json is in transformers 4's shape (z-lab's published checkpoints): RoPE
    as ``rope_theta`` + ``rope_scaling``, no ``rope_parameters``."""
    config = make_dflash_config(_small_target(), num_hidden_layers=2, block_size=4, mask_token_id=5, target_layer_ids=[1, 3],
                                layer_types=["full_attention", "full_attention"], sliding_window=None)
    src = tmp_path / "src"
    DFlashDraftModel(config).save_pretrained(src)
    raw = json.loads((src / "config.json").read_text())
    raw.pop("rope_parameters", None)
    raw.update(rope_theta=1e6, rope_scaling=dict(YARN))
    (src / "config.json").write_text(json.dumps(raw))
    return src


def test_a_legacy_rope_scaling_survives_the_export(tmp_path: Path) -> None:
    """The source's yarn RoPE, as z-lab's loader reads it from the source, is what it reads from the export (bf16, the CLI's
    default dtype: the reload check at positions ~50 did not see the dropped scaling; the export said rope_scaling null)."""
    import dflash.model as zlab

    src = _legacy_rope_source(tmp_path)
    export(src, tmp_path / "out", dtype="bfloat16")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    theirs_src = zlab.DFlashDraftModel.from_pretrained(src, dtype=torch.float32)
    theirs_out = zlab.DFlashDraftModel.from_pretrained(tmp_path / "out", dtype=torch.float32)
    assert theirs_src.config.rope_parameters["rope_type"] == "yarn"  # the reference reads the source as yarn
    assert theirs_out.config.rope_parameters["rope_type"] == "yarn", written.get("rope_parameters")
    assert torch.equal(theirs_out.rotary_emb.inv_freq, theirs_src.rotary_emb.inv_freq)
    assert theirs_out.rotary_emb.attention_scaling == theirs_src.rotary_emb.attention_scaling
    assert written["rope_scaling"]["rope_type"] == "yarn" and written["rope_theta"] == 1e6  # transformers 4 readers too


def test_a_legacy_rope_scaling_exports_in_fp32(tmp_path: Path) -> None:
    """The same source in fp32 was refused ("reloaded export differs ... by 0.0008"): the reload saw the default RoPE."""
    report = export(_legacy_rope_source(tmp_path), tmp_path / "out", dtype="float32")
    assert report["max_abs_logit_diff"] == 0.0


def _speculators_folder(tmp_path: Path) -> Path:
    """A speculators-layout DFlash folder (our ``--format speculators`` config.json) and its weights."""
    target = _small_target()
    config = make_dflash_config(target, num_hidden_layers=2, block_size=4, mask_token_id=5, target_layer_ids=[1, 3],
                                layer_types=["sliding_attention", "sliding_attention"], sliding_window=8)
    out = tmp_path / "spec"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(speculators_config_json(config.to_dict(), target, "tgt")))
    save_file({k: v.contiguous() for k, v in DFlashDraftModel(config).state_dict().items()}, str(out / "model.safetensors"))
    return out


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_corrupt_speculators_export_is_one_line(tmp_path: Path, damage: str) -> None:
    """The loop's reader (``load_drafter_model``) on a speculators checkpoint whose model.safetensors is cut off or not
    safetensors: one ValueError naming the file, as for our own layout (``check_drafter_weights``); was safetensors'
    SafetensorError (no ValueError: ``python -m infer`` / ``eval`` ended in a traceback)."""
    from infer.loading import load_drafter_model, read_drafter_config

    folder = _speculators_folder(tmp_path)
    config = read_drafter_config(folder)
    assert isinstance(load_drafter_model(folder, config, torch.float32), DFlashDraftModel)  # the intact folder loads
    file = folder / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"not a safetensors file at all")
    with pytest.raises(ValueError, match=r"model\.safetensors: not a readable safetensors file") as error:
        load_drafter_model(folder, config, torch.float32)
    assert "\n" not in str(error.value)


def test_an_eagle3_legacy_rope_scaling_survives_the_sglang_export(tmp_path: Path) -> None:
    """EAGLE-3's SGLang layout: a Llama 3.1-style ``rope_scaling`` (llama3) in a transformers-4 config was written as
    ``rope_scaling: null``; transformers' LlamaConfig (what SGLang's config loading builds) reads the export as the source."""
    from collections import Counter

    from transformers import LlamaConfig

    from models.eagle3 import Eagle3DraftModel, build_draft_vocab, make_eagle3_config

    target = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=8, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, max_position_embeddings=512)
    config = make_eagle3_config(target, num_hidden_layers=1, target_layer_ids=[1, 3, 5], layer_types=["full_attention"],
                                sliding_window=None, draft_vocab_size=48, ttt_length=3)
    model = Eagle3DraftModel(config)
    model.set_draft_vocab(*build_draft_vocab(Counter(range(48)), 96, 48))
    src = tmp_path / "src"
    model.save_pretrained(src)
    raw = json.loads((src / "config.json").read_text())
    raw.pop("rope_parameters", None)
    raw.update(rope_theta=5e5, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                             "original_max_position_embeddings": 64})
    (src / "config.json").write_text(json.dumps(raw))
    export(src, tmp_path / "out", fmt="sglang", dtype="bfloat16")
    theirs_src = LlamaConfig.from_dict(raw)
    theirs_out = LlamaConfig.from_dict(json.loads((tmp_path / "out" / "config.json").read_text()))
    assert theirs_src.rope_parameters["rope_type"] == "llama3"
    assert theirs_out.rope_parameters == theirs_src.rope_parameters
