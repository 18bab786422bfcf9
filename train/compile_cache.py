"""``trainer.compile_cache``: torch.compile's compiled artifacts kept in one file, loaded at the next start.

On a fresh machine the small-target EAGLE-3 step (TTT 10 on flex attention) compiled cold for ~8 minutes of a 9.5-minute
H100 call before its first ten steps were done (BENCHMARKS.md, "2026-12-06, eighth session"); a machine that had
compiled it before ran two such runs side by side, compile, warm-up and timing, in under 6 minutes, from Inductor's
on-disk cache (``/tmp/torchinductor_$USER``), which a fresh machine lacks. torch's portable cache ("mega-cache": ``torch.compiler.save_cache_artifacts`` /
``load_cache_artifacts``, public since torch 2.7) carries Inductor's graphs, Triton's kernels and AOTAutograd's entries
to another machine with the same GPU and software. This file holds them with the versions they were built with; a file
from another torch, Triton, CUDA or GPU is skipped (said once, loudly) and overwritten by this run's.

Saved once per process, after the first optimizer step (the training step's graphs, forward and backward, the bulk of
the compile): each ``save_cache_artifacts`` call appends one block per artifact kind to what it returns, and
``load_cache_artifacts`` keeps only the last block of each kind (torch 2.7-2.13), so a second save would hide the
step's graphs behind later compiles (evaluation, recompiles). Graphs compiled after the first step are compiled again
at the next start. Each process of a multi-GPU run keeps a file of its own (``PATH.rank{k}``): torch's cache keys hold
the device index, so rank k's graphs on ``cuda:k`` never match rank 0's.

File layout: ``MAGIC``, an 8-byte little-endian header length, the JSON header, then torch's bytes. Written to a
temporary name and renamed (``common.atomic.atomic_open``: a run killed mid-write leaves the old file).
"""

from __future__ import annotations

import json
import logging
import os
import struct
from pathlib import Path

import torch

from common.atomic import atomic_open, unwritable_reason

log = logging.getLogger(__name__)

MAGIC = b"swa-drafters compile cache v1\n"


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


def read(path: Path) -> tuple[dict, bytes]:
    """The header and torch's bytes of a cache file; ``CompileCacheError`` (one line) for anything else."""
    raw = path.read_bytes()
    expected = "expected a file trainer.compile_cache wrote, or a path that does not exist yet"
    if not raw.startswith(MAGIC) or len(raw) < len(MAGIC) + 8:
        raise CompileCacheError(f"trainer.compile_cache={str(path)!r}: not a compile cache ({len(raw)} bytes, no header); {expected}")
    (size,) = struct.unpack("<Q", raw[len(MAGIC):len(MAGIC) + 8])
    start = len(MAGIC) + 8
    try:
        header = json.loads(raw[start:start + size])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CompileCacheError(f"trainer.compile_cache={str(path)!r}: unreadable header ({exc}); {expected}") from None
    payload = raw[start + size:]
    if not isinstance(header, dict) or header.get("bytes") != len(payload):
        raise CompileCacheError(f"trainer.compile_cache={str(path)!r}: cut short ({len(payload)} bytes of artifacts, the header says "
                                f"{header.get('bytes') if isinstance(header, dict) else '?'}); {expected}")
    return header, payload


class CompileCache:
    """``load`` once before anything compiles; ``save`` once compiled (the trainer: after its first optimizer step). A
    path of None does nothing."""

    def __init__(self, path: str | os.PathLike | None, device: torch.device):
        self.path = None if path is None else Path(path).expanduser()
        self.device = device
        self.saved = False
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
        header, payload = read(self.path)
        here = environment(self.device)
        if header.get("environment") != here:
            log.warning("compile cache %s was built with %s; this run has %s: compiling cold (the file is rewritten)",
                        self.path, header.get("environment"), here)
            return 0
        info = torch.compiler.load_cache_artifacts(payload)
        count = 0 if info is None else sum(len(v) for v in info.artifacts.values())
        log.info("compile cache %s: %d compiled artifacts loaded (%.1f MB)", self.path, count, len(payload) / 1e6)
        return count

    def save(self) -> int:
        """Write every artifact this process compiled, or loaded and used, so far: once a process (see the module's
        docstring), later calls do nothing. Returns the bytes written (0: none). A failed write is said and training
        goes on."""
        if self.path is None or self.saved:
            return 0
        self.saved = True
        result = torch.compiler.save_cache_artifacts()
        if result is None:
            log.warning("compile cache %s: nothing was compiled (or torch recorded nothing to cache); no file written", self.path)
            return 0
        payload, _ = result
        header = json.dumps({"environment": environment(self.device), "bytes": len(payload)}).encode()
        try:
            with atomic_open(self.path, "wb", encoding=None) as f:
                f.write(MAGIC + struct.pack("<Q", len(header)) + header + payload)
        except OSError as exc:
            log.warning("compile cache %s: not written (%s); training goes on", self.path, exc)
            return 0
        log.info("compile cache %s: saved %.1f MB", self.path, len(payload) / 1e6)
        return len(payload)
