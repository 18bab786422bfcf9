"""Every benchmark script answers ``python benchmarks/NAME.py --help`` from the repository root without ``PYTHONPATH``
(four imported the project with no ``sys.path`` line; ``row_stats_speed`` exited 1 on ``--help`` without CUDA), and
bad input ends a script in one line through one helper, ``benchmarks/script.py``'s ``run_main``."""


from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.name for p in (REPO / "benchmarks").glob("*.py"))
PER_SCRIPT_TIMEOUT_S = 120


def clean_env() -> dict[str, str]:
    """This process's environment without PYTHONPATH: a user's shell at the repository root."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


# Runs in a fresh interpreter (no PYTHONPATH, cwd the repo root): imports the heavy third-party packages once, then per
# script forks a child that runs it as ``python benchmarks/NAME.py --help`` would (``__main__``, argv, and sys.path[0] the
# script's folder, not the root), so 47 scripts cost one torch + transformers import, not 47 (~130 CPU-s on 2 cores).
# Prints one line per script, ``<exit code> <name>``; each child's output goes to OUT_DIR/<name>.log.
FORKED_HELP = r"""
import os, runpy, sys, time, traceback
root, out_dir, jobs, timeout = os.getcwd(), sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
sys.path[:] = [p for p in sys.path if p not in ("", root)]  # -c put the cwd (the root) first: the scripts must not see it
import torch, transformers.models.qwen3.modeling_qwen3, transformers.models.llama.modeling_llama  # noqa: E401,F401
import torch.nn.attention.flex_attention, safetensors.torch  # noqa: E401,F401  (third-party only: the children fork with them)
try:
    import triton  # noqa: F401
except ImportError:
    pass
ours = sorted(n for n, m in list(sys.modules.items()) if str(getattr(m, "__file__", None) or "").startswith(root + os.sep))
assert not ours, f"the driver imported project modules: {ours}"

def child(script):
    fd = os.open(os.path.join(out_dir, os.path.basename(script) + ".log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1), os.dup2(fd, 2)
    sys.argv = [script, "--help"]
    sys.path.insert(0, os.path.dirname(os.path.realpath(script)))
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:  # as the interpreter maps it: None 0, an int itself, anything else printed and 1
        if isinstance(e.code, int):
            code = e.code
        elif e.code is not None:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(code)

todo, running = list(sys.argv[4:]), {}
while todo or running:
    while todo and len(running) < jobs:
        script = todo.pop(0)
        pid = os.fork()
        if pid == 0:
            child(script)
        running[pid] = (script, time.monotonic())
    pid, status = os.waitpid(-1, os.WNOHANG)
    if pid:
        script, _ = running.pop(pid)
        print(os.waitstatus_to_exitcode(status), os.path.basename(script), flush=True)
        continue
    for pid, (script, start) in list(running.items()):
        if time.monotonic() - start > timeout:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            running.pop(pid)
            print("timeout", os.path.basename(script), flush=True)
    time.sleep(0.02)
"""


@pytest.mark.slow
def test_every_benchmark_script_answers_help_without_pythonpath(tmp_path) -> None:
    """``python benchmarks/NAME.py --help`` exits 0 for every script, run from the repository root with no PYTHONPATH
    (forked from one interpreter that imported torch and transformers: see FORKED_HELP). Failed before the fix:
    engines_side_by_side, profile_regen, regen_engines, regen_vs_loop (ModuleNotFoundError), row_stats_speed (exit 1)."""
    jobs = max(2, min(4, os.cpu_count() or 2))
    out = subprocess.run([sys.executable, "-c", FORKED_HELP, str(tmp_path), str(jobs), str(PER_SCRIPT_TIMEOUT_S),
                          *(f"benchmarks/{name}" for name in SCRIPTS)],
                         cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    codes = {name: code for code, name in (line.split(" ", 1) for line in out.stdout.splitlines())}
    assert sorted(codes) == SCRIPTS, out.stdout
    failed = {name: code for name, code in codes.items() if code != "0"}
    logs = {name: (tmp_path / f"{name}.log").read_text()[-1500:] for name in failed}
    assert not failed, f"--help failed (exit code per script): {failed}\n" + "\n".join(f"== {n}\n{t}" for n, t in logs.items())


@pytest.mark.long
@pytest.mark.parametrize("name", SCRIPTS)
def test_benchmark_script_help_in_its_own_interpreter(name: str) -> None:
    """The same, literally: one ``python benchmarks/NAME.py --help`` per script (~130 CPU-s for all on 2 cores)."""
    out = subprocess.run([sys.executable, f"benchmarks/{name}", "--help"], cwd=REPO, env=clean_env(), capture_output=True,
                         text=True, timeout=PER_SCRIPT_TIMEOUT_S)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-2000:]


def test_run_main_answers_bad_input_in_one_line(capsys) -> None:
    from benchmarks.script import run_main

    def bad() -> None:
        raise ValueError("--questions -1; expected a number >= 1")

    with pytest.raises(SystemExit) as exit_info:
        run_main(bad)
    assert exit_info.value.code == "error: --questions -1; expected a number >= 1"  # sys.exit(str): stderr, status 1
    with pytest.raises(SystemExit, match="error: .*no/such/file"):
        run_main(lambda: open("/no/such/file"))
    with pytest.raises(KeyError):  # a bug, not bad input: the traceback stays
        run_main(lambda: {}["x"])
    ran = []
    run_main(lambda: ran.append(1))
    assert ran == [1]


def test_no_benchmark_script_repeats_the_error_block() -> None:
    repeated = [name for name in SCRIPTS if name != "script.py"
                and "except (ValueError, OSError) as e:" in (REPO / "benchmarks" / name).read_text()]
    assert not repeated, repeated


