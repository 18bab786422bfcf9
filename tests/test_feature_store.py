"""The offline feature store: stored features == online capture bit for bit, lossless compression,
resume after a real kill == an uninterrupted write, checksums, refusals, training from the store."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from compose import compose_train

from train.data import prepare_data
from train.data.dataset import collate_padded
from train.distributed import free_port
from train.features.store import FeatureStore, StoreError, compress_tensor, decompress_tensor
from train.features.write import write_features
from models.target import TargetModel
from train.trainer import train

REPO = Path(__file__).resolve().parents[1]
SMALL_DATA = ["data.max_records=40", "data.max_length=128", "data.num_eval=8"]


def reference_overrides(target: Path, store: Path, kind: str = "dflash", extra: list[str] = ()) -> list[str]:
    drafter = ["drafter=dflash", "drafter.target_layer_ids=[1,3,5]"] if kind == "dflash" else ["drafter=eagle3", "drafter.target_layer_ids=[1,3,5]"]
    return [f"target.path={target}", *drafter, *SMALL_DATA, "trainer.batch_size=3", "trainer.progress=false", "trainer.device=cpu",
            f"features.path={store}", "features.rows_per_shard=5", f"output_dir={store}_run", *extra]


@pytest.mark.slow  # ~7 s a case on one core; the quick tier keeps the store's refusals
@pytest.mark.parametrize("kind,compression", [("dflash", "none"), ("eagle3", "zlib")])
def test_stored_features_equal_online_capture_bit_for_bit(tmp_path: Path, reference_target_path: Path, kind: str, compression: str) -> None:
    """The trainer's batches gather rows in any order and company; each row's stored features must be
    the bits a target forward of that batch produces (same [batch, max_length] shape)."""
    store_dir = tmp_path / "store"
    cfg = compose_train(reference_overrides(reference_target_path, store_dir, kind, [f"features.compression={compression}"]))
    totals = write_features(cfg)
    store = FeatureStore(store_dir)
    counts = store.spec.rows
    assert counts["train"] + counts["eval"] == 36  # 36 of the 40 conversations have an assistant reply
    assert totals["shards"] == -(-counts["train"] // 5) - (-counts["eval"] // 5)  # 5 rows per shard
    assert store.spec.compression == compression and store.spec.with_final_hidden == (kind == "eagle3")

    target = TargetModel.from_pretrained(str(reference_target_path))
    train_ds, eval_ds, _ = prepare_data(cfg.data, target, seed=0, progress=False)
    train_ds = train_ds.with_format(None)
    pad_id = target.tokenizer.pad_token_id
    for rows in ([7, 0, 27], [25, 12, 5], [3, 4, 26]):  # across shards, out of order
        batch = collate_padded([train_ds[i] for i in rows], pad_id, 128)
        online = target.capture(batch["input_ids"], [1, 3, 5], attention_mask=batch["attention_mask"], with_final_hidden=kind == "eagle3")
        stored = store.gather("train", rows, 128)
        real = batch["attention_mask"].bool()
        assert torch.equal(stored.features[real], online.features[real]), rows
        assert not stored.features[~real].any()  # zeros past each row's end
        if kind == "eagle3":
            assert torch.equal(stored.final_hidden[real], online.final_hidden[real])
    last = counts["eval"] - 1
    assert store.row("eval", last).shape == (len(eval_ds[last]["input_ids"]), 3 * target.hidden_size)


def test_compression_is_lossless_and_smaller_for_hidden_states() -> None:
    g = torch.Generator().manual_seed(0)
    hidden = (torch.randn(300, 256, generator=g) * torch.logspace(-2, 1, 256)).to(torch.bfloat16)
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-40, 3.4e38])
    for t in (hidden, hidden.float(), special, special.to(torch.bfloat16), torch.zeros(0, 4, dtype=torch.bfloat16)):
        blob, meta = compress_tensor(t)
        back = decompress_tensor(blob, meta)
        assert back.dtype == t.dtype and back.shape == t.shape
        assert torch.equal(back.view(torch.uint8) if t.numel() else back, t.view(torch.uint8) if t.numel() else t)  # NaN-safe: compare bytes
    blob, _ = compress_tensor(hidden)
    assert blob.numel() < 0.9 * hidden.numel() * 2  # the sign/exponent planes of bf16 activations deflate


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_a_killed_writer_resumes_to_the_store_two_processes_write(tmp_path: Path, tiny_qwen3_path: str) -> None:
    """SIGKILL a real ``python -m train.features`` mid-way, run it again: the same bytes as a clean
    run, here one of two processes under torchrun (each writes every other shard)."""
    common = ["experiment=dflash_swa_tiny", "data.max_records=120", "data.max_length=256", "data.num_eval=8", "trainer.batch_size=2",
              "trainer.progress=false", "features.rows_per_shard=2", "features.compression=zlib", "data.regenerate.enabled=false"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def command(store: Path) -> list[str]:
        return [sys.executable, "-m", "train.features", *common, f"features.path={store}", f"output_dir={tmp_path / 'hydra'}"]

    whole = tmp_path / "whole"
    two = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}", *command(whole)[1:]]
    subprocess.run(two, env={**env, "OMP_NUM_THREADS": "1"}, check=True, capture_output=True, cwd=tmp_path)
    killed = tmp_path / "killed"
    proc = subprocess.Popen(command(killed), env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while len(list((killed / "train").glob("*.json"))) < 3 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_at_kill = len(list((killed / "train").glob("*.json")))
    assert 3 <= done_at_kill < 56 and not (killed / "complete.json").exists(), done_at_kill
    with pytest.raises(StoreError, match="unfinished"):
        FeatureStore(killed)
    subprocess.run(command(killed), env=env, check=True, capture_output=True, cwd=tmp_path)
    assert tree_digest(killed) == tree_digest(whole)  # shards, marks, store.json, complete.json; no leftovers


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory: pytest.TempPathFactory, tiny_qwen3_path: str) -> Path:
    store = tmp_path_factory.mktemp("tiny") / "store"
    write_features(compose_train(["experiment=dflash_swa_tiny", *SMALL_DATA, "trainer.batch_size=2", "trainer.progress=false",
                                  f"features.path={store}", "features.rows_per_shard=8", f"output_dir={store}_w"]))
    return store


TINY_TRAIN = ["experiment=dflash_swa_tiny", *SMALL_DATA, "trainer.batch_size=2", "trainer.progress=false", "trainer.max_steps=8",
              "trainer.log_every=1", "trainer.eval_every=4", "trainer.export=false"]


@pytest.mark.slow  # the quick tier keeps the store's refusals (on the same tiny store)
def test_training_from_the_store_follows_online_training(tmp_path: Path, tiny_store: Path) -> None:
    """Same losses as the online run: on the CPU the online trainer pads each batch to its longest row,
    not to max_length, so the features agree to rounding here (bit for bit at the GPU's static shape)."""
    offline = train(compose_train(TINY_TRAIN + [f"features.path={tiny_store}", f"output_dir={tmp_path / 'offline'}"]))
    online = train(compose_train(TINY_TRAIN + [f"output_dir={tmp_path / 'online'}"]))
    read = lambda run: [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    a, b = read("offline"), read("online")
    assert [h["step"] for h in a] == [h["step"] for h in b]
    for x, y in zip(a, b):
        for key in ("train/loss", "eval/loss"):
            if key in x:
                assert x[key] == pytest.approx(y[key], rel=1e-5, abs=1e-6), (x["step"], key)
    assert offline["eval/sim_tau"] == pytest.approx(online["eval/sim_tau"], rel=1e-5)


def test_store_refusals_name_the_problem(tmp_path: Path, tiny_store: Path) -> None:
    with pytest.raises(StoreError, match="no feature store there"):
        train(compose_train(TINY_TRAIN + [f"features.path={tmp_path / 'nothing'}", f"output_dir={tmp_path / 'a'}"]))
    # Other layers, other rows: the field that differs is named.
    with pytest.raises(StoreError, match="field 'layer_ids'"):
        train(compose_train(TINY_TRAIN + ["drafter.target_layer_ids=[2,4]", f"features.path={tiny_store}", f"output_dir={tmp_path / 'b'}"]))
    with pytest.raises(StoreError, match="field 'rows'"):
        train(compose_train(TINY_TRAIN + ["data.max_records=30", f"features.path={tiny_store}", f"output_dir={tmp_path / 'c'}"]))
    # A flipped byte in a shard: the checksum names the file.
    corrupt = tmp_path / "corrupt"
    import shutil

    shutil.copytree(tiny_store, corrupt)
    shard = corrupt / "train" / "shard_00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-7] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=r"shard_00001.safetensors: sha256 .* does not match"):
        FeatureStore(corrupt)  # every shard is checked when the store opens
    unchecked = FeatureStore(corrupt, verify=False)  # features.verify=false: read as is
    unchecked.gather("train", [0, 1], 128)


@pytest.mark.slow  # the quick tier stays under 3 minutes (README); the full suite runs it
def test_features_command_without_a_path_exits_with_one_line(tmp_path: Path, tiny_qwen3_path: str) -> None:
    """Refused in one line, and no run folder is left behind (found by review, 2026-12-06's sixth session: Hydra's
    .hydra and log stayed in output_dir, by default a new outputs/<time>/, after each refusal; python -m train removed
    its own)."""
    run = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "train.features", "experiment=dflash_swa_tiny", f"output_dir={run}"],
                            env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 2
    errors = [line for line in (result.stdout + result.stderr).splitlines() if "ERROR" in line]  # Hydra logs to stdout
    assert len(errors) == 1 and "features.path is null" in errors[0], result.stdout + result.stderr
    assert not run.exists(), sorted(p.name for p in run.iterdir())
    run.mkdir()  # a rerun into a folder that was there (its earlier runs' logs): refused, and the folder left as it was
    (run / "__main__.log").write_text("an earlier run's log\n")
    result = subprocess.run([sys.executable, "-m", "train.features", "experiment=dflash_swa_tiny", f"output_dir={run}"],
                            env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 2 and (run / "__main__.log").read_text().startswith("an earlier run's log")


def test_store_files_of_another_shape_are_one_clear_error(tmp_path: Path) -> None:
    """A store's folder at or under a file, a cut-off or reshaped store.json, complete.json or shard mark: a
    StoreError naming the file (python -m train and python -m train.features print it as their one line)."""
    from train.features.store import StoreSpec, StoreWriter

    spec = StoreSpec(target={"config": "c", "weights": "w"}, layer_ids=[1], with_final_hidden=False, dtype="float32", hidden_size=4,
                     max_length=8, batch_size=1, data={"train": "d"}, rows={"train": 2}, rows_per_shard=1)
    file = tmp_path / "file"
    file.write_text("x")
    for path, message in ((file, "a file; expected a folder"), (file / "store", f"{file} is a file; expected a folder")):
        with pytest.raises(StoreError, match=message):
            StoreWriter(path, spec)
    store = tmp_path / "store"
    writer = StoreWriter(store, spec)
    for shard in range(2):
        writer.write_shard("train", shard, {f"{shard}.features": torch.ones(3, 4)}, 3)
    writer.finish()
    FeatureStore(store)
    spec_text = (store / "store.json").read_text()
    for name, text, message in (("store.json", "[1]", "a JSON list"), ("store.json", '{"layer_ids": ', "not valid JSON")):
        (store / name).write_text(text)
        with pytest.raises(StoreError, match=rf"store.json: {message}"):
            StoreWriter(store, spec)
    (store / "store.json").write_text(spec_text)
    for name, text, message in (("complete.json", '{"tokens": ', "not valid JSON"), ("complete.json", "[]", "a JSON list"),
                                ("train/shard_00001.json", '{"rows": [1, 2]}', "no 'sha256'")):
        good = (store / name).read_text()
        (store / name).write_text(text)
        with pytest.raises(StoreError, match=rf"{name}: {message}.*; expected"):
            FeatureStore(store)
        (store / name).write_text(good)


def test_a_store_of_other_layers_is_refused_before_its_shards_are_hashed(tmp_path: Path, tiny_store: Path, monkeypatch) -> None:
    """The spec check first: a store written for another target or layer set was hashed whole (every shard; terabytes
    at real scale) before its one-line refusal."""
    import train.features.store as store_module

    hashed = []
    real = store_module.file_sha256
    monkeypatch.setattr(store_module, "file_sha256", lambda *a, **k: (hashed.append(a[0]), real(*a, **k))[1])
    with pytest.raises(StoreError, match="field 'layer_ids'"):
        train(compose_train(TINY_TRAIN + ["drafter.target_layer_ids=[2,4]", f"features.path={tiny_store}", f"output_dir={tmp_path / 'b'}"]))
    assert hashed == []
    FeatureStore(tiny_store)  # a matching store is still checked whole when it opens
    assert len(hashed) == len(list((tiny_store / "train").glob("shard_*.safetensors"))) + len(list((tiny_store / "eval").glob("shard_*.safetensors")))


def test_the_writer_loads_the_target_as_the_training_run_does(tmp_path: Path, tiny_qwen3_path: str) -> None:
    """The writer resolved target.dtype alone, the trainer through trainer.precision (trainer.target_dtype): `auto` with
    an fp32 step wrote a bf16 store on a GPU that the same config's training run refused. On the CPU the step is fp32:
    target.dtype=bfloat16 is refused by the writer as by the trainer, before anything is written."""
    store = tmp_path / "store"
    with pytest.raises(ValueError, match=r"trainer\.precision=auto runs the step in fp32 on cpu, target\.dtype=bfloat16"):
        write_features(compose_train(["experiment=dflash_swa_tiny", *SMALL_DATA, "trainer.batch_size=2", "trainer.progress=false",
                                      "target.dtype=bfloat16", f"features.path={store}", f"output_dir={tmp_path / 'w'}"]))
    assert not store.exists()


def test_a_store_path_under_a_file_is_refused_before_the_target_loads(tmp_path: Path, monkeypatch) -> None:
    """features.path's first write came after the target, the data and any regeneration (hours at scale), as an
    OSError traceback; now one line first."""
    import models.target as target_module

    def no_load(*a, **k):
        raise AssertionError("the target was loaded before features.path was checked")

    monkeypatch.setattr(target_module.TargetModel, "from_pretrained", no_load)
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreError, match=r"features\.path=.*file/store'.*is a file; expected a folder for the store"):
        write_features(compose_train(["experiment=dflash_swa_tiny", *SMALL_DATA, f"features.path={tmp_path / 'file' / 'store'}",
                                      f"output_dir={tmp_path / 'w'}"]))


@pytest.mark.parametrize("cut", ["header", "data", "empty"])
def test_a_cut_shard_read_unverified_is_one_line_naming_it(tmp_path: Path, cut: str) -> None:
    """features.verify=false skips the checksums: a shard cut short was safetensors' SafetensorError traceback mid-training.
    Now a StoreError (python -m train's one line) naming the shard."""
    from train.features.store import StoreSpec, StoreWriter

    spec = StoreSpec(target={"config": "c", "weights": "w"}, layer_ids=[1], with_final_hidden=False, dtype="float32", hidden_size=4,
                     max_length=8, batch_size=1, data={"train": "d"}, rows={"train": 2}, rows_per_shard=1)
    writer = StoreWriter(tmp_path / "store", spec)
    for shard in range(2):
        writer.write_shard("train", shard, {f"{shard}.features": torch.ones(3, 4)}, 3)
    writer.finish()
    shard = tmp_path / "store" / "train" / "shard_00001.safetensors"
    data = shard.read_bytes()
    shard.write_bytes({"header": data[:40], "data": data[:-8], "empty": b""}[cut])
    store = FeatureStore(tmp_path / "store", verify=False)
    assert store.gather("train", [0], 8).features.shape == (1, 8, 4)  # the whole shard still reads
    with pytest.raises(StoreError) as err:
        store.gather("train", [0, 1], 8)
    assert str(err.value).startswith(f"{shard}: not a readable feature shard (SafetensorError: ") and "\n" not in str(err.value)


def test_a_batch_over_more_shards_than_stay_open_reads_the_handle_cache_from_one_thread(tmp_path: Path, monkeypatch) -> None:
    """``gather`` reads rows in a thread pool; the handle cache (an OrderedDict evicting past ``open_shards``) was opened
    for the batch up front, but a batch over more shards than stay open had its threads reopen evicted shards and evict
    others concurrently (``move_to_end`` on a key another thread had just popped: a KeyError mid-training). The race is
    rare, so this checks its precondition: the cache is touched from the calling thread only, and every row reads back."""
    import threading

    from train.features.store import StoreSpec, StoreWriter

    spec = StoreSpec(target={"config": "c", "weights": "w"}, layer_ids=[1], with_final_hidden=False, dtype="float32", hidden_size=4,
                     max_length=8, batch_size=1, data={"train": "d"}, rows={"train": 6}, rows_per_shard=1)
    writer = StoreWriter(tmp_path / "store", spec)
    for shard in range(6):
        writer.write_shard("train", shard, {f"{shard}.features": torch.full((3, 4), float(shard))}, 3)
    writer.finish()
    store = FeatureStore(tmp_path / "store", open_shards=2, threads=4)
    callers, shard = set(), store._shard
    monkeypatch.setattr(store, "_shard", lambda *a: callers.add(threading.current_thread()) or shard(*a))
    batch = store.gather("train", [5, 0, 3, 1, 4, 2], 8).features
    assert callers == {threading.current_thread()}
    assert torch.equal(batch[:, :3, 0], torch.tensor([5.0, 0, 3, 1, 4, 2])[:, None].expand(6, 3)) and not batch[:, 3:].any()
