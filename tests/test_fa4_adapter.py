"""FlashAttention-4 behind ``swa_kernels.fa4_adapter``: the recorded internals against FA4's own source
(``ast``, no import: a CPU and the pure-Python ``flash-attn-4`` wheel are enough), and every refusal.
"""

from __future__ import annotations

import ast
import importlib.metadata
import inspect
import logging
from pathlib import Path

import pytest

from swa_kernels import fa4_adapter
from swa_kernels.fa4_adapter import PINNED_VERSION, RECORDED, check, mismatches, replacement_preprocess


def source_of(module: str) -> Path | None:
    """The installed source file of ``module`` (flash-attn-4 or quack-kernels), found through the
    distributions' file lists: importing FA4 needs its CUDA compiler libraries."""
    relative = module.replace(".", "/")
    for dist in ("flash-attn-4", "quack-kernels"):
        try:
            files = importlib.metadata.files(dist) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in files:
            if str(f) in (f"{relative}.py", f"{relative}/__init__.py"):
                return Path(f.locate())
    return None


def ast_lookup(module: str, name: str):
    """``RECORDED``'s lookup over source: a function's parameters or a class's annotated fields, as stubs."""
    path = source_of(module)
    if path is None:
        raise ModuleNotFoundError(module)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    if not name:
        return tree
    body = tree.body
    if "." in name:  # "Class.method": the method in its class's body
        owner, name = name.split(".")
        body = next((n.body for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner), [])
    for node in body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            a = node.args
            names = [x.arg for x in a.posonlyargs + a.args] + [x.arg for x in a.kwonlyargs]
            return _stub_function(names)
        if isinstance(node, ast.ClassDef) and node.name == name:
            return _stub_dataclass(name, [s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)])
        if isinstance(node, ast.ImportFrom) and any(alias.name == name for alias in node.names):  # a class imported into interface
            return type(name, (), {})
    raise AttributeError(f"{module} has no {name}")


def _stub_function(names: list[str]):
    namespace: dict = {}
    exec(f"def f({', '.join(names)}): pass", namespace)  # same parameter names and order
    return namespace["f"]


def _stub_dataclass(name: str, field_names: list[str]):
    import dataclasses

    return dataclasses.make_dataclass(name, field_names)


FA4_INSTALLED = source_of("flash_attn.cute.interface") is not None


@pytest.mark.skipif(not FA4_INSTALLED, reason="flash-attn-4 not installed (pip install --no-deps flash-attn-4==4.0.0b36)")
def test_recorded_internals_match_the_installed_source() -> None:
    assert importlib.metadata.version("flash-attn-4") == PINNED_VERSION
    quack = source_of("quack.layout_utils") is not None
    wrong = [m for m in mismatches(ast_lookup) if quack or not m.startswith("quack")]
    assert not wrong, wrong


def test_a_changed_signature_is_reported_naming_the_entry() -> None:
    def lookup(module, name):
        if name == "_flash_attn_bwd":  # FA4 betas renamed and added parameters here 13 times
            return _stub_function(["q", "k", "v", "out", "dout", "lse", "softmax_scale", "causal", "window_size"])
        kind, expected = RECORDED[(module, name)]
        return _stub_function(list(expected)) if kind == "params" else _stub_dataclass(name or "m", list(expected))

    wrong = mismatches(lookup)
    assert len(wrong) == 1 and wrong[0].startswith("flash_attn.cute.interface._flash_attn_bwd: params changed"), wrong
    assert "'window_size'" in wrong[0] and "'window_size_left'" in wrong[0]


@pytest.fixture
def fresh_check(monkeypatch):
    check.cache_clear()
    monkeypatch.setattr(fa4_adapter, "_warned", False)
    yield
    check.cache_clear()


def test_another_version_is_refused_naming_both(monkeypatch, fresh_check, caplog) -> None:
    monkeypatch.setattr(fa4_adapter, "installed_version", lambda: "4.0.0b27")
    result = check()
    assert not result.ok and result.version == "4.0.0b27"
    assert "4.0.0b27" in result.reason and PINNED_VERSION in result.reason
    with pytest.raises(ValueError, match=r"trainer.attention_backend=fa4 needs FlashAttention-4 4.0.0b36: flash-attn-4 4.0.0b27 is installed"):
        fa4_adapter.require("trainer.attention_backend=fa4")
    # auto on a Hopper GPU: False, with one warning however often it is asked
    monkeypatch.setattr(fa4_adapter.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(fa4_adapter.torch.cuda, "get_device_capability", lambda *a: (9, 0))
    with caplog.at_level(logging.WARNING, logger="swa_kernels.fa4_adapter"):
        assert fa4_adapter.available() is False and fa4_adapter.available() is False
    warnings = [r for r in caplog.records if "FlashAttention-4 not used" in r.getMessage()]
    assert len(warnings) == 1 and "4.0.0b27" in warnings[0].getMessage()


def test_not_installed_is_quietly_unavailable(monkeypatch, fresh_check, caplog) -> None:
    monkeypatch.setattr(fa4_adapter, "installed_version", lambda: None)
    monkeypatch.setattr(fa4_adapter.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(fa4_adapter.torch.cuda, "get_device_capability", lambda *a: (9, 0))
    with caplog.at_level(logging.WARNING):
        assert fa4_adapter.available() is False
    assert not caplog.records
    with pytest.raises(ValueError, match="flash-attn-4 is not installed"):
        fa4_adapter.require("x")


def test_missing_cutlass_sources_name_the_package(monkeypatch, fresh_check) -> None:
    """FA4 installed without nvidia-cutlass-dsl-libs-core (a --no-deps install of the extra's wheels): the reason
    names the package that holds cutlass.cute; another import error gets no such hint."""
    monkeypatch.setattr(fa4_adapter, "installed_version", lambda: PINNED_VERSION)
    real = fa4_adapter.importlib.import_module

    def failing(error):
        def import_module(name, *args):
            if name == "flash_attn.cute.interface":
                raise error
            return real(name, *args)
        return import_module

    monkeypatch.setattr(fa4_adapter.importlib, "import_module", failing(ModuleNotFoundError("No module named 'cutlass'", name="cutlass")))
    result = check()
    assert not result.ok and "No module named 'cutlass'" in result.reason and "nvidia-cutlass-dsl-libs-core" in result.reason
    check.cache_clear()
    monkeypatch.setattr(fa4_adapter.importlib, "import_module", failing(ImportError("libcuda.so.1: cannot open shared object file")))
    result = check()
    assert not result.ok and "libcuda" in result.reason and "libs-core" not in result.reason


def test_no_patch_without_a_passing_check(monkeypatch, fresh_check) -> None:
    monkeypatch.setattr(fa4_adapter, "installed_version", lambda: "4.1.0")
    with pytest.raises(ValueError, match="4.1.0"):
        with fa4_adapter.swapped("a test", _bwd_preprocess=None):
            pass


def test_the_replaced_preprocess_takes_exactly_the_recorded_parameters() -> None:
    launched = []
    preprocess = replacement_preprocess(lambda *a: launched.append(a), tile_m=64)
    assert tuple(inspect.signature(preprocess).parameters) == RECORDED[("flash_attn.cute.interface", "_bwd_preprocess")][1]
    args = (None,) * 6 + (None, None, None, "bf16", 64, 64, 64)  # out .. dq_accum, no varlen, no dlse, dtype, dims, tile
    preprocess(*args, cu_total_m_blocks=None, hdim_multiple_of=32, fake_mode=False)  # FA4 4.0.0b36's call
    assert len(launched) == 1
    with pytest.raises(TypeError, match="new_option"):  # a parameter a newer FA4 might pass
        preprocess(*args, fake_mode=False, new_option=1)
    with pytest.raises(RuntimeError, match="row_max"):
        preprocess(*args, row_max=object(), fake_mode=False)
    with pytest.raises(RuntimeError, match="m_block_size=128"):
        preprocess(*args[:-1], 128, fake_mode=False)
    with pytest.raises(RuntimeError, match="fake_mode"):
        preprocess(*args, fake_mode=True)
    assert len(launched) == 1


@pytest.mark.skipif(not FA4_INSTALLED, reason="flash-attn-4 not installed (pip install --no-deps flash-attn-4==4.0.0b36)")
def test_the_persistent_cache_switch_is_fa4s() -> None:
    """FA4 turns its on-disk kernel cache on with the variable ``fa4_adapter`` reads (its default off, on at "1")."""
    source = source_of("flash_attn.cute.cache_utils").read_text(encoding="utf-8")
    assert f'os.getenv("{fa4_adapter.PERSISTENT_CACHE_ENV}", "0") == "1"' in source


def test_key_intervals_refuse_fa4s_persistent_cache(monkeypatch, caplog) -> None:
    """With FA4's persistent cache on, the patched key-interval kernels refuse (a one-line error naming the variable), an
    explicit trainer.attention_backend=fa4 fails at DFlash's start-up, and auto takes flex-flash with a warning; with it
    off, auto takes fa4 (on a Hopper GPU, FA4 usable: both faked here)."""
    from types import SimpleNamespace

    import torch

    from train import dflash

    monkeypatch.setattr(dflash, "fa4_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    drafter = SimpleNamespace(config=SimpleNamespace(head_dim=64))
    env = fa4_adapter.PERSISTENT_CACHE_ENV
    monkeypatch.delenv(env, raising=False)
    fa4_adapter.refuse_persistent_cache("key intervals")
    assert dflash.fastest_gpu_backend(None, drafter) == "fa4"
    monkeypatch.setenv(env, "0")
    assert dflash.fastest_gpu_backend(None, drafter) == "fa4"

    monkeypatch.setenv(env, "1")
    with pytest.raises(ValueError, match=env) as error:
        fa4_adapter.refuse_persistent_cache("key intervals")
    assert "\n" not in str(error.value)
    with caplog.at_level(logging.WARNING):
        assert dflash.fastest_gpu_backend(None, drafter) == "flex-flash"
    assert env in caplog.text
    ctx = SimpleNamespace(cfg=None, backend="fa4", device=torch.device("cpu"))
    with pytest.raises(ValueError, match="trainer.attention_backend=fa4"):
        dflash.DFlashStep(ctx, drafter)
