"""The offline feature store: the target's hidden states for every row of a dataset, on disk.

Layout (``<path>/``)::

    store.json                       what the store holds (StoreSpec): target, layers, dtype, data, shard plan
    train/shard_00000.safetensors    rows [0, rows_per_shard) of the train split: "<row>.features" [T_row, k*H]
                                     (and "<row>.final_hidden" [T_row, H] for EAGLE-3), real tokens only
    train/shard_00000.json           written after its shard, the shard's completion mark: sha256, bytes, tokens
    eval/...                         the same for the held-out rows
    complete.json                    written once every shard is there: totals, bytes per token

Every file is written under a temporary name and renamed, so a killed writer leaves no shard that
looks complete; a rerun skips the shards whose ``.json`` exists and writes the rest. Which rows a
shard holds depends only on the plan in ``store.json``, and each row's features only on its batch
shape (see train/features/write.py), so a resumed store is the same, byte for byte, as an
uninterrupted one.

Compression (``zlib``) is lossless: each tensor's bytes are split into byte planes (the bf16
sign/exponent bytes compress well, mantissa bytes barely) and each plane is deflated; the
compressed planes are stored as a uint8 tensor, with dtype and shape in the shard's metadata.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save as safetensors_bytes

from common.atomic import atomic_open
from common.digest import file_sha256
from common.json_file import read_json_object

FORMAT_VERSION = 1
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class StoreError(ValueError):
    """A feature store that is missing, incomplete, corrupt or made for other inputs."""


@dataclass
class StoreSpec:
    """What a store holds; a writer resuming it and a trainer reading it must ask for the same."""

    target: dict[str, Any]  # architecture digest and a weight sample digest (target_digest)
    layer_ids: list[int]
    with_final_hidden: bool  # EAGLE-3: also the final-normed hidden state (its soft labels)
    dtype: str
    hidden_size: int
    max_length: int  # the padded length every batch was run at
    batch_size: int  # rows per target forward
    data: dict[str, str]  # split -> digest of its rows' token ids, in order
    rows: dict[str, int]  # split -> row count
    rows_per_shard: int
    compression: str = "none"
    format_version: int = FORMAT_VERSION
    compile_layers: bool = False  # the target's layers ran under torch.compile (changes bits on GPU)

    def num_shards(self, split: str) -> int:
        return -(-self.rows[split] // self.rows_per_shard)

    def shard_rows(self, split: str, shard: int) -> range:
        start = shard * self.rows_per_shard
        return range(start, min(start + self.rows_per_shard, self.rows[split]))


def data_digest(rows: Iterable[dict]) -> str:
    """sha256 over every row's token ids, in order: the store's rows must be the trainer's rows."""
    h = hashlib.sha256()
    for row in rows:
        ids = np.asarray(row["input_ids"], dtype=np.int64)
        h.update(len(ids).to_bytes(8, "little"))
        h.update(ids.tobytes())
    return h.hexdigest()


def target_digest(model: torch.nn.Module) -> dict[str, str]:
    """The architecture and a sample of every weight (its first 4096 values): cheap, content-based,
    and unchanged when the model folder moves."""
    config = model.config.to_dict()
    for volatile in ("_name_or_path", "transformers_version", "torch_dtype", "dtype"):
        config.pop(volatile, None)
    weights = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        weights.update(name.encode())
        weights.update(p.detach().flatten()[:4096].float().cpu().numpy().tobytes())
    return {"config": hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest(),
            "weights": weights.hexdigest()}


def read_json(path: Path, what: str, keys: Iterable[str] = ()) -> dict[str, Any]:
    """A store's JSON file (spec, shard mark, totals) as a dict with ``keys``, or one StoreError naming the file."""
    expected = f"{what} (delete it and rerun python -m train.features)"
    data = read_json_object(path, expected, StoreError)
    missing = [k for k in keys if k not in data]
    if missing:
        raise StoreError(f"{path}: no {missing[0]!r}; expected {expected}")
    return data


def shard_file(root: Path, split: str, shard: int) -> Path:
    """A shard's file; its completion mark is the same name with ``.json``."""
    return Path(root) / split / f"shard_{shard:05d}.safetensors"


# ----------------------------------------------------------------------------- compression

def compress_tensor(t: torch.Tensor, level: int = 1) -> tuple[torch.Tensor, str]:
    """-> (uint8 blob, metadata): byte planes of ``t``, each deflated, with their lengths in the metadata."""
    t = t.contiguous()
    raw = t.view(torch.uint8).numpy().reshape(-1, t.element_size())
    planes = [zlib.compress(np.ascontiguousarray(raw[:, i]).tobytes(), level) for i in range(t.element_size())]
    meta = {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "planes": [len(p) for p in planes]}
    return torch.frombuffer(bytearray(b"".join(planes)), dtype=torch.uint8), json.dumps(meta)


def decompress_tensor(blob: torch.Tensor, meta: str) -> torch.Tensor:
    info = json.loads(meta)
    dtype = DTYPES[info["dtype"]]
    if blob.numel() == 0 or 0 in info["shape"]:
        return torch.empty(info["shape"], dtype=dtype)
    data, offset, planes = blob.numpy().tobytes(), 0, []
    for size in info["planes"]:
        planes.append(np.frombuffer(zlib.decompress(data[offset : offset + size]), dtype=np.uint8))
        offset += size
    raw = np.stack(planes, axis=1)  # [numel, element_size]
    return torch.from_numpy(raw.copy()).view(dtype).reshape(info["shape"])


# ----------------------------------------------------------------------------- writing

class StoreWriter:
    """Creates a store, or reopens an unfinished one made for the same spec, and writes its shards."""

    def __init__(self, path: str | Path, spec: StoreSpec, threads: int = 8):
        self.path, self.spec = Path(path), spec
        self.pool = ThreadPoolExecutor(threads) if spec.compression == "zlib" else None
        spec_file = self.path / "store.json"
        if self.path.exists() and not self.path.is_dir():
            raise StoreError(f"features.path={str(self.path)!r}: a file; expected a folder for the feature store")
        blocked = next((p for p in self.path.parents if p.exists() and not p.is_dir()), None)
        if blocked is not None:
            raise StoreError(f"features.path={str(self.path)!r}: {blocked} is a file; expected a folder for the feature store")
        if spec_file.exists():
            check_spec(read_json(spec_file, "a feature store spec (store.json)"), asdict(spec), self.path)
        else:
            # shards (or a complete.json) without their spec: written for inputs no file here records any more; taken as
            # done under a new store.json, they would be served as this run's features (same shapes: silently)
            orphans = sorted(p.relative_to(self.path).as_posix() for p in (*self.path.glob("*/shard_*"), self.path / "complete.json")
                             if p.exists())
            if orphans:
                raise StoreError(f"features.path={str(self.path)!r}: no store.json, but {len(orphans)} file(s) of an earlier "
                                 f"store ({', '.join(orphans[:2])}{', ...' if len(orphans) > 2 else ''}) whose inputs are "
                                 "unknown; expected an empty folder or a whole store: delete the folder, or point "
                                 "features.path elsewhere")
            with atomic_open(spec_file) as f:
                json.dump(asdict(spec), f, indent=2)

    def remove_leftovers(self) -> list[Path]:
        """Delete the hidden temporary files a killed writer left (call before any rank writes)."""
        found = [p for split in self.spec.rows for p in (self.path / split).glob(".shard_*")]
        for p in found:
            p.unlink(missing_ok=True)
        return found

    def is_done(self, split: str, shard: int) -> bool:
        return shard_file(self.path, split, shard).with_suffix(".json").exists()

    def pending(self, split: str, rank: int = 0, world: int = 1) -> list[int]:
        """This rank's shards (every world-th) that have no completion mark yet."""
        return [s for s in range(rank, self.spec.num_shards(split), world) if not self.is_done(split, s)]

    def write_shard(self, split: str, shard: int, tensors: dict[str, torch.Tensor], tokens: int) -> dict[str, Any]:
        """Write one shard (temp name, rename), then its completion mark."""
        info: dict[str, Any] = {"format_version": FORMAT_VERSION, "compression": self.spec.compression}
        if self.pool is not None:
            names = list(tensors)
            packed = list(self.pool.map(compress_tensor, (tensors[n] for n in names)))
            tensors = {n: blob for n, (blob, _) in zip(names, packed)}
            info["tensors"] = {n: meta for n, (_, meta) in zip(names, packed)}
        # One metadata key: safetensors writes its metadata map in no fixed order, and a shard's bytes
        # (its checksum) must not depend on the process that wrote it.
        blob = safetensors_bytes(tensors, metadata={"swa_features": json.dumps(info, sort_keys=True)})
        final = shard_file(self.path, split, shard)
        with atomic_open(final, "wb") as f:
            f.write(blob)
        mark = {"rows": [self.spec.shard_rows(split, shard).start, self.spec.shard_rows(split, shard).stop],
                "tokens": tokens, "bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
        with atomic_open(final.with_suffix(".json")) as f:
            json.dump(mark, f)
        return mark

    def finish(self) -> dict[str, Any]:
        """Check every shard is there; write ``complete.json`` with the totals."""
        totals = {"tokens": 0, "bytes": 0, "shards": 0}
        for split in self.spec.rows:
            for shard in range(self.spec.num_shards(split)):
                mark_file = shard_file(self.path, split, shard).with_suffix(".json")
                if not mark_file.exists():
                    raise StoreError(f"{mark_file}: shard not written yet (run the writer again to finish the store)")
                mark = read_json(mark_file, "a shard's completion mark", ("tokens", "bytes"))
                totals["tokens"] += mark["tokens"]
                totals["bytes"] += mark["bytes"]
                totals["shards"] += 1
        totals["bytes_per_token"] = totals["bytes"] / max(1, totals["tokens"])
        with atomic_open(self.path / "complete.json") as f:
            json.dump(totals, f, indent=2)
        return totals


def check_spec(stored: dict[str, Any], asked: dict[str, Any], path: Path) -> None:
    """One line naming the first field that differs."""
    for key in asked:
        if stored.get(key) != asked[key]:
            raise StoreError(f"{path / 'store.json'}: field {key!r} is {stored.get(key)!r}, but this run needs {asked[key]!r} "
                             f"(the store was made for other inputs; write a new one or point features.path elsewhere)")


# ----------------------------------------------------------------------------- reading

def unreadable_store(path: str | Path) -> str | None:
    """Why ``path`` holds no complete store (one line naming it), or None: the trainer asks before it loads the target."""
    path = Path(path)
    spec_file = path / "store.json"
    if not spec_file.exists():
        return (f"features.path={str(path)!r}: no feature store there (expected {spec_file}; "
                "write one with python -m train.features)")
    if not (path / "complete.json").exists():
        return (f"features.path={str(path)!r}: the store is unfinished (no complete.json); "
                "run the same python -m train.features command again to finish it")
    return None


def unreadable_shard(file: Path, e: Exception, key: str | None = None) -> StoreError:
    """A shard safetensors or the inflating cannot read, as one line naming it (and the tensor, if one was asked for)."""
    reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return StoreError(f"{file}: not a readable feature shard ({f'tensor {key!r}: ' if key else ''}{type(e).__name__}"
                      f"{': ' + reason if reason else ''}); delete it and its .json and rerun python -m train.features "
                      "(features.verify=true checks every shard's sha256 when the store opens)")


class FeatureStore:
    """Reads a complete store: ``gather(split, rows, length)`` -> zero-padded [B, length, F] batches."""

    def __init__(self, path: str | Path, verify: bool = True, open_shards: int = 64, threads: int = 8):
        self.path = Path(path)
        problem = unreadable_store(self.path)
        if problem is not None:
            raise StoreError(problem)
        spec_file, complete = self.path / "store.json", self.path / "complete.json"
        try:
            self.spec = StoreSpec(**json.loads(spec_file.read_text()))
        except (TypeError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise StoreError(f"{spec_file}: not a feature store spec this code reads ({e})") from None
        if self.spec.format_version != FORMAT_VERSION:
            raise StoreError(f"{spec_file}: format_version {self.spec.format_version}; this code reads {FORMAT_VERSION}")
        self.totals = read_json(complete, "the store's totals (complete.json)", ("tokens", "bytes_per_token"))
        self.open_shards = open_shards
        self._handles: OrderedDict[tuple[str, int], Any] = OrderedDict()
        self.pool = ThreadPoolExecutor(threads)  # hashing, reading and inflating release the GIL
        if verify:
            self.verify_all()

    def shard_files(self) -> list[Path]:
        return [shard_file(self.path, split, shard) for split in self.spec.rows for shard in range(self.spec.num_shards(split))]

    def verify_all(self) -> None:
        """Every shard's sha256 against its mark, in parallel threads, before any row is read."""
        def check(file: Path) -> None:
            mark_file = file.with_suffix(".json")
            if not file.exists() or not mark_file.exists():
                raise StoreError(f"{file}: missing from a store marked complete")
            expected = read_json(mark_file, "a shard's completion mark", ("sha256",))["sha256"]
            digest = file_sha256(file)
            if digest != expected:
                raise StoreError(f"{file}: sha256 {digest[:16]}… does not match {mark_file.name}'s {expected[:16]}… "
                                 "(corrupt shard; delete it and its .json and rerun the writer)")

        list(self.pool.map(check, self.shard_files()))

    def check(self, asked: StoreSpec, fields: Iterable[str]) -> None:
        """The trainer's inputs must be the store's (target, layers, data, shapes)."""
        stored = asdict(self.spec)
        check_spec(stored, {k: getattr(asked, k) for k in fields}, self.path)

    def _shard(self, split: str, shard: int):
        key = (split, shard)
        if key in self._handles:
            self._handles.move_to_end(key)
            return self._handles[key]
        file = shard_file(self.path, split, shard)
        if not file.exists():
            raise StoreError(f"{file}: missing from a store marked complete")
        try:  # features.verify=false reads a cut or overwritten shard as is: safetensors' error, a traceback mid-training
            handle = safe_open(str(file), framework="pt")
            compressed = json.loads(handle.metadata()["swa_features"]).get("tensors", {})  # name -> compress_tensor metadata
        except Exception as e:  # noqa: BLE001 - SafetensorError, KeyError, JSONDecodeError, TypeError: one line each
            raise unreadable_shard(file, e) from None
        self._handles[key] = handle, compressed
        if len(self._handles) > self.open_shards:
            self._handles.popitem(last=False)
        return handle, compressed

    def _check_row(self, split: str, row: int) -> None:
        if not 0 <= row < self.spec.rows.get(split, 0):
            raise StoreError(f"{self.path}: {split} row {row} is outside the store ({self.spec.rows.get(split, 0)} rows)")

    def row(self, split: str, row: int, name: str = "features", opened: tuple[Any, dict] | None = None) -> torch.Tensor:
        """One row's tensor; ``opened``: its shard's (handle, compressed) as ``_shard`` returned it (from reader threads,
        which must not touch the handle cache)."""
        self._check_row(split, row)
        handle, compressed = opened or self._shard(split, row // self.spec.rows_per_shard)
        key = f"{row}.{name}"
        try:
            t = handle.get_tensor(key)
            if key in compressed:
                t = decompress_tensor(t, compressed[key])
        except Exception as e:  # noqa: BLE001 - a shard of another store (no such tensor), corrupt deflated planes
            raise unreadable_shard(shard_file(self.path, split, row // self.spec.rows_per_shard), e, key) from None
        return t

    def gather(self, split: str, rows: list[int], length: int, device: torch.device | str = "cpu"):
        """-> (features [B, length, k*H], final_hidden [B, length, H] or None), zeros past each row's end."""
        from models.target import TargetFeatures

        names = ["features"] + (["final_hidden"] if self.spec.with_final_hidden else [])
        out = {}
        for r in rows:
            self._check_row(split, r)
        # opened here, once, and handed to the threads: the handle cache (an OrderedDict, evicting past open_shards) is
        # not thread-safe, and a batch over more than open_shards shards had its threads reopen and evict concurrently
        opened = {shard: self._shard(split, shard) for shard in sorted({r // self.spec.rows_per_shard for r in rows})}
        for name in names:
            parts = list(self.pool.map(lambda r: self.row(split, r, name, opened[r // self.spec.rows_per_shard]), rows))
            width = parts[0].shape[-1]
            batch = torch.zeros(len(rows), length, width, dtype=parts[0].dtype, pin_memory=torch.device(device).type == "cuda")
            for i, p in enumerate(parts):
                if p.shape[0] > length:
                    raise StoreError(f"{self.path}: {split} row {rows[i]} has {p.shape[0]} tokens, more than the batch's {length}")
                batch[i, : p.shape[0]] = p
            out[name] = batch.to(device, non_blocking=True)
        return TargetFeatures(features=out["features"], logits=None, final_hidden=out.get("final_hidden"))
