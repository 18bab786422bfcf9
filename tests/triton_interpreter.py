"""Triton kernels on the CPU: Triton's interpreter reads ``TRITON_INTERPRET`` when a kernel is defined, so a test runs
its script in a fresh Python with the variable set (the interpreter has fp32 and fp16, no bf16: those run on a GPU)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_interpreted(script: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python -c script`` from the repository root under Triton's interpreter; stdout and stderr captured as text."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
