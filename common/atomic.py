"""Atomic writes: build under a hidden temporary name beside the target, then rename.

Whatever is killed half-way leaves only a hidden ``.name.*`` leftover, never a file or folder that
looks complete (caches, checkpoints and exports are all trusted by their name alone). What was written is
fsynced before the rename and the rename after it: a rename is journalled on its own, so without it a crash
of the machine soon after could leave a complete-looking name over empty or cut data.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_file(path: Path) -> None:
    """Flush a written file's data to the disk (``os.fsync``), before the rename that makes it look complete."""
    fd = os.open(path, os.O_RDWR if os.name == "nt" else os.O_RDONLY)  # Windows' fsync (_commit) needs a writable handle
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries (the names made or renamed in it) to the disk, where the platform allows it: POSIX opens a
    folder read-only and fsyncs it; Windows cannot open one (and some filesystems refuse the fsync), which is skipped."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_tree(folder: Path) -> None:
    """Every file under ``folder``, then its folders (deepest first): what a save wrote, on the disk before its rename."""
    folder = Path(folder)
    for file in sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()):
        fsync_file(file)
    for sub in sorted((p for p in folder.rglob("*") if p.is_dir() and not p.is_symlink()), key=lambda p: -len(p.parts)):
        fsync_dir(sub)
    fsync_dir(folder)


@contextmanager
def atomic_dir(final: Path, replace: bool = True) -> Iterator[Path]:
    """Yield an empty temporary folder; on success it becomes ``final``.

    With ``replace=False`` an existing ``final`` (a concurrent writer that finished first) is kept.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        yield tmp
        # mkdtemp makes 0700, and files written through mkstemp (safetensors' save_file, atomic_open) 0600: give the folder
        # and what it holds normal permissions, so a server running as another user can read an export
        mask = _umask()
        for inner in tmp.rglob("*"):
            if not inner.is_symlink():
                os.chmod(inner, (0o777 if inner.is_dir() else 0o666) & ~mask)
        os.chmod(tmp, 0o777 & ~mask)
        fsync_tree(tmp)
        if not final.exists():
            try:
                os.replace(tmp, final)
                fsync_dir(final.parent)
                return
            except OSError as e:  # a concurrent writer's folder landed between the check and the rename: as if it were there
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not final.exists():
                    raise
        if not replace:
            return
        # moved aside under a hidden name, deleted after the new one is in place: a kill between the two renames
        # leaves the old folder as a hidden leftover, not lost (deleted first, a kill lost it)
        aside = Path(tempfile.mkdtemp(prefix=f".{final.name}.replaced.", dir=final.parent))
        os.replace(final, aside)  # onto the empty folder mkdtemp made: a rename, never a copy
        os.replace(tmp, final)
        fsync_dir(final.parent)
        shutil.rmtree(aside, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def atomic_open(final: Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temporary file for writing; on success it replaces ``final``."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", dir=final.parent)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600
        os.replace(tmp, final)
        fsync_dir(final.parent)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def unwritable_reason(path: str | Path) -> str | None:
    """Why ``path`` (a file or a folder to be written, with any parents still to be made) cannot be written, or None: its
    nearest existing ancestor must be a folder a file can be made in. Probed by making (and removing) a hidden temporary
    file there: ``os.access`` says yes to root everywhere, /proc included, where the write then fails."""
    path = Path(path)
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is path and path.is_file():
        existing = path.parent  # a file to be replaced: its folder is what must be writable
    if existing is None or not existing.is_dir():
        return f"{existing} is a file, where a folder is needed"
    try:
        fd, probe = tempfile.mkstemp(prefix=".write-probe.", dir=existing)
    except OSError as e:
        return f"nothing can be written in {existing} ({e.strerror or e})"
    os.close(fd)
    os.unlink(probe)
    return None
