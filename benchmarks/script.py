"""What the benchmark scripts share as scripts: bad input answered in one line, not a traceback.

Each script makes the repository importable with one line before its project imports (run as
``python benchmarks/NAME.py`` from anywhere, no ``PYTHONPATH``), then ends with ``run_main(main)``:

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.script import run_main  # noqa: E402
    ...
    if __name__ == "__main__":
        run_main(main)
"""

from __future__ import annotations

import sys
from typing import Any, Callable


def run_main(main: Callable[[], Any]) -> None:
    """``main()``; bad input (a flag, a missing or malformed file: ValueError, OSError) ends the script with one line,
    ``error: ...`` on stderr, and exit status 1."""
    try:
        main()
    except (ValueError, OSError) as e:
        sys.exit(f"error: {e}")
