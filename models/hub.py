"""Hub ids on a machine that cannot reach the hub: answered in a second, not after the hub client's retries.

Offline (a cluster's compute nodes, an air-gapped box), ``from_pretrained("Qwen/Qwen3-8B")`` asks the hub for each file
and retries every refused connection with back-off: ~50 s before transformers says it found nothing, and as long again
for a model that *is* in the local cache. Before loading a hub id, one connection to the hub's host is tried (a few
milliseconds online): unreachable, a cached model loads from the cache alone (``local_files_only``) and an uncached one
fails at once, in one line naming the id. Where a proxy is configured the proxy resolves the host, so nothing is tried
and the hub client decides, as it does when ``HF_HUB_OFFLINE`` says offline already.

Hub dataset ids (``data.path``) the same way: unreachable, a dataset in the hub cache loads from its snapshot folder and
an uncached one fails at once (``dataset_folder``); declared offline too, where datasets alone would not look there.

Public API only: ``huggingface_hub.try_to_load_from_cache``, ``snapshot_download(local_files_only=True)`` and
transformers' ``local_files_only``.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

log = logging.getLogger(__name__)

PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
PROBE_TIMEOUT_S = 3.0


def is_hub_id(path: str) -> bool:
    """``owner/name`` (or ``name``) that is not a local path: what transformers would look up on the hub. A name whose
    first part is a local folder (``outputs/run`` with ``outputs/`` here) is a local path with a typo, not a hub id."""
    return not (Path(path).exists() or Path(path).is_absolute() or path.startswith((".", "~")) or path.count("/") > 1
                or ("/" in path and Path(path.split("/")[0]).exists()))


def check_target_folder(path: str, what: str) -> None:
    """A local target path that is no model folder, in one line naming ``what`` (``target.path``, ``--target``, or the
    record it came from): transformers answers an empty or wrong folder with five lines about tokenizers, a missing one
    as a malformed hub id. Hub ids and ``builtin:`` names pass (the loader or the builtin build answers for them)."""
    local = Path(path)
    if not path.startswith("builtin:") and not is_hub_id(path) and not (local / "config.json").is_file():
        why = "no config.json there" if local.is_dir() else "a file, not a folder" if local.exists() else "no such folder"
        raise ValueError(f"{what}={path!r}: {why}; expected a Hugging Face model folder (config.json, weights, tokenizer)")


def offline_reason() -> str | None:
    """``HF_HUB_OFFLINE=1`` (or ``TRANSFORMERS_OFFLINE``) as it was set, or None when neither declares the hub offline."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        value = os.environ.get(name, "").strip()
        if value.lower() in ("1", "true", "yes", "on"):
            return f"{name}={value} declares the hub offline"
    return None


def hub_host() -> str:
    return urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").hostname or "huggingface.co"


def unreachable() -> str | None:
    """Why the hub cannot be reached (one connection tried), or None: reachable, behind a proxy, or declared offline."""
    if offline_reason() or any(os.environ.get(v) for v in PROXY_VARIABLES):
        return None
    host = hub_host()
    try:
        socket.create_connection((host, 443), timeout=PROBE_TIMEOUT_S).close()
    except OSError as e:  # no DNS, refused, unreachable, timed out
        return f"{host} cannot be reached ({e.strerror or e})"
    return None


def cached(repo_id: str) -> bool:
    """The model's config.json is in the local hub cache (``HF_HUB_CACHE``)."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def cached_snapshot(repo_id: str) -> Path | None:
    """The local cache's snapshot folder of hub model ``repo_id`` at the revision ``refs/main`` names (what
    ``from_pretrained(repo_id)`` loads; offline, no request; its name is the revision's commit hash), or None where the
    cache holds none."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except (OSError, ValueError):  # not cached (LocalEntryNotFoundError, an OSError), no valid id (HFValidationError)
        return None


def local_files_only(path: str, what: str) -> bool:
    """For ``from_pretrained(path)``: True when ``path`` is a hub id, the hub cannot be reached and the model is cached
    (load it from the cache alone); False otherwise. Raises ValueError (one line, naming ``what=path``) for a hub id
    that is neither reachable nor cached."""
    if not is_hub_id(path):
        return False
    # declared offline, the hub client refuses an uncached id at once in words that blame the network: said here instead
    declared = offline_reason()
    reason = declared or unreachable()
    if reason is None:
        return False
    if not cached(path):
        raise ValueError(f"{what}={path!r}: not a local folder, not in the Hugging Face cache, and {reason}; download it "
                         f"where there is network (hf download {path}) or pass a local model folder")
    if declared:
        return False  # cached: the hub client reads its cache, offline as declared
    log.info("%s: %s; %s loads from the local Hugging Face cache", what, reason, path)
    return True


def dataset_folder(repo_id: str, what: str) -> str | None:
    """For ``datasets.load_dataset(repo_id)``: None where datasets should ask the hub (a local path, a reachable hub, a
    proxy). Where the hub cannot be reached, or ``HF_HUB_OFFLINE`` declares it offline: the dataset repository's snapshot
    in the local hub cache (where ``hf download --repo-type dataset`` and datasets 3+ keep a hub dataset's files, its docs'
    "Cache management"), which ``load_dataset`` reads as a local folder at once (by id, datasets 5.2 retried for ~23 s and
    then failed even with the files cached; declared offline it failed at once, OfflineModeIsEnabled). Without a snapshot:
    unreachable, a one-line ValueError naming ``what=repo_id``; declared offline, None (datasets' own cache may hold a copy
    it prepared online; ``offline_reason`` words its failure)."""
    if not is_hub_id(repo_id):
        return None
    declared = offline_reason()
    reason = declared or unreachable()
    if reason is None:
        return None
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = snapshot_download(repo_id, repo_type="dataset", local_files_only=True)
    except LocalEntryNotFoundError:
        if declared:
            return None
        raise ValueError(uncached_dataset(repo_id, what, f"not in the Hugging Face cache, and {reason}")) from None
    log.info("%s: %s; %s loads from its cached snapshot %s", what, reason, repo_id, folder)
    return folder


def uncached_dataset(repo_id: str, what: str, why: str) -> str:
    """The one line for a hub dataset id that neither the caches nor the hub can give now, ``why`` saying which held."""
    return (f"{what}={repo_id!r}: not a local file or folder, {why}; download it where there is network "
            f"(hf download {repo_id} --repo-type dataset) or pass a local file")


def download(repo_id: str, what: str) -> str:
    """The local folder of hub model ``repo_id`` (``huggingface_hub.snapshot_download``: the whole repository, or the
    cached snapshot alone when the hub cannot be reached); one line naming ``what=repo_id`` when neither works."""
    from huggingface_hub import snapshot_download

    offline = local_files_only(repo_id, what)
    try:
        return snapshot_download(repo_id, local_files_only=offline)
    except Exception as e:  # not found, gated, no network mid-way: huggingface_hub's errors, each its own class
        raise ValueError(f"{what}={repo_id!r}: not a local folder, and the hub did not give it ({type(e).__name__}: "
                         f"{' '.join(str(e).split())[:300]})") from None
