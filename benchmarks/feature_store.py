"""The offline feature store against online capture: bytes per token, write and read throughput,
stored == online bit for bit at the trainer's batch shape, and a killed-then-resumed write == a
clean one. One command on a GPU machine (the reference target and a ShareGPT file):

    python benchmarks/feature_store.py --target .target/qwen3-27m-sharegpt --data /tmp/sharegpt.json \
        --records 2000 --out /tmp/fs_bench

Prints a table; writes ``<out>/feature_store.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from compose import compose_train  # noqa: E402

from train.data import prepare_data  # noqa: E402
from train.data.dataset import collate_padded  # noqa: E402
from train.features.store import FeatureStore  # noqa: E402
from train.features.write import write_features  # noqa: E402
from models.target import TargetModel  # noqa: E402


def overrides(args, store: Path, compression: str) -> list[str]:
    return [f"experiment={args.experiment}", f"target.path={args.target}", f"data.path={args.data}", f"data.max_records={args.records}",
            f"data.max_length={args.max_length}", "data.num_eval=0", f"trainer.batch_size={args.batch_size}", "trainer.progress=false",
            "logger=none", f"features.path={store}", f"features.rows_per_shard={args.rows_per_shard}", f"features.compression={compression}",
            f"output_dir={store}_hydra"]


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def drop_page_cache() -> bool:
    """Cold reads where the machine lets us (root, /proc/sys/vm/drop_caches writable)."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--experiment", default="dflash_swa")
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--max-length", type=int, default=3072)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--rows-per-shard", type=int, default=64)
    parser.add_argument("--checks", type=int, default=50, help="random batches compared bit for bit")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "args": vars(args)}

    for compression in ("none", "zlib"):
        store = out / f"store_{compression}"
        t0 = time.perf_counter()
        totals = write_features(compose_train(overrides(args, store, compression)))
        result[f"write_{compression}"] = {**totals, "seconds": time.perf_counter() - t0}
        print(f"wrote {store}: {totals} in {time.perf_counter() - t0:.1f} s", flush=True)

    # Online capture, the way the GPU trainer runs it: [batch, max_length], compiled layers.
    cfg = compose_train(overrides(args, out / "store_none", "none"))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    target = TargetModel.from_pretrained(args.target, device)
    train_ds, _, _ = prepare_data(cfg.data, target, progress=False)
    train_ds = train_ds.with_format(None)
    if device.type == "cuda":
        target.compile_layers()
    store = FeatureStore(out / "store_none")
    layer_ids = store.spec.layer_ids
    pad_id = target.pad_id
    order = list(range(len(train_ds)))
    random.Random(0).shuffle(order)
    batches = [order[i : i + args.batch_size] for i in range(0, len(order) - args.batch_size + 1, args.batch_size)]
    collated = [collate_padded([train_ds[i] for i in rows], pad_id, args.max_length) for rows in batches]
    tokens = sum(int(b["attention_mask"].sum()) for b in collated)

    equal = checked = 0
    for rows, batch in list(zip(batches, collated))[: args.checks]:
        # as the trainer captures (StepContext.features) and the writer stores: no pad mask, right padding
        online = target.capture(batch["input_ids"].to(device), layer_ids, attention_mask=None)
        stored = store.gather("train", rows, args.max_length, device)
        real = batch["attention_mask"].bool().to(device)
        equal += int(torch.equal(online.features[real], stored.features[real]))
        checked += 1
    result["bit_for_bit"] = {"batches_equal": equal, "batches_checked": checked}
    print(f"stored == online bit for bit: {equal}/{checked} random batches", flush=True)

    def timed(fn) -> float:
        sync()
        t0 = time.perf_counter()
        for rows, batch in zip(batches, collated):
            fn(rows, batch)
        sync()
        return time.perf_counter() - t0

    capture = lambda rows, b: target.capture(b["input_ids"].to(device, non_blocking=True), layer_ids, attention_mask=None)  # noqa: E731
    timed(capture)  # compile and warm up
    rates = {"online capture": tokens / timed(capture)}
    verify_s = {}
    for compression in ("none", "zlib"):
        dropped = drop_page_cache()
        t0 = time.perf_counter()
        s = FeatureStore(out / f"store_{compression}", verify=True)  # sha256 of every shard, 8 threads
        verify_s[compression] = time.perf_counter() - t0
        dropped = drop_page_cache() and dropped
        cache = "cold" if dropped else "page cache"
        rates[f"store {compression}, {cache}"] = tokens / timed(lambda rows, b: s.gather("train", rows, args.max_length, device))
        rates[f"store {compression}, page cache"] = tokens / timed(lambda rows, b: s.gather("train", rows, args.max_length, device))
    result["tokens_per_s"] = rates
    result["verify_seconds"] = verify_s
    bytes_per_token = {c: result[f"write_{c}"]["bytes_per_token"] for c in ("none", "zlib")}

    # A real kill: SIGKILL the writer once a few shards are done, run it again, compare every byte.
    killed = out / "store_killed"
    command = [sys.executable, "-m", "train.features", *overrides(args, killed, "none")]
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while len(list((killed / "train").glob("*.json"))) < 3 and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = len(list((killed / "train").glob("*.json")))
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    same = tree_digest(killed) == tree_digest(out / "store_none")
    result["resume"] = {"shards_done_at_kill": done, "shards": store.totals["shards"], "identical": same}
    print(f"killed after {done}/{store.totals['shards']} shards, resumed: identical to the clean store: {same}", flush=True)

    print(f"\n{result['device']}, {len(train_ds)} rows, {tokens} tokens, batch {args.batch_size} x {args.max_length}, "
          f"layers {layer_ids} of hidden {target.hidden_size}, dtype {store.spec.dtype}")
    print("| source | tokens/s | vs online |\n|---|---:|---:|")
    for name, rate in rates.items():
        print(f"| {name} | {rate:,.0f} | {rate / rates['online capture']:.2f}x |")
    for c in ("none", "zlib"):
        size = result[f"write_{c}"]["bytes"]
        print(f"sha256 of every shard at open ({c}): {verify_s[c]:.2f} s for {size / 1e9:.2f} GB ({size / 1e9 / verify_s[c]:.1f} GB/s)")
    print(f"\nbytes per token: none {bytes_per_token['none']:.0f}, zlib {bytes_per_token['zlib']:.0f} "
          f"({bytes_per_token['zlib'] / bytes_per_token['none']:.1%}); write s: none {result['write_none']['seconds']:.1f}, "
          f"zlib {result['write_zlib']['seconds']:.1f}")
    (out / "feature_store.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
