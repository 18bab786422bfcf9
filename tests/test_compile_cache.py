"""``trainer.compile_cache`` (train/compile_cache.py): torch.compile's artifacts carried to a fresh machine.

The reference is torch's own counters in a fresh process whose Inductor cache folder is empty: with the file loaded its
compile is served from the carried artifacts (cache hits, no misses), without it the same compile misses; and the
compiled function's result equals the eager one. CPU Inductor here; the trainer uses it for its GPU compiles.
"""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import train.compile_cache as compile_cache_module
from train.compile_cache import MAGIC, CompileCache, CompileCacheError, environment, rank_path, read, saved_blobs

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
if "second" in sys.argv[2]:  # a later compile and a second save: the file must keep the first function's graphs too
    torch.compile(lambda y: torch.tanh(y).mul(3).sum())(torch.randn(8, 8).requires_grad_()).backward()
    again = cache.save()
if "third" in sys.argv[2]:  # something the file never held
    torch.compile(lambda y: torch.sigmoid(y).mul(5).sum())(torch.randn(8, 8).requires_grad_()).backward()
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
    assert first["again"] > 0  # the second save is kept beside the first (torch's loader keeps one block per kind)
    assert cache_file.read_bytes().startswith(MAGIC) and len(read(cache_file)[0]["saves"]) == 2
    written_first = cache_file.read_bytes()
    # both functions, the one compiled before the first save and the one after it, come from the file
    carried = run_fresh(tmp_path, "carried", cache_file, "load,save,second")
    assert carried["equal"] and carried["loaded"] > 0
    assert carried["inductor"].get("fxgraph_cache_hit", 0) >= 2 and carried["inductor"].get("fxgraph_cache_miss", 0) == 0, carried
    assert carried["aot"].get("autograd_cache_hit", 0) >= 2, carried
    assert carried["saved"] == carried["again"] == 0 and cache_file.read_bytes() == written_first  # nothing new: not rewritten
    cold = run_fresh(tmp_path, "cold", cache_file, "")  # the same empty cache folder, the file not loaded: it compiles
    assert cold["equal"] and cold["inductor"].get("fxgraph_cache_miss", 0) > 0 and cold["inductor"].get("fxgraph_cache_hit", 0) == 0
    # a process that compiles something new rewrites the file, the loaded saves kept ahead of its own (it never used the
    # second function's): a fresh process compiling all three compiles nothing
    third = run_fresh(tmp_path, "third", cache_file, "load,save,third")
    assert third["again"] > 0 and third["inductor"].get("fxgraph_cache_miss", 0) > 0
    assert len(read(cache_file)[0]["saves"]) == 4
    again = run_fresh(tmp_path, "again", cache_file, "load,save,second,third")
    assert again["inductor"].get("fxgraph_cache_miss", 0) == 0 and again["inductor"].get("fxgraph_cache_hit", 0) >= 3, again


class FakeInfo:
    def __init__(self, keys):
        self.artifacts = {"inductor": list(keys)}


@pytest.mark.parametrize("head_size", [0, 4, 8, 64])
def test_each_save_is_kept_and_loaded_in_order_as_torch_returned_it(tmp_path: Path, monkeypatch, caplog, head_size: int) -> None:
    """The file's storage of several saves against the exact bytes torch's save returned (a fake torch: each save's bytes
    a head that changes and a body that grows, as torch 2.7-2.13's checksum and appended blocks): every save comes back
    byte for byte, in order; a process that loaded them and compiled nothing writes nothing, one that compiled something
    keeps the loaded saves ahead of its own; a failed write is tried again at the next save; a save that does not extend
    the one before is not kept, said once, and the file keeps the earlier saves."""
    cpu = torch.device("cpu")
    body, returned = b"", []

    def fake_save(extra: bytes, keys):
        nonlocal body
        body += extra
        blob = bytes([len(returned) + 1]) * head_size + body  # the head differs at every save
        returned.append(blob)
        return blob, FakeInfo(keys)

    misses = [0]
    monkeypatch.setattr("train.compile_cache.compile_misses", lambda: misses[0])
    results = iter([fake_save(b"A" * 1000, ["a"]), fake_save(b"B" * 10, ["a", "b"]), fake_save(b"C" * 20, ["a", "b", "c"])])
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: next(results))
    path = tmp_path / "cache.bin"
    cache = CompileCache(path, cpu)
    sizes = [cache.save(), cache.save(), cache.save()]
    assert all(sizes) and sizes[0] == 1000 + head_size
    assert sizes[2] == 1000 + head_size + (head_size + 10) + (head_size + 20)  # heads and new tails only
    header, stored = read(path)
    assert list(saved_blobs(header, stored)) == returned

    loaded = []
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda blob: loaded.append(blob) or FakeInfo(["a", "b", "c"]))
    warm = CompileCache(path, cpu)
    assert warm.load() == 3 and loaded == returned
    same = returned[-1]
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (same, FakeInfo(["a", "c"])))
    before = path.read_bytes()
    assert warm.save() == 0 and warm.save() == 0 and path.read_bytes() == before  # only what the file held

    # a warm process that compiles something new (torch's miss counters rise after its load), its first write failing once
    body, own = b"", []
    for extra, keys in [(b"D" * 300, ["a", "d"]), (b"E" * 7, ["a", "d", "e"])]:
        body += extra
        own.append((bytes([9]) * head_size + body, FakeInfo(keys)))
    results = iter(own)
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: next(results))
    failing = [True]
    real_open = compile_cache_module.atomic_open

    def flaky_open(*args, **kwargs):
        if failing.pop() if failing else False:
            raise OSError(28, "No space left on device")
        return real_open(*args, **kwargs)

    monkeypatch.setattr(compile_cache_module, "atomic_open", flaky_open)
    another = CompileCache(path, cpu)
    with caplog.at_level(logging.WARNING, logger="train.compile_cache"):
        assert another.load() == 3
        misses[0] = 1
        assert another.save() == 0 and "tried again at the next save" in caplog.text
        monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: own[0])  # nothing recorded since: still written
        assert another.save() > 0
        monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: own[1])
        assert another.save() > 0
    header, stored = read(path)
    assert list(saved_blobs(header, stored)) == returned + [blob for blob, _ in own]  # "b" and "c" unused: kept ahead

    broken = CompileCache(tmp_path / "broken.bin", cpu)
    results = iter([(b"xxxx" + b"A" * 50, FakeInfo(["a"])), (b"yyyy" + b"Z" * 80, FakeInfo(["a", "z"])),
                    (b"zzzz" + b"Z" * 90, FakeInfo(["z"]))])
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: next(results))
    with caplog.at_level(logging.WARNING, logger="train.compile_cache"):
        assert broken.save() == 54 and broken.save() == 0 and broken.save() == 0
    assert caplog.text.count("do not extend those of the save before") == 1
    header, stored = read(tmp_path / "broken.bin")
    assert list(saved_blobs(header, stored)) == [b"xxxx" + b"A" * 50]


def written(path: Path, header: dict, payload: bytes) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(MAGIC + len(raw).to_bytes(8, "little") + raw + payload)
    return path


def one_save(payload: bytes, length: int | None = None) -> list[dict]:
    return [{"length": len(payload) if length is None else length, "head": 0, "sha256": hashlib.sha256(payload).hexdigest()}]


def test_a_file_it_did_not_write_fails_in_one_line_naming_it(tmp_path: Path) -> None:
    cpu = torch.device("cpu")
    other = tmp_path / "weights.safetensors"
    other.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    with pytest.raises(CompileCacheError, match=r"trainer.compile_cache='.*weights.safetensors': not a compile cache \(16 bytes, no header\)"):
        CompileCache(other, cpu).load()
    cut = written(tmp_path / "cut.bin", {"environment": environment(cpu), "saves": one_save(b"x" * 100)}, b"x" * 40)
    with pytest.raises(CompileCacheError, match=r"cut short \(40 bytes of artifacts, the header says 100\)"):
        CompileCache(cut, cpu).load()
    damaged = written(tmp_path / "damaged.bin", {"environment": environment(cpu), "saves": one_save(b"x" * 40)}, b"x" * 39 + b"y")
    with pytest.raises(CompileCacheError, match=r"save 1 of 1 does not match its checksum \(a damaged file\)"):
        CompileCache(damaged, cpu).load()
    bad_header = tmp_path / "bad.bin"
    bad_header.write_bytes(MAGIC + (5).to_bytes(8, "little") + b"{nope" + b"x")
    with pytest.raises(CompileCacheError, match="unreadable header"):
        CompileCache(bad_header, cpu).load()
    no_saves = written(tmp_path / "no_saves.bin", {"environment": environment(cpu), "bytes": 3}, b"abc")
    with pytest.raises(CompileCacheError, match=r"unreadable header \(no list of saves\)"):
        CompileCache(no_saves, cpu).load()


def test_a_file_from_other_versions_is_skipped_loudly_not_loaded(tmp_path: Path, caplog) -> None:
    cpu = torch.device("cpu")
    elsewhere = {**environment(cpu), "torch": "2.0.0", "gpu": "NVIDIA A100-SXM4-80GB"}
    path = written(tmp_path / "old.bin", {"environment": elsewhere, "saves": one_save(b"abc")}, b"abc")  # never loaded
    older = tmp_path / "v1.bin"  # the first layout of this file (one save, no list)
    older.write_bytes(b"swa-drafters compile cache v1\n" + (2).to_bytes(8, "little") + b"{}")
    with caplog.at_level(logging.WARNING, logger="train.compile_cache"):
        assert CompileCache(path, cpu).load() == 0
        assert CompileCache(older, cpu).load() == 0
    assert "compiling cold (the file is rewritten)" in caplog.text and "2.0.0" in caplog.text
    assert "written by an earlier layout (swa-drafters compile cache v1)" in caplog.text
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
    from train.trainer import train

    cache_file = tmp_path / "cache" / "eagle3.bin"
    common = ["experiment=eagle3_swa_tiny", "trainer.max_steps=2", "trainer.progress=false", "data.num_eval=0", "trainer.loop_eval_prompts=0",
              f"trainer.compile_cache={cache_file}"]
    train(compose_train(common + [f"output_dir={tmp_path / 'first'}"]))
    header, stored = read(cache_file)
    assert header["environment"] == environment(torch.device("cuda")) and header["saves"] and len(stored) > 0



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


def test_the_trainer_saves_after_its_first_step_after_each_evaluation_and_at_the_end(tmp_path: Path, monkeypatch) -> None:
    """Where the trainer saves (CPU: nothing compiles, so each save is recorded, not written): the evaluation's graphs and
    the end's are compiled after the first step, and a single save would leave them out."""
    from compose import compose_train

    from train.trainer import train

    calls = []
    monkeypatch.setattr(CompileCache, "save", lambda self: calls.append((run / "run.json").exists()) or 0)
    run = tmp_path / "run"
    train(compose_train(["experiment=dflash_swa_tiny", "trainer.progress=false", "trainer.loop_eval_prompts=0",
                         "data.regenerate.enabled=false", "data.max_records=40", "data.max_length=256", "data.num_eval=8",
                         "trainer.max_steps=4", "trainer.eval_every=2", "trainer.export_formats=[]",
                         f"trainer.compile_cache={tmp_path / 'cache.bin'}", f"output_dir={run}"]))
    # step 1; the evaluations at steps 2 and 4; the end, once the run's record is written
    assert calls == [False, False, False, True]


def test_a_malformed_header_is_one_line_naming_the_save(tmp_path: Path) -> None:
    cpu = torch.device("cpu")

    def entry(length, head=0, **extra):
        return {"length": length, "head": head, "sha256": "0" * 64, **extra}

    cases = {  # header saves -> what the error says
        "negative": ([entry(5), entry(3)], r"save 2 of 2: head 0 and length 3 do not extend the save before it \(5 bytes\)"),
        "long_head": ([entry(4), entry(10, head=6)], r"save 2 of 2: head 6 and length 10 do not extend"),
        "bool": ([entry(True)], r"save 1 of 1: expected a positive integer length"),
        "whole_flag": ([entry(4, whole="yes")], r"save 1 of 1: expected a positive integer length"),
    }
    for name, (saves, message) in cases.items():
        path = written(tmp_path / f"{name}.bin", {"environment": environment(cpu), "saves": saves}, b"x" * 64)
        with pytest.raises(CompileCacheError, match=rf"trainer.compile_cache='.*{name}.bin': unreadable header \({message}"):
            CompileCache(path, cpu).load()
    deep = tmp_path / "deep.bin"
    raw = b"[" * 100000 + b"]" * 100000
    deep.write_bytes(MAGIC + len(raw).to_bytes(8, "little") + raw)
    with pytest.raises(CompileCacheError, match=r"unreadable header \(RecursionError"):
        CompileCache(deep, cpu).load()


def test_a_failed_write_is_retried_after_a_broken_save_and_a_warm_run_keeps_only_runs_it_did_not_use(tmp_path: Path,
                                                                                                       monkeypatch) -> None:
    cpu = torch.device("cpu")
    path = tmp_path / "cache.bin"
    real_open = compile_cache_module.atomic_open
    failures = [True, True]  # the first save's write and its retry in the broken save both fail

    def flaky_open(*args, **kwargs):
        if failures:
            failures.pop()
            raise OSError(28, "No space left on device")
        return real_open(*args, **kwargs)

    monkeypatch.setattr(compile_cache_module, "atomic_open", flaky_open)
    first = (b"h1" + b"A" * 200, FakeInfo(["step"]))
    results = iter([first, (b"zz" + b"Q" * 300, FakeInfo(["step", "q"])), first])
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: next(results))
    cache = CompileCache(path, cpu)
    assert cache.save() == 0 and cache.save() == 0 and not path.exists()  # failed; broken, its retry failed
    assert cache.save() > 0 and list(saved_blobs(*read(path))) == [first[0]]  # tried again with the room back
    monkeypatch.setattr(compile_cache_module, "atomic_open", real_open)

    # runs of saves: a warm process that used the step's graphs and compiled a new shape keeps the loaded run holding
    # the evaluation's (it never used them), and a later one that used everything keeps no loaded run
    misses = [0]
    monkeypatch.setattr("train.compile_cache.compile_misses", lambda: misses[0])

    def warm_run(saves: list[tuple[bytes, list[str]]]) -> list[bytes]:
        loaded = iter([FakeInfo(["step"]), FakeInfo(["step", "eval"])] * 4)
        monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda blob: next(loaded))
        monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: next(results))
        run = CompileCache(path, cpu)
        run.load()
        misses[0] += 1
        for _ in saves:
            run.save()
        return list(saved_blobs(*read(path)))

    path.unlink()
    evaluated = (b"h2" + b"A" * 200 + b"E" * 50, FakeInfo(["step", "eval"]))
    results = iter([first, evaluated])
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: next(results))
    cold = CompileCache(path, cpu)
    cold.save(), cold.save()  # the first step, then the evaluation
    assert list(saved_blobs(*read(path))) == [first[0], evaluated[0]]
    shape = (b"s1" + b"S" * 120, FakeInfo(["step", "shape"]))
    results = iter([shape])
    assert warm_run([shape]) == [first[0], evaluated[0], shape[0]]  # "eval" unused: that run kept
    def later_run(save: tuple[bytes, FakeInfo]) -> list[bytes]:
        monkeypatch.setattr(torch.compiler, "load_cache_artifacts",
                            lambda blob: FakeInfo(["step", "shape"] if blob == shape[0] else ["step", "eval"] if blob != other[0] else ["step", "other"]))
        monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: save)
        run = CompileCache(path, cpu)
        run.load()
        misses[0] += 1
        run.save()
        return list(saved_blobs(*read(path)))

    other = (b"o1" + b"O" * 70, FakeInfo(["step", "eval", "other"]))
    assert later_run(other) == [shape[0], other[0]]  # the run it used whole is dropped, the one holding "shape" kept
    everything = (b"e1" + b"X" * 90, FakeInfo(["step", "eval", "shape", "other", "more"]))
    assert later_run(everything) == [everything[0]]  # it used every loaded artifact: nothing kept, the file does not grow
