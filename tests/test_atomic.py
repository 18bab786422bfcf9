"""Atomic writes: a failure leaves nothing that looks complete; success leaves normal permissions."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from common.atomic import atomic_dir, atomic_open


def test_failed_write_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        with atomic_dir(tmp_path / "export") as tmp:
            (tmp / "config.json").write_text("{}")
            raise RuntimeError("killed half-way")
    with pytest.raises(RuntimeError):
        with atomic_open(tmp_path / "run.json") as f:
            f.write("{")
            raise RuntimeError("killed half-way")
    assert list(tmp_path.iterdir()) == []


def test_success_replaces_and_uses_umask_permissions(tmp_path: Path) -> None:
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "old.bin").write_text("old")
    with atomic_dir(tmp_path / "export") as tmp:
        (tmp / "new.bin").write_text("new")
    assert [p.name for p in (tmp_path / "export").iterdir()] == ["new.bin"]
    with atomic_open(tmp_path / "run.json") as f:
        f.write("{}")
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "export").stat().st_mode & 0o777 == 0o777 & ~umask
    assert (tmp_path / "run.json").stat().st_mode & 0o777 == 0o666 & ~umask
    # replace=False keeps what a concurrent writer finished first
    with atomic_dir(tmp_path / "export", replace=False) as tmp:
        (tmp / "other.bin").write_text("x")
    assert [p.name for p in (tmp_path / "export").iterdir()] == ["new.bin"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "run.json"]  # nothing hidden left behind


def test_a_kill_while_replacing_keeps_the_old_folder(tmp_path: Path, monkeypatch) -> None:
    """Replacing a folder moves the old one aside before the new one goes in: a kill between the two renames (the
    second one raising here) leaves the old content under a hidden name, where deleting it first lost it."""
    import common.atomic as atomic

    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "old.bin").write_text("old")
    renames = []
    real = os.replace

    def killed_on_the_second(src, dst):
        renames.append((src, dst))
        if len(renames) == 2:
            raise KeyboardInterrupt
        real(src, dst)

    monkeypatch.setattr(atomic.os, "replace", killed_on_the_second)
    with pytest.raises(KeyboardInterrupt):
        with atomic_dir(tmp_path / "export") as tmp:
            (tmp / "new.bin").write_text("new")
    kept = [p for p in tmp_path.iterdir() if p.name.startswith(".export.replaced.")]
    assert len(kept) == 1 and (kept[0] / "old.bin").read_text() == "old"
