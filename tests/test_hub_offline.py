"""Hub ids without a network (models/hub.py): an uncached id fails at once in one line, a cached one loads from the
cache alone; before, both waited out the hub client's ~50 s of retries. No test here reaches a network: every socket
connection is refused in-process (and in the subprocess) before anything could leave the machine."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list:
    """Every connection refused as a machine without DNS refuses it; the attempts recorded. No proxy, not declared offline."""
    attempts = []

    def refuse(address, *args, **kwargs):
        attempts.append(address)
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", lambda self, address: refuse(address))
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy",
                 "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    return attempts


def run_without_network(code: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter whose every connection is refused (as a machine without DNS refuses it), the hub
    cache at ``tmp_path / "hub"``, no proxy, not declared offline."""
    environ = {k: v for k, v in os.environ.items() if "PROXY" not in k.upper() and k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT")}
    environ.update(HF_HUB_CACHE=str(tmp_path / "hub"), PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, "-c", REFUSE_CONNECTIONS + code], env=environ, cwd=tmp_path, capture_output=True,
                          text=True, timeout=180)


REFUSE_CONNECTIONS = """import socket
def refuse(*args, **kwargs):
    raise socket.gaierror(-2, "Name or service not known")
socket.create_connection = refuse
socket.socket.connect = refuse
"""


def test_hub_ids_and_local_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from models.hub import is_hub_id

    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs").mkdir()
    assert is_hub_id("Qwen/Qwen3-8B") and is_hub_id("gpt2")
    assert not any(is_hub_id(p) for p in ("./model", "../m", "/abs/model", "~/m", "a/b/c", str(ROOT)))
    assert not is_hub_id("outputs/no-such-run")  # a local folder's typo, not a hub id
    from infer.loading import check_target_folder

    with pytest.raises(ValueError, match=r"^--target='outputs/no-such-model': no such folder; expected a Hugging Face model folder"):
        check_target_folder("outputs/no-such-model", "--target")  # said at once, not sent to the hub as an id
    check_target_folder("Qwen/Qwen3-8B", "--target")  # a hub id passes (the loader asks the hub, or its cache)


def test_uncached_drafter_hub_id_fails_at_once_naming_it(no_network: list) -> None:
    from infer.loading import resolve_run

    repo = "swa-drafters-tests/no-such-drafter-3f9c1a"
    with pytest.raises(ValueError, match=rf"^--drafter='{repo}': not a local folder, not in the Hugging Face cache, and "
                                         r"huggingface.co cannot be reached \(Name or service not known\)"):
        resolve_run(None, repo)
    assert no_network == [("huggingface.co", 443)]


def test_uncached_hub_id_fails_at_once_naming_it(no_network: list) -> None:
    from models.target import TargetModel

    repo = "swa-drafters-tests/no-such-model-3f9c1a"
    start = time.perf_counter()
    with pytest.raises(ValueError) as err:
        TargetModel.from_pretrained(repo, "cpu")
    message = str(err.value)
    assert message.startswith(f"target.path='{repo}': not a local folder, not in the Hugging Face cache, and huggingface.co "
                              "cannot be reached (Name or service not known)") and "\n" not in message
    assert no_network == [("huggingface.co", 443)]  # one probe; transformers never asked
    assert time.perf_counter() - start < 10  # the hub client's retries took ~50 s


def test_a_reachable_hub_or_a_proxy_leaves_the_hub_client_alone(no_network: list, monkeypatch: pytest.MonkeyPatch) -> None:
    from models import hub

    assert hub.local_files_only("./a-folder", "target.path") is False and no_network == []  # a path: nothing tried
    monkeypatch.setattr(socket, "create_connection", lambda address, timeout=None: type("Conn", (), {"close": lambda self: None})())
    assert hub.local_files_only("swa-drafters-tests/anything", "target.path") is False  # reachable: transformers decides
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("probed behind a proxy"))
    assert hub.unreachable() is None
    monkeypatch.delenv("HTTPS_PROXY")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.unreachable() is None  # declared offline: the hub client fails fast by itself


@pytest.mark.slow  # a subprocess (imports huggingface_hub and the loader)
def test_cached_drafter_hub_id_resolves_to_its_snapshot_without_the_network(tmp_path: Path) -> None:
    """A published drafter in the hub cache (``--drafter owner/name``), every connection refused: ``resolve_run`` gives the
    cached snapshot's folder, which ``read_drafter_config`` reads as any drafter folder."""
    commit = "89abcdef0123456789abcdef0123456789abcdef"
    repo = tmp_path / "hub" / "models--swa-tests--tiny-drafter"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text('{"architectures": ["DFlashDraftModel"], "block_size": 8, "hidden_size": 32, '
                                          '"num_hidden_layers": 1, "vocab_size": 64, '
                                          '"dflash_config": {"mask_token_id": 5, "target_layer_ids": [1, 3]}}')
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    code = """
from infer.loading import read_drafter_config, resolve_run
target, drafter, run = resolve_run("T", "swa-tests/tiny-drafter")
print("resolved", target, drafter, run, read_drafter_config(drafter)["dflash_config"]["block_size"])
"""
    proc = run_without_network(code, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"resolved T {snapshot} None 8" in proc.stdout and "Retry" not in proc.stderr


@pytest.mark.slow  # a subprocess (imports transformers) and two loads of the tiny target
def test_cached_hub_id_loads_from_the_cache_without_the_network(tmp_path: Path, tiny_qwen3_path: str) -> None:
    """A hub cache laid out as huggingface_hub writes it (refs/main -> snapshots/<commit>/files), holding the tiny target
    as ``swa-tests/tiny-qwen3``: with every connection refused the id loads, its logits equal the folder's, no retries."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--swa-tests--tiny-qwen3"
    shutil.copytree(tiny_qwen3_path, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    code = f"""
import torch
from models.target import TargetModel
ids = torch.tensor([[1, 5, 9, 200, 31, 7]])
a = TargetModel.from_pretrained("swa-tests/tiny-qwen3", "cpu").model(ids).logits
b = TargetModel.from_pretrained({tiny_qwen3_path!r}, "cpu").model(ids).logits
print("max diff", (a - b).abs().max().item())
"""
    proc = run_without_network(code, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "max diff 0.0" in proc.stdout
    assert "Retry" not in proc.stderr


def test_uncached_hub_dataset_fails_at_once_naming_it(no_network: list) -> None:
    """``data.path`` a hub dataset id, the hub unreachable and the dataset not cached: one line at once (datasets' own
    retries took ~23 s before its ConnectionError)."""
    from train.data.readers import DataError, read_conversations

    repo = "swa-drafters-tests/no-such-dataset-3f9c1a"
    start = time.perf_counter()
    with pytest.raises(DataError) as err:
        read_conversations(repo)
    message = str(err.value)
    assert message.startswith(f"data.path='{repo}': not a local file or folder, not in the Hugging Face cache, and "
                              "huggingface.co cannot be reached (Name or service not known)") and "\n" not in message
    assert no_network == [("huggingface.co", 443)]
    assert time.perf_counter() - start < 10


@pytest.mark.slow  # a subprocess (imports datasets)
@pytest.mark.parametrize("declared", [False, True], ids=["unreachable", "HF_HUB_OFFLINE"])
def test_cached_hub_dataset_loads_from_its_snapshot_without_the_network(tmp_path: Path, declared: bool) -> None:
    """A dataset repository in the hub cache (as huggingface_hub lays it out), every connection refused: its rows load
    from the cached snapshot at once (by id, datasets 5.2 retried ~23 s and then failed with the files cached), and so
    with HF_HUB_OFFLINE=1 (datasets alone failed at once: OfflineModeIsEnabled, it does not read the hub cache)."""
    commit = "fedcba9876543210fedcba9876543210fedcba98"
    repo = tmp_path / "hub" / "datasets--swa-tests--tiny-chats"
    (repo / "snapshots" / commit / "data").mkdir(parents=True)
    rows = [{"conversations": [{"from": "human", "value": f"question {i}"}, {"from": "gpt", "value": f"answer {i}"}]} for i in range(3)]
    (repo / "snapshots" / commit / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    code = """
import time
from train.data.readers import read_conversations
start = time.perf_counter()
conversations, stats = read_conversations("swa-tests/tiny-chats")
print("read", len(conversations), [m["content"] for m in conversations[2].messages], round(time.perf_counter() - start, 1))
"""
    offline = {"HF_HUB_OFFLINE": "1"} if declared else {}
    proc = run_without_network(code, tmp_path, HF_DATASETS_CACHE=str(tmp_path / 'datasets'), **offline)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "read 3 ['question 2', 'answer 2']" in proc.stdout and "Retry" not in proc.stderr
    assert float(proc.stdout.split()[-1]) < 10


def test_an_uncached_hub_id_declared_offline_says_so_in_one_line(no_network: list, monkeypatch: pytest.MonkeyPatch) -> None:
    """HF_HUB_OFFLINE=1 and an id not in the cache: the hub client's own refusal blamed the network ("check your internet
    connection"), without naming the setting that stopped it or the download command."""
    from models.target import TargetModel

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    repo = "swa-drafters-tests/no-such-model-3f9c1a"
    with pytest.raises(ValueError) as err:
        TargetModel.from_pretrained(repo, "cpu")
    message = str(err.value)
    assert message.startswith(f"target.path='{repo}': not a local folder, not in the Hugging Face cache, and HF_HUB_OFFLINE=1 "
                              f"declares the hub offline; download it where there is network (hf download {repo})") and "\n" not in message
    assert no_network == []  # declared offline: not even a probe
