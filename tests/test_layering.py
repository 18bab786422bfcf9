"""The package graph, read with ``ast`` only (nothing is imported): who may import whom.

    common   <- everything (atomic writes, the metrics sink); imports no project package
    swa_kernels  <- models, train (attention kernels); imports no project package
    models   <- infer, eval, train (the drafters and the target, shared by training and inference)
    infer    <- eval, train (the decoding loop; train's loop evaluation runs it)
    eval     <- nobody
    train    <- nobody: infer/ and eval/ never import train/ (issue: "one house")

Function-level imports count as much as module-level ones: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = {"common", "swa_kernels", "models", "infer", "eval", "train", "configs", "benchmarks"}
ALLOWED = {
    "common": set(),
    "swa_kernels": set(),
    "models": {"swa_kernels", "common"},
    "infer": {"models", "swa_kernels", "common"},
    "eval": {"infer", "models", "swa_kernels", "common"},
    "train": {"infer", "models", "swa_kernels", "common", "configs"},
}


def imported_packages(source: str, package: str) -> set[str]:
    """Top-level project packages a module's source imports (relative imports stay in ``package``)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [package] if node.level else [node.module or ""]
        else:
            continue
        found |= {name.split(".")[0] for name in names} & PROJECT
    return found - {package}


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_what_its_layer_allows(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"{package}/ has no Python files"
    bad = {}
    for path in files:
        extra = imported_packages(path.read_text(encoding="utf-8"), package) - ALLOWED[package]
        if extra:
            bad[str(path.relative_to(ROOT))] = sorted(extra)
    assert not bad, f"imports across the layering: {bad}"


def test_the_checker_sees_every_import_form() -> None:
    source = "import train.trainer\nfrom train.x import y\ndef f():\n    from eval import runner\nfrom . import sibling\nimport torch\n"
    assert imported_packages(source, "infer") == {"train", "eval"}
    assert imported_packages("from .dflash import x\nfrom ..config import y\n", "train") == set()
