"""A file's sha256, read in chunks (feature-store shards, the SmolLM2 GGUF)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: Path | str, chunk: int = 1 << 24) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
