"""The CLIs' help: a default named once, none for flags or unset options (common/cli_help.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def help_text(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", *args, "--help"], capture_output=True, text=True, cwd=REPO, env={"COLUMNS": "400", "PATH": ""})
    assert out.returncode == 0, out.stderr
    return " ".join(out.stdout.split())


def test_defaults_are_shown_once_and_not_for_flags() -> None:
    eval_help = help_text("eval", "mtbench")
    assert "(default: None)" not in eval_help and "(default: True)" not in eval_help and "(default: False)" not in eval_help
    assert "--window WINDOW drafter window at inference: trained | none | W (default: trained)" in eval_help
    assert eval_help.count("(default: the newest run under --runs-dir)") == 1
    infer_help = help_text("infer")
    assert "(default: None)" not in infer_help and "(default: the target recorded in --drafter's run folder)" in infer_help
    assert "--device DEVICE" in infer_help and "(default: auto)" in infer_help  # a value's default still shown
