"""Packaging: the extras pin nothing below what the core needs.

``pip install -e ".[dev]"`` once downgraded datasets 5.2 -> 5.0.1, fsspec and huggingface_hub: the
``dev`` extra named z-lab's ``dflash==0.1.0``, which pins ``datasets==5.0.1`` exactly. Such packages
are installed ``--no-deps`` by the test command instead. This reads pyproject.toml and the installed
packages' own metadata (what pip resolves against), so adding one back fails here."""

from __future__ import annotations

import importlib.metadata as metadata
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def name_of(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def upper_bounded(requirement: str) -> bool:
    """An exact pin or an upper bound (``==``, ``<``, ``<=``, ``~=``) outside any environment marker."""
    spec = requirement.split(";")[0]
    return bool(re.search(r"(==|<=|<(?!=)|~=)", spec))


CORE = {name_of(r) for r in PROJECT["dependencies"]}


def test_no_extra_caps_a_core_dependency() -> None:
    capped = {extra: [r for r in reqs if name_of(r) in CORE and upper_bounded(r)] for extra, reqs in PROJECT["optional-dependencies"].items()}
    assert not any(capped.values()), capped


@pytest.mark.parametrize("extra", ["dev"])
def test_packages_of_an_extra_pin_no_core_dependency(extra: str) -> None:
    """Each installed package of the extra, read from its own metadata: an exact pin of a core dependency
    (dflash's ``datasets==5.0.1``) is what downgrades an environment."""
    bad = {}
    for requirement in PROJECT["optional-dependencies"][extra]:
        try:
            requires = metadata.requires(name_of(requirement)) or []
        except metadata.PackageNotFoundError:
            continue
        pins = [r for r in requires if "extra ==" not in r and name_of(r) in CORE and "==" in r.split(";")[0]]
        if pins:
            bad[name_of(requirement)] = pins
    assert not bad, f"packages of [{extra}] pin core dependencies exactly (install them --no-deps in the test command): {bad}"


def test_the_checks_see_a_pin() -> None:
    assert upper_bounded("datasets==5.0.1") and upper_bounded("fsspec<=2026.6.0") and not upper_bounded("torch>=2.5")
    assert not upper_bounded('jinja2>=3.1; python_version < "3.12"')
    assert name_of("huggingface_hub[cli]>=1.0") == "huggingface-hub"


def test_readme_installs_the_pinning_packages_without_their_dependencies() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "pip install --no-deps speculators==0.9.0 hs-connectors==0.9.0 dflash==0.1.0 flash-attn-4==4.0.0b36" in readme


def test_every_data_file_read_at_run_time_ships_in_the_wheel() -> None:
    """The files the code reads from beside itself (MT-Bench's questions, the bundled ShareGPT sample, the tiny target's
    weights, the configs) are matched by ``[tool.setuptools.package-data]``: an installed (non-editable) package
    without MT-Bench failed ``python -m eval mtbench`` with a FileNotFoundError."""
    from infer.prompts import MT_BENCH

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    read = [MT_BENCH, *sorted((ROOT / "train" / "data" / "samples").glob("*.jsonl")),
            *sorted((ROOT / "models" / "builtin_weights").glob("*.safetensors")), ROOT / "configs" / "train.yaml"]
    assert MT_BENCH.is_file() and len(read) >= 4
    for path in read:
        package, rest = path.relative_to(ROOT).parts[0], Path(*path.relative_to(ROOT).parts[1:])
        assert any(rest.match(glob) for glob in data.get(package, [])), f"{path.relative_to(ROOT)} is not in the wheel"
