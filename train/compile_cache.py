"""``trainer.compile_cache``: torch.compile's compiled artifacts kept in one file, loaded at the next start.

On a fresh machine the small-target EAGLE-3 step (TTT 10 on flex attention) compiled cold for ~8 minutes of a 9.5-minute
H100 call before its first ten steps were done (BENCHMARKS.md, "2026-12-06, eighth session"); a machine that had
compiled it before ran two such runs side by side, compile, warm-up and timing, in under 6 minutes, from Inductor's
on-disk cache (``/tmp/torchinductor_$USER``), which a fresh machine lacks. torch's portable cache ("mega-cache": ``torch.compiler.save_cache_artifacts`` /
``load_cache_artifacts``, public since torch 2.7) carries Inductor's graphs, Triton's kernels and AOTAutograd's entries
to another machine with the same GPU and software. This file holds them with the versions they were built with; a file
from another torch, Triton, CUDA or GPU is skipped (said once, loudly) and overwritten by this run's.

Saved after the first optimizer step (the training step's graphs, forward and backward, the bulk of the compile), and
again after each evaluation and at the end, each time something new was compiled: the held-out evaluation at the end of
SmolLM2's EAGLE-3 run took ~150 s of a fresh H200 even with the step's graphs loaded (its eager unroll compiles flex
attention at each TTT step's key length; not profiled: BENCHMARKS.md, "2026-12-06, ninth session"). torch's bytes
cannot simply be rewritten each time: each ``save_cache_artifacts`` call appends one block per artifact kind, holding
what was recorded since the call before, and ``load_cache_artifacts`` keeps only the last block of each kind (torch
2.7-2.13), so the latest bytes alone would hide the step's graphs. The file keeps every save's bytes
instead and loads them in order. A save's bytes extend the save's before them after a short head (torch's checksum),
so only the head and the new tail are stored; that is checked byte for byte at save time, and a save that does not
extend the one before is not kept (said once; the file keeps what was saved before). The process holds its last save's
bytes to check the next against (574 MB for SmolLM2's EAGLE-3 step) and the first bytes of each earlier one.

A process that loaded a file writes it only once it has compiled something the file could not serve, as torch's own
miss counters tell (``torch._dynamo.utils.counters``, not a public API: where they cannot be read, said once, every save
writes). It then keeps ahead of its own saves each run of loaded saves (one process's) that holds an artifact it never
used, so graphs it never reached (an evaluation a time limit cut off) stay in the file; a run it used whole is dropped,
so the file does not grow with every warm run. A failed write is said and tried again at the next save, also after a
save that was not kept. A header whose lengths or heads cannot describe saves is refused in one line.

Each process of a multi-GPU run keeps a file of its own (``PATH.rank{k}``): torch's cache keys hold the device index,
so rank k's graphs on ``cuda:k`` never match rank 0's.

File layout: ``MAGIC``, an 8-byte little-endian header length, the JSON header (the environment, and per save its
length, its head's length, its SHA-256, and ``whole`` where a run of saves starts), then each save's stored bytes
(the first of a run whole; each later one its head and its new tail). Written to a temporary name and renamed (``common.atomic.atomic_open``: a run killed mid-write leaves
the old file).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
from pathlib import Path

import torch

from common.atomic import atomic_open, unwritable_reason

log = logging.getLogger(__name__)

MAGIC = b"swa-drafters compile cache v2\n"
# how many leading bytes of a save may differ from the save before it (torch 2.7-2.13: a 4-byte CRC32 of the rest)
HEADS = (0, 4, 8, 16, 32, 64)
PREFIX = max(HEADS)


class CompileCacheError(ValueError):
    """A ``trainer.compile_cache`` path that cannot serve: a file this module did not write, a folder, or unwritable."""


def environment(device: torch.device) -> dict[str, str | None]:
    """What the compiled artifacts depend on: torch, Triton, CUDA and the GPU."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {"torch": torch.__version__, "triton": triton_version, "cuda": torch.version.cuda, "gpu": gpu}


def caches_off() -> list[str]:
    """torch's settings that turn the caches this file fills off (then nothing is written, or nothing loaded is used)."""
    off = []
    compiler_config = getattr(torch.compiler, "config", None)
    if getattr(compiler_config, "force_disable_caches", False):
        off.append("torch.compiler.config.force_disable_caches (TORCHINDUCTOR_FORCE_DISABLE_CACHES)")
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    if getattr(inductor_config, "fx_graph_cache", True) is False:
        off.append("Inductor's fx_graph_cache (TORCHINDUCTOR_FX_GRAPH_CACHE=0)")
    if getattr(functorch_config, "enable_autograd_cache", True) is False:
        off.append("AOTAutograd's enable_autograd_cache (TORCHINDUCTOR_AUTOGRAD_CACHE=0)")
    return off


def rank_path(path: str | os.PathLike | None, local_rank: int, world_size: int) -> Path | None:
    """The file of this process: ``path`` itself on one process, ``path.rank{local_rank}`` on several."""
    if path is None:
        return None
    path = Path(path).expanduser()
    return path if world_size == 1 else path.with_name(f"{path.name}.rank{local_rank}")


OLDER = b"swa-drafters compile cache v"  # an earlier layout of this file: skipped and rewritten, not refused
EXPECTED = "expected a file trainer.compile_cache wrote, or a path that does not exist yet"


def read(path: Path, check_saves: bool = True) -> tuple[dict, bytes]:
    """The header and the stored bytes of a cache file, every save rebuilt and checked against its SHA-256 (unless
    ``check_saves`` is False: then ``saved_blobs(..., path)`` checks each as it rebuilds it); ``CompileCacheError``
    (one line) for anything else."""
    raw = path.read_bytes()
    expected = EXPECTED
    if not raw.startswith(MAGIC) or len(raw) < len(MAGIC) + 8:
        raise CompileCacheError(f"trainer.compile_cache={str(path)!r}: not a compile cache ({len(raw)} bytes, no header); {expected}")
    (size,) = struct.unpack("<Q", raw[len(MAGIC):len(MAGIC) + 8])
    start = len(MAGIC) + 8
    try:
        header = json.loads(raw[start:start + size])
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        detail = f"{type(exc).__name__}: {exc}"[:200]
        raise CompileCacheError(f"trainer.compile_cache={str(path)!r}: unreadable header ({detail}); {expected}") from None
    stored = raw[start + size:]
    saves = header.get("saves") if isinstance(header, dict) else None
    if not isinstance(saves, list) or not saves or not all(isinstance(x, dict) for x in saves):
        raise CompileCacheError(f"trainer.compile_cache={str(path)!r}: unreadable header (no list of saves); {expected}")
    for i, x in enumerate(saves):
        if (reason := save_entry_problem(saves, i)):
            raise CompileCacheError(f"trainer.compile_cache={str(path)!r}: unreadable header (save {i + 1} of {len(saves)}: "
                                    f"{reason}); {expected}")
    want = sum(stored_size(saves, i) for i in range(len(saves)))
    if want != len(stored):
        what = "cut short" if len(stored) < want else "longer than its header says"
        raise CompileCacheError(f"trainer.compile_cache={str(path)!r}: {what} ({len(stored)} bytes of artifacts, the header says "
                                f"{want}); {expected}")
    if check_saves:
        for _ in saved_blobs(header, stored, path):  # each save rebuilt once and checked, one in memory at a time
            pass
    return header, stored


def save_entry_problem(saves: list[dict], i: int) -> str | None:
    """What is wrong with the header entry of save ``i`` (None: nothing): lengths and heads are integers, each later save
    of a run longer than the one before and its head shorter than it and at most PREFIX bytes."""
    x = saves[i]

    def integer(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if not (integer(x.get("length")) and x["length"] > 0 and integer(x.get("head")) and x["head"] >= 0
            and isinstance(x.get("sha256"), str) and isinstance(x.get("whole", False), bool)):
        return "expected a positive integer length, an integer head >= 0, a sha256 string and an optional whole flag"
    if i > 0 and not x.get("whole"):
        prev = saves[i - 1]["length"]
        if not (x["head"] <= PREFIX and x["head"] < prev < x["length"]):
            return f"head {x['head']} and length {x['length']} do not extend the save before it ({prev} bytes)"
    return None


def stored_size(saves: list[dict], i: int) -> int:
    """How many bytes save ``i`` takes in the file: all of them for a save stored whole (the first, or one that starts a
    new run of saves: ``"whole"``), else its head and its new tail."""
    if i == 0 or saves[i].get("whole"):
        return saves[i]["length"]
    return saves[i]["head"] + saves[i]["length"] - saves[i - 1]["length"]


def saved_blobs(header: dict, stored: bytes, path: Path | None = None):
    """Each save's bytes as torch returned them, in order: a save stored whole as it is; each later one its stored head,
    the save before it past that head, its stored new tail. With ``path``, each is checked against its length and
    SHA-256 before it is yielded (``CompileCacheError`` naming the file)."""
    saves, prev, at = header["saves"], b"", 0
    for i, x in enumerate(saves):
        size = stored_size(saves, i)
        if i == 0 or x.get("whole"):
            blob = stored[at:at + size]
        else:
            blob = stored[at:at + x["head"]] + prev[x["head"]:] + stored[at + x["head"]:at + size]
        at += size
        if path is not None and (len(blob) != x["length"] or hashlib.sha256(blob).hexdigest() != x["sha256"]):
            raise CompileCacheError(f"trainer.compile_cache={str(path)!r}: save {i + 1} of {len(saves)} does not match its "
                                    f"checksum (a damaged file); {EXPECTED}")
        yield blob
        prev = blob


def compile_misses() -> int | None:
    """How many compiles torch's caches could not serve so far in this process (Inductor's FX graphs, AOTAutograd's
    entries, its guard misses), from torch's counters (``torch._dynamo.utils.counters``, not a public API: None when
    they are not there, and the caller says so)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return None
    try:
        return (int(counters["inductor"]["fxgraph_cache_miss"]) + int(counters["aot_autograd"]["autograd_cache_miss"])
                + int(counters["aot_autograd"]["autograd_cache_guard_miss"]))
    except (KeyError, TypeError, ValueError):
        return None


def artifact_keys(info) -> set[tuple[str, str]]:
    """(kind, key) of every artifact a torch ``CacheInfo`` lists."""
    return set() if info is None else {(kind, key) for kind, keys in info.artifacts.items() for key in keys}


class CompileCache:
    """``load`` once before anything compiles; ``save`` whenever something may have been compiled since (the trainer:
    after its first optimizer step, after each evaluation, at the end). A path of None does nothing."""

    def __init__(self, path: str | os.PathLike | None, device: torch.device):
        self.path = None if path is None else Path(path).expanduser()
        self.device = device
        # this process's saves: per save its header entry and its first PREFIX bytes, and the last save's whole bytes
        # (every save past PREFIX bytes is the last one's: each save is checked to extend the one before past its head)
        self.saves: list[dict] = []
        self.prefixes: list[bytes] = []
        self.last: bytes | None = None
        self.loaded: set[tuple[str, str]] = set()  # the artifacts the loaded file held
        self.loaded_saves: list[dict] = []  # the loaded file's header entries
        # the loaded file's runs of saves (a run starts at its first save or at a "whole" one): (first, end) indices into
        # loaded_saves and the artifacts the run holds; a run holding one this process has not used is kept ahead of its
        # own saves when it writes
        self.loaded_runs: list[tuple[int, int, set[tuple[str, str]]]] = []
        self.own_keys: set[tuple[str, str]] = set()  # the artifacts this process's last save recorded
        self.misses_at_load: int | None = None
        self.written = False  # this process has written the file (then every later save with something new rewrites it)
        self.pending = False  # a write failed: the next save tries again
        self.broken = False  # a save did not extend the one before: no later save is kept
        self.warned: set[str] = set()
        if self.path is None:
            return
        # refused at start, not after the first step's compile (minutes on a GPU)
        if self.path.is_dir():
            raise CompileCacheError(f"trainer.compile_cache={str(self.path)!r}: a folder; expected a file path (new, or one "
                                    "trainer.compile_cache wrote)")
        if (reason := unwritable_reason(self.path)):
            raise CompileCacheError(f"trainer.compile_cache={str(self.path)!r}: {reason}; expected a path the compiled "
                                    "artifacts can be written to")
        if (off := caches_off()):  # the API itself is public since torch 2.7 (pyproject asks for >= 2.11)
            log.warning("trainer.compile_cache=%s: torch's caches are off (%s); nothing will be saved or used",
                        self.path, "; ".join(off))
            self.path = None

    def load(self) -> int:
        """Load the file's artifacts into this process's caches; returns how many (0: none, or skipped)."""
        if self.path is None:
            return 0
        if not self.path.exists():
            log.info("compile cache %s: none yet; compiling cold, and saving there once compiled", self.path)
            return 0
        with self.path.open("rb") as f:
            start = f.read(len(MAGIC))
        if start.startswith(OLDER) and start != MAGIC:
            log.warning("compile cache %s was written by an earlier layout (%s): compiling cold (the file is rewritten)",
                        self.path, start.decode(errors="replace").strip())
            return 0
        header, stored = read(self.path, check_saves=False)  # each save checked below as it is rebuilt, once
        here = environment(self.device)
        if header.get("environment") != here:
            log.warning("compile cache %s was built with %s; this run has %s: compiling cold (the file is rewritten)",
                        self.path, header.get("environment"), here)
            return 0
        for i, blob in enumerate(saved_blobs(header, stored, self.path)):  # in order: each the last block of each kind it recorded
            keys = artifact_keys(torch.compiler.load_cache_artifacts(blob))
            if i == 0 or header["saves"][i].get("whole"):
                self.loaded_runs.append((i, i + 1, set()))
            first, _, run_keys = self.loaded_runs[-1]
            self.loaded_runs[-1] = (first, i + 1, run_keys | keys)
            self.loaded |= keys
        self.loaded_saves = header["saves"]
        self.misses_at_load = compile_misses()
        log.info("compile cache %s: %d compiled artifacts loaded from %d save(s) (%.1f MB)", self.path, len(self.loaded),
                 len(header["saves"]), len(stored) / 1e6)
        return len(self.loaded)

    def warn_once(self, what: str, message: str, *args) -> None:
        if what not in self.warned:
            self.warned.add(what)
            log.warning(message, *args)

    def compiled_since_load(self) -> bool:
        """Whether this process compiled anything its loaded file could not serve (True when that cannot be told)."""
        misses = compile_misses()
        if misses is None or self.misses_at_load is None:
            self.warn_once("counters", "compile cache %s: torch's cache counters (torch._dynamo.utils.counters) are not "
                           "readable in torch %s; the file is rewritten at every save that records something", self.path,
                           torch.__version__)
            return True
        return misses > self.misses_at_load

    def save(self) -> int:
        """Record what this process compiled, or loaded and used, since its last save, and write the file when that holds
        something the file lacks (see the module's docstring). Returns the bytes written (0: nothing written). A failed
        write is said, tried again at the next save, and training goes on."""
        if self.path is None:
            return 0
        if self.broken:  # no later save is kept; a failed write of the earlier ones is still tried again
            return self.write() if self.pending else 0
        result = torch.compiler.save_cache_artifacts()
        if result is None:
            self.warn_once("nothing", "compile cache %s: nothing was compiled (or torch recorded nothing to cache); no file "
                           "written", self.path)
            return 0
        payload, info = result
        if self.last is None:
            head = 0
        else:
            prev = self.last
            if len(payload) == len(prev) and memoryview(payload) == memoryview(prev):
                return self.write() if self.pending else 0  # nothing recorded since the last save
            # (a head as long as the save before would share nothing with it: not an extension)
            head = next((h for h in HEADS if h < len(prev) < len(payload)
                         and memoryview(payload)[h:len(prev)] == memoryview(prev)[h:]), None)
            if head is None:
                self.broken = True
                log.warning("compile cache %s: torch's bytes of this save do not extend those of the save before (%d bytes "
                            "after %d): not kept, nor any later save; the file keeps what was saved before", self.path,
                            len(payload), len(prev))
                return self.write() if self.pending else 0
        self.saves.append({"length": len(payload), "head": head, "sha256": hashlib.sha256(payload).hexdigest()})
        self.prefixes.append(payload[:PREFIX])
        self.last = payload
        self.own_keys = artifact_keys(info)  # cumulative: everything this process recorded so far
        if self.loaded_saves and not self.written and not self.pending and not self.compiled_since_load():
            return 0  # everything this process used came from the file: nothing new to write
        return self.write()

    def own_pieces(self):
        """This process's saves as the file stores them, each a list of byte strings (views of ``last`` past PREFIX)."""
        last = memoryview(self.last)
        for i, x in enumerate(self.saves):
            prefix = self.prefixes[i]

            def span(lo: int, hi: int, prefix=prefix) -> list:  # bytes lo..hi of save i
                parts = [prefix[lo:min(hi, PREFIX)]] if lo < PREFIX else []
                return parts + ([last[max(lo, PREFIX):hi]] if hi > PREFIX else [])

            yield span(0, x["length"]) if i == 0 else span(0, x["head"]) + span(self.saves[i - 1]["length"], x["length"])

    def kept_runs(self) -> tuple[list[dict], list[bytes], list]:
        """The loaded file's runs of saves that hold an artifact this process has not recorded (graphs it never
        reached, such as an evaluation a time limit cut off): their header entries and stored bytes, read back from the
        file (unchanged since the load, or none are kept, said once), and the runs as they will sit in the new file."""
        runs = [(first, end, keys) for first, end, keys in self.loaded_runs if keys - self.own_keys]
        if not runs:
            return [], [], []
        try:
            header, stored = read(self.path)
            if header["saves"][:len(self.loaded_saves)] != self.loaded_saves:
                raise CompileCacheError("changed since it was loaded")
        except (OSError, CompileCacheError) as exc:
            self.warn_once("kept", "compile cache %s: the saves it held when loaded are not kept (%s)", self.path, exc)
            return [], [], []
        offsets = [0]
        for i in range(len(self.loaded_saves)):
            offsets.append(offsets[-1] + stored_size(self.loaded_saves, i))
        saves, pieces, placed = [], [], []
        for first, end, keys in runs:
            run = [dict(x) for x in self.loaded_saves[first:end]]
            run[0]["whole"] = True
            placed.append((len(saves), len(saves) + len(run), keys))
            saves += run
            pieces.append(stored[offsets[first]:offsets[end]])
        return saves, pieces, placed

    def write(self) -> int:
        kept_saves, kept_pieces, placed = self.kept_runs() if self.loaded_runs else ([], [], [])
        own = [dict(x) for x in self.saves]
        if kept_saves:
            own[0]["whole"] = True  # this process's first save starts a new run of saves after the loaded ones
        header = json.dumps({"environment": environment(self.device), "saves": kept_saves + own}).encode()
        size = sum(map(len, kept_pieces))
        try:
            with atomic_open(self.path, "wb", encoding=None) as f:
                f.write(MAGIC + struct.pack("<Q", len(header)) + header)
                for piece in kept_pieces:
                    f.write(piece)
                for parts in self.own_pieces():
                    for part in parts:
                        f.write(part)
                        size += len(part)
        except OSError as exc:
            self.pending = True
            log.warning("compile cache %s: not written (%s); tried again at the next save; training goes on", self.path, exc)
            return 0
        self.written, self.pending = True, False
        # the next write reads the kept runs back from the file as written now
        self.loaded_saves, self.loaded_runs = kept_saves, placed
        log.info("compile cache %s: saved %.1f MB (%d save(s))", self.path, size / 1e6, len(kept_saves) + len(own))
        return size
