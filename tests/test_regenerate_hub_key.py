"""The regenerated replies' cache key of a target given as a hub id: it held the id alone, so a new revision behind the
same id reused the old revision's replies; it holds the cached snapshot's revision and files now, as a local folder's."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest


HUB_ID = "swa-test-org/tiny-target"


def snapshot(cache: Path, revision: str, files: dict[str, bytes]) -> Path:
    """The hub cache's layout of ``HUB_ID`` at ``revision`` (blobs, a snapshot of links to them) and refs/main -> it."""
    repo = cache / ("models--" + HUB_ID.replace("/", "--"))
    folder = repo / "snapshots" / revision
    folder.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for name, data in files.items():
        blob = repo / "blobs" / f"{revision}-{name}"
        blob.write_bytes(data)
        (folder / name).symlink_to(os.path.relpath(blob, folder))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return folder


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    """An empty hub cache of this test's own, offline: nothing asks the network."""
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))  # read at import: the env var is too late
    return cache


def regen_cache_key(tmp_path: Path) -> str:
    """The regenerated file's cache key (``train.data.regenerated_key``) for a target named ``HUB_ID``, ``vllm``'s (no
    model in this process), on a source file written once (its time is in the key too)."""
    from train.config import DataConfig, RegenerateConfig
    from train.data import regenerated_key
    from train.data.dataset import cache_key

    source = tmp_path / "rows.jsonl"
    if not source.exists():
        source.write_text('{"conversations": []}\n')
    cfg = DataConfig(path=str(source), regenerate=RegenerateConfig(enabled=True, engine="vllm"))
    target = SimpleNamespace(path=HUB_ID)
    return cache_key(regenerated_key(cfg, target, SimpleNamespace(template="{{ messages }}"), str(source)))


def test_a_new_revision_behind_a_hub_id_gets_its_own_regenerated_key(hub_cache, tmp_path) -> None:
    from train.data.regenerate import target_fingerprint

    snapshot(hub_cache, "a" * 40, {"config.json": b'{"hidden_size": 64}', "model.safetensors": b"old weights"})
    old = regen_cache_key(tmp_path)
    assert regen_cache_key(tmp_path) == old  # the same snapshot: the same file of replies

    snapshot(hub_cache, "b" * 40, {"config.json": b'{"hidden_size": 64}', "model.safetensors": b"new weights, longer"})
    new = regen_cache_key(tmp_path)  # refs/main names the new revision: what from_pretrained(HUB_ID) loads now
    assert new != old
    assert regen_cache_key(tmp_path) == new
    assert target_fingerprint(HUB_ID) == [HUB_ID, "b" * 40]  # the id and the revision (its commit hash)


def test_more_files_fetched_into_the_same_snapshot_keep_the_key(hub_cache, tmp_path) -> None:
    """The revision fixes every file's content: a README another tool fetches into the same snapshot later, or a copy of
    the cache with new modification times, must not make hours of regenerated replies stale."""
    folder = snapshot(hub_cache, "c" * 40, {"config.json": b"{}", "model.safetensors": b"weights"})
    before = regen_cache_key(tmp_path)
    blob = folder.parent.parent / "blobs" / "readme"
    blob.write_bytes(b"# a model card")
    (folder / "README.md").symlink_to(blob)
    assert regen_cache_key(tmp_path) == before


def test_a_hub_id_missing_from_the_cache_is_keyed_by_name_with_a_warning(hub_cache, caplog) -> None:
    from train.data.regenerate import target_fingerprint

    with caplog.at_level(logging.WARNING, logger="train.data.regenerate"):
        assert target_fingerprint(HUB_ID) == [HUB_ID]
    assert any(HUB_ID in r.getMessage() and "new revision" in r.getMessage() for r in caplog.records), caplog.text


def test_a_local_folders_key_is_unchanged(tmp_path) -> None:
    """Local targets keep their key (files' name, size, time): their regenerated files stay valid."""
    from train.data.regenerate import target_fingerprint

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"w" * 10)
    (tmp_path / "sub").mkdir()
    assert target_fingerprint(str(tmp_path)) == [(f.name, f.stat().st_size, f.stat().st_mtime_ns)
                                                 for f in sorted(tmp_path.iterdir()) if f.is_file()]
    assert target_fingerprint("/no/such/target") == ["/no/such/target"]  # no hub id, no folder: the name, as before
