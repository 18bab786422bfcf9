"""``trainer.compile_cache`` (train/compile_cache.py): torch.compile's artifacts carried to a fresh machine.

The reference is torch's own counters in a fresh process whose Inductor cache folder is empty: with the file loaded its
compile is served from the carried artifacts (cache hits, no misses), without it the same compile misses; and the
compiled function's result equals the eager one. CPU Inductor here; the trainer uses it for its GPU compiles.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from train.compile_cache import MAGIC, CompileCache, CompileCacheError, environment, rank_path

REPO = Path(__file__).resolve().parents[1]

# one process with an empty Inductor cache folder: load the cache file (if asked), compile a small function with its
# backward, save the file (if asked), print torch's cache counters and whether the result equals eager
PROGRAM = """
import json, sys, torch
from torch._dynamo.utils import counters
from train.compile_cache import CompileCache
cache = CompileCache(sys.argv[1], torch.device("cpu"))
loaded = cache.load() if "load" in sys.argv[2] else 0
def f(x, w):
    return torch.nn.functional.gelu(x @ w).square().sum()
x, w = torch.randn(32, 48, generator=torch.Generator().manual_seed(0)), torch.randn(48, 16, generator=torch.Generator().manual_seed(1))
xc = x.clone().requires_grad_()
got = torch.compile(f)(xc, w)
got.backward()
xe = x.clone().requires_grad_()
want = f(xe, w)
want.backward()
saved = cache.save() if "save" in sys.argv[2] else 0
again = 0
if "second" in sys.argv[2]:  # a later compile and a second save: the file must keep the first function's graphs
    torch.compile(lambda y: torch.tanh(y).mul(3).sum())(torch.randn(8, 8).requires_grad_()).backward()
    again = cache.save()
print(json.dumps({"loaded": loaded, "saved": saved, "again": again, "inductor": dict(counters["inductor"]), "aot": dict(counters["aot_autograd"]),
                  "equal": bool(torch.allclose(got, want, rtol=1e-5, atol=1e-5) and torch.allclose(xc.grad, xe.grad, rtol=1e-5, atol=1e-5))}))
"""


def run_fresh(tmp_path: Path, name: str, cache_file: Path, actions: str) -> dict:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / f"inductor_{name}"),
           "TRITON_CACHE_DIR": str(tmp_path / f"triton_{name}"), "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", PROGRAM, str(cache_file), actions], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_fresh_process_compiles_from_the_carried_file_and_one_without_it_compiles_cold(tmp_path: Path) -> None:
    cache_file = tmp_path / "carried" / "compile_cache.bin"
    first = run_fresh(tmp_path, "first", cache_file, "load,save,second")
    assert first["equal"] and first["loaded"] == 0 and first["saved"] > 0 and first["inductor"].get("fxgraph_cache_miss", 0) > 0
    assert first["again"] == 0  # saved once a process: torch's loader keeps one block per kind, a second save's
    assert cache_file.read_bytes().startswith(MAGIC)
    carried = run_fresh(tmp_path, "carried", cache_file, "load,save")
    assert carried["equal"] and carried["loaded"] > 0
    assert carried["inductor"].get("fxgraph_cache_hit", 0) > 0 and carried["inductor"].get("fxgraph_cache_miss", 0) == 0, carried
    assert carried["aot"].get("autograd_cache_hit", 0) > 0, carried
    cold = run_fresh(tmp_path, "cold", cache_file, "")  # the same empty cache folder, the file not loaded: it compiles
    assert cold["equal"] and cold["inductor"].get("fxgraph_cache_miss", 0) > 0 and cold["inductor"].get("fxgraph_cache_hit", 0) == 0
    # the carried run's own save rewrote the file with what it used: a third fresh process still compiles from it
    again = run_fresh(tmp_path, "again", cache_file, "load")
    assert again["inductor"].get("fxgraph_cache_miss", 0) == 0 and again["inductor"].get("fxgraph_cache_hit", 0) > 0


def written(path: Path, header: dict, payload: bytes) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(MAGIC + len(raw).to_bytes(8, "little") + raw + payload)
    return path


def test_a_file_it_did_not_write_fails_in_one_line_naming_it(tmp_path: Path) -> None:
    cpu = torch.device("cpu")
    other = tmp_path / "weights.safetensors"
    other.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    with pytest.raises(CompileCacheError, match=r"trainer.compile_cache='.*weights.safetensors': not a compile cache \(16 bytes, no header\)"):
        CompileCache(other, cpu).load()
    cut = written(tmp_path / "cut.bin", {"environment": environment(cpu), "bytes": 100}, b"x" * 40)
    with pytest.raises(CompileCacheError, match=r"cut short \(40 bytes of artifacts, the header says 100\)"):
        CompileCache(cut, cpu).load()
    bad_header = tmp_path / "bad.bin"
    bad_header.write_bytes(MAGIC + (5).to_bytes(8, "little") + b"{nope" + b"x")
    with pytest.raises(CompileCacheError, match="unreadable header"):
        CompileCache(bad_header, cpu).load()


def test_a_file_from_other_versions_is_skipped_loudly_not_loaded(tmp_path: Path, caplog) -> None:
    cpu = torch.device("cpu")
    elsewhere = {**environment(cpu), "torch": "2.0.0", "gpu": "NVIDIA A100-SXM4-80GB"}
    path = written(tmp_path / "old.bin", {"environment": elsewhere, "bytes": 3}, b"abc")  # not torch's bytes: never read
    with caplog.at_level(logging.WARNING, logger="train.compile_cache"):
        assert CompileCache(path, cpu).load() == 0
    assert "compiling cold (the file is rewritten)" in caplog.text and "2.0.0" in caplog.text
    assert CompileCache(tmp_path / "missing.bin", cpu).load() == 0 and not (tmp_path / "missing.bin").exists()
    assert CompileCache(None, cpu).load() == 0 and CompileCache(None, cpu).save() == 0


def test_the_trainer_refuses_a_bad_cache_file_before_the_target_loads(tmp_path: Path) -> None:
    bad = tmp_path / "cache.bin"
    bad.write_text("not a cache")
    proc = subprocess.run([sys.executable, "-m", "train", "experiment=dflash_swa_tiny", f"trainer.compile_cache={bad}",
                           f"output_dir={tmp_path / 'run'}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    output = proc.stdout + proc.stderr  # Hydra's log handler writes to stdout
    errors = [line for line in output.splitlines() if "[ERROR]" in line]
    assert len(errors) == 1 and errors[0].endswith(f"trainer.compile_cache={str(bad)!r}: not a compile cache (11 bytes, no header); "
                                                   "expected a file trainer.compile_cache wrote, or a path that does not exist yet")
    assert "target" not in output and not (tmp_path / "run").exists()  # refused before the target loaded
    assert bad.read_text() == "not a cache"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the trainer compiles on GPUs only)")
def test_on_cuda_the_trainer_saves_its_compiled_step_for_the_next_run(tmp_path: Path) -> None:
    from compose import compose_train
    from train.compile_cache import read
    from train.trainer import train

    cache_file = tmp_path / "cache" / "eagle3.bin"
    common = ["experiment=eagle3_swa_tiny", "trainer.max_steps=2", "trainer.progress=false", "data.num_eval=0", "trainer.loop_eval_prompts=0",
              f"trainer.compile_cache={cache_file}"]
    train(compose_train(common + [f"output_dir={tmp_path / 'first'}"]))
    header, payload = read(cache_file)
    assert header["environment"] == environment(torch.device("cuda")) and len(payload) == header["bytes"] > 0



def test_a_folder_or_an_unwritable_path_is_refused_at_start(tmp_path: Path) -> None:
    cpu = torch.device("cpu")
    with pytest.raises(CompileCacheError, match=r"trainer.compile_cache='.*': a folder; expected a file path"):
        CompileCache(tmp_path, cpu)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CompileCacheError, match=r"is a file, where a folder is needed; expected a path the compiled artifacts"):
        CompileCache(blocker / "cache.bin", cpu)


def test_caches_turned_off_are_said_and_nothing_is_saved(tmp_path: Path, caplog) -> None:
    import torch._inductor.config as inductor_config

    # the config module's own patch (monkeypatch's undo deleted the setting: every later compile in the process failed)
    with inductor_config.patch(fx_graph_cache=False), caplog.at_level(logging.WARNING, logger="train.compile_cache"):
        cache = CompileCache(tmp_path / "c.bin", torch.device("cpu"))
    assert inductor_config.fx_graph_cache is not False
    assert "torch's caches are off (Inductor's fx_graph_cache" in caplog.text
    assert cache.save() == 0 and not (tmp_path / "c.bin").exists()


def test_each_process_of_a_multi_gpu_run_keeps_a_file_of_its_own(tmp_path: Path) -> None:
    """torch's cache keys hold the device index: rank k's graphs on cuda:k never match rank 0's."""
    assert rank_path(tmp_path / "c.bin", 0, 1) == tmp_path / "c.bin"
    assert [rank_path(tmp_path / "c.bin", k, 4).name for k in (0, 3)] == ["c.bin.rank0", "c.bin.rank3"]
    assert rank_path(None, 2, 4) is None
