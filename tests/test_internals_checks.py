"""Reaches into other libraries' internals whose checks had holes (a review, 2026-12-06): each test fakes the library as another version has
it and expects a loud refusal naming what changed (the code went on silently before)."""

from __future__ import annotations

import dataclasses
import re
import sys
import types

import pytest
import torch
import transformers
from test_library_internals import LlamaConfigAsTransformers4, Qwen3ConfigAsTransformers4


# --- transformers: a drafter config that drops a *scaled* RoPE (llama3: Llama 3.1; yarn: the builtin SmolLM2) ----------

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
YARN_ROPE = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 4096}


def target_config(cls, rope: dict):
    return cls(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=8, num_attention_heads=4,
               num_key_value_heads=2, head_dim=8, max_position_embeddings=32768, rope_parameters=dict(rope))


@pytest.mark.parametrize("rope", [LLAMA3_ROPE, YARN_ROPE], ids=["llama3", "yarn"])
def test_a_drafter_config_that_drops_a_scaled_rope_is_refused(monkeypatch, rope) -> None:
    """``check_rope_taken`` returned at once for any rope_type but default: a config dropping a scaled RoPE trained the
    drafter on the default theta-10000 RoPE without a word."""
    from models import dflash, eagle3

    eagle3_args = dict(num_hidden_layers=1, target_layer_ids=[1, 3, 4], draft_vocab_size=32, layer_types=["full_attention"],
                       sliding_window=None)
    dflash_args = dict(num_hidden_layers=1, block_size=4, mask_token_id=1, target_layer_ids=[1], layer_types=["full_attention"],
                       sliding_window=None)
    target = target_config(transformers.LlamaConfig if rope is LLAMA3_ROPE else transformers.Qwen3Config, rope)
    # the installed transformers takes it
    assert eagle3.LlamaRotaryEmbedding(eagle3.make_eagle3_config(target, **eagle3_args)).rope_type == rope["rope_type"]
    assert dflash.Qwen3RotaryEmbedding(dflash.make_dflash_config(target, **dflash_args)).rope_type == rope["rope_type"]

    monkeypatch.setattr(eagle3, "LlamaConfig", LlamaConfigAsTransformers4)
    monkeypatch.setattr(dflash, "Qwen3Config", Qwen3ConfigAsTransformers4)
    told = re.escape(f"transformers {transformers.__version__}: ") + r".*did not take the target's RoPE \(type '" + rope["rope_type"]
    with pytest.raises(ValueError, match=told) as error:
        eagle3.make_eagle3_config(target, **eagle3_args)
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match=told):
        dflash.make_dflash_config(target, **dflash_args)


# --- FlashAttention-4: the BlockInfo / AttentionMask methods fa4_key_intervals overrides ------------------------------

OVERRIDDEN = ["BlockInfo.get_n_block_min_max", "BlockInfo.get_n_block_min_causal_local_mask",
              "BlockInfo.get_n_block_min_before_local_mask", "BlockInfo.get_m_block_min_max", "AttentionMask.apply_mask"]


def _function(names: list[str]):
    namespace: dict = {}
    exec(f"def f({', '.join(names)}): pass", namespace)
    return namespace["f"]


def fake_fa4(changed: dict[str, list[str]]) -> dict[str, types.ModuleType]:
    """FA4's modules as ``RECORDED`` has them (a stub per internal), but ``changed``: "Class.method" -> its new parameters."""
    from swa_kernels.fa4_adapter import RECORDED

    modules: dict[str, types.ModuleType] = {}
    classes: dict[tuple[str, str], dict] = {}  # (module, class) -> {"fields": [...], "methods": {...}, "plain": bool}
    for (module, name), (kind, expected) in RECORDED.items():
        mod = modules.setdefault(module, types.ModuleType(module))
        if "." in name:
            owner, method = name.split(".")
            classes.setdefault((module, owner), {"fields": [], "methods": {}})["methods"][method] = _function(changed.get(name, list(expected)))
        elif kind == "fields":
            classes.setdefault((module, name), {"fields": [], "methods": {}})["fields"] = list(expected)
        elif kind == "class":
            classes.setdefault((module, name), {"fields": [], "methods": {}})
        elif kind == "params":
            setattr(mod, name, _function(list(expected)))
    for (module, name), parts in classes.items():
        setattr(modules[module], name, dataclasses.make_dataclass(name, parts["fields"], namespace=parts["methods"]))
    return modules


def test_every_method_the_key_intervals_override_is_recorded() -> None:
    from swa_kernels.fa4_adapter import RECORDED

    recorded = {name for (module, name) in RECORDED}
    assert [m for m in OVERRIDDEN if m not in recorded] == []


@pytest.mark.parametrize("method, params", [
    ("BlockInfo.get_n_block_min_max", ["self", "seqlen_info", "m_block", "batch_idx", "split_idx", "num_splits"]),
    ("AttentionMask.apply_mask", ["self", "acc_S", "batch_idx", "head_idx", "m_block", "n_block", "thr_mma", "mask_seqlen",
                                  "mask_causal", "mask_causal_bottom_right", "mask_local", "mask_mod", "aux_data", "fastdiv_mods"]),
])
def test_fa4_changing_an_overridden_method_is_refused(monkeypatch, method, params) -> None:
    """A flash-attn-4 whose ``BlockInfo``/``AttentionMask`` methods take other parameters (the key-interval kernels override
    them, and FA4's kernels call them positionally): ``check()`` passed it (only the entry points, fields and mask helpers
    were recorded), and the patched kernels got their arguments in the wrong places. Now the check names the method."""
    from swa_kernels import fa4_adapter

    fa4_adapter.check.cache_clear()
    monkeypatch.setattr(fa4_adapter, "installed_version", lambda: fa4_adapter.PINNED_VERSION)
    for changed, want_ok in (({}, True), ({method: params}, False)):
        modules = fake_fa4(changed)
        monkeypatch.setattr(fa4_adapter.importlib, "import_module", lambda name, *a: modules[name] if name in modules else sys.modules[name])
        fa4_adapter.check.cache_clear()
        try:
            result = fa4_adapter.check()
        finally:
            fa4_adapter.check.cache_clear()
        assert result.ok is want_ok, (changed, result.reason)
    module = "flash_attn.cute.block_info" if method.startswith("BlockInfo") else "flash_attn.cute.mask"
    assert f"{module}.{method}: params changed" in result.reason
    with pytest.raises(ValueError, match=re.escape(f"{module}.{method}: params changed")):
        fa4_adapter.check.cache_clear()
        try:
            fa4_adapter.require("FlashAttention-4 key-interval attention")
        finally:
            fa4_adapter.check.cache_clear()


def test_recorded_methods_are_read_on_their_class() -> None:
    """``_live`` reads "Class.method" off the class (not an attribute of the module called "Class.method")."""
    from swa_kernels.fa4_adapter import _live, described

    assert described(_live("fractions", "Fraction.limit_denominator"), "params") == ("self", "max_denominator")
    with pytest.raises(AttributeError):
        _live("fractions", "Fraction.no_such_method")
