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


def record_fsyncs(monkeypatch, atomic) -> list[tuple[str, str]]:
    """os.fsync (each call named by the path its descriptor has) and os.replace, in the order they run."""
    calls: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst):
        calls.append(("replace", str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    monkeypatch.setattr(atomic.os, "replace", replace)
    return calls


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names a descriptor's path through /proc (Linux)")
def test_what_is_written_is_fsynced_before_its_rename_and_the_rename_after(tmp_path: Path, monkeypatch) -> None:
    """A rename is journalled on its own: without an fsync of the data first, a crash of the machine soon after could
    leave a complete-looking name over an empty or cut file (a regenerated-replies cache of hours, a feature store's
    shard, an export). Then the folder holding the new name is fsynced, so the rename itself lasts."""
    import common.atomic as atomic

    calls = record_fsyncs(monkeypatch, atomic)
    with atomic_open(tmp_path / "cache.jsonl") as f:
        f.write("{}\n")
    (kind, written), replaced, after = calls
    assert kind == "fsync" and Path(written).name.startswith(".cache.jsonl.") and replaced == ("replace", str(tmp_path / "cache.jsonl"))
    assert after == ("fsync", str(tmp_path))

    calls.clear()
    with atomic_dir(tmp_path / "export") as tmp:
        (tmp / "sub").mkdir()
        (tmp / "sub" / "weights.bin").write_bytes(b"w")
        (tmp / "config.json").write_text("{}")
    rename = calls.index(("replace", str(tmp_path / "export")))
    synced = {Path(p).name for _, p in calls[:rename]}
    assert {"weights.bin", "config.json", "sub"} <= synced and Path(calls[rename - 1][1]).name.startswith(".export.")
    assert calls[rename + 1:] == [("fsync", str(tmp_path))]


@pytest.mark.parametrize("replace", [False, True])
def test_a_folder_landing_between_the_check_and_the_rename_is_treated_as_there_before(tmp_path: Path, monkeypatch, replace) -> None:
    """Two runs tokenizing the same data at once (the small-target pipeline's DFlash and EAGLE-3): both found no cache
    folder, the first renamed its folder into place, and the second's rename failed with "Directory not empty" (an
    OSError out of the run). Now the second keeps the first's (``replace=False``) or puts its own in place."""
    import common.atomic as atomic

    real, raced = os.replace, []

    def other_writer_first(src, dst):
        if Path(dst) == tmp_path / "cache" and not raced:  # the concurrent run wins the race, once
            raced.append(dst)
            (tmp_path / "cache").mkdir()
            (tmp_path / "cache" / "theirs.bin").write_text("theirs")
        real(src, dst)

    monkeypatch.setattr(atomic.os, "replace", other_writer_first)
    with atomic_dir(tmp_path / "cache", replace=replace) as tmp:
        (tmp / "ours.bin").write_text("ours")
    assert [p.name for p in (tmp_path / "cache").iterdir()] == (["ours.bin"] if replace else ["theirs.bin"])
    assert [p.name for p in tmp_path.iterdir()] == ["cache"]  # nothing hidden left behind
