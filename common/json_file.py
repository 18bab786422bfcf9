"""One JSON object read from a file the user handed us (a config, a run record, a store's spec), or one error line
naming the file: what is wrong with it, then what was expected there."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any


def read_json_object(path: str | Path, expected: str = "an object", error: type[ValueError] = ValueError) -> dict[str, Any]:
    """``path``'s JSON object; not JSON, or JSON but not an object: ``error(f"{path}: ...; expected {expected}")``."""
    try:
        data = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{path}: not valid JSON ({e}); expected {expected}") from None
    if not isinstance(data, dict):
        raise error(f"{path}: a JSON {type(data).__name__}; expected {expected}")
    return data


def read_eval_text(path: str | Path) -> str:
    """An eval output's text (a results file, a sweep cell, a partial file), gunzipped where its name ends in .gz
    (committed result folders keep them so: benchmarks/results/*)."""
    path = Path(path)
    return (gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()).decode("utf-8")
