"""Conversation data: readers, chat rendering with loss masks, tokenized cache, regeneration."""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

from filelock import FileLock

from common.atomic import unwritable_reason

from .chat import ChatRenderer
from .dataset import cache_key, load_tokenized, pack_conversations, resolve_source, source_fingerprint, split_train_eval
from .readers import Conversation, DataError, read_conversations
from .regenerate import (REPLIES_VERSION, partial_files, regenerate_conversations, regenerate_in_processes, reply_engine,
                         target_fingerprint, write_jsonl_atomic)

log = logging.getLogger(__name__)

__all__ = ["ChatRenderer", "Conversation", "DataError", "prepare_data", "read_conversations"]


def regenerate_key(regen: Any) -> dict[str, Any]:
    """The settings that change the replies: how they travel (concurrency, the vLLM interpreter, steps per host sync,
    runs queued ahead) does not."""
    settings = asdict(regen) if hasattr(regen, "__dataclass_fields__") else dict(regen)
    for how in ("concurrency", "vllm_python", "run_steps", "run_ahead"):
        settings.pop(how, None)
    if settings.get("engine", "hf") != "hf":
        settings.pop("batch_size", None)
    # processes split the prompts: our loop's replies are those of batch 1 wherever they run (as exactly as batch_size,
    # which its key leaves out too), Hugging Face's depend on their batch (its neighbours' padding), so hf keeps a split's
    # count in the key; one process keeps older files' keys
    if settings.get("engine", "hf") != "hf" or settings.get("processes", 1) == 1:
        settings.pop("processes", None)
    # a later turn's prompt read from the row's cache (the keys its own decode wrote) or prefilled whole: the same tokens
    # up to rounding, which in bf16 can change a reply; only our loop, greedy, reuses turns, and off keeps older files' keys
    if not (settings.get("engine") == "ours" and settings.get("temperature", 0) == 0 and settings.get("reuse_turns", False)):
        settings.pop("reuse_turns", None)
    return settings


# data.* settings the regenerated replies depend on (with the source, the target and the template: ``regenerated_key``);
# a resume compares them before anything is regenerated (train.checkpoint.data_resume_settings)
REPLY_DATA_SETTINGS = ("split", "max_records", "max_length")


def regenerated_key(data_cfg: Any, target: Any, renderer: ChatRenderer, source: str) -> dict[str, Any]:
    """What the regenerated replies depend on: the source data, the target's files, the template, the settings, and for
    replies made in this process (``hf``, ``ours``) the target's dtype and device (bf16 and fp32 greedy replies
    differ; vLLM and a server load the target themselves)."""
    regen = data_cfg.regenerate
    key_parts = {
        "source": source_fingerprint(source), **{k: getattr(data_cfg, k) for k in REPLY_DATA_SETTINGS},
        "target": target_fingerprint(target.path), "template": renderer.template,
        "regenerate": regenerate_key(regen), "replies_version": REPLIES_VERSION,
    }
    # replies made otherwise than by earlier versions of this code, whose files must not be read for them: every engine
    # samples from per-reply seeds (``regenerate.reply_seed``), ``hf`` without the target's generation_config.json
    if regen.temperature > 0:
        key_parts["sampling_seeds"] = "per reply"
    if regen.engine == "hf":
        key_parts["hf_generation_config"] = "plain"
    if regen.engine in ("hf", "ours"):
        weight = next(target.model.parameters())
        key_parts["target_weights"] = [str(weight.dtype), weight.device.type]
    return key_parts


def check_cache_dir(data_cfg: Any) -> Path:
    """``data.cache_dir``, refused in one line where nothing can be written (a read-only mount was OSError's traceback from
    the first lock or cache file, after the target had loaded)."""
    cache_dir = Path(data_cfg.cache_dir).expanduser()
    reason = unwritable_reason(cache_dir)
    if reason:
        raise DataError(f"data.cache_dir={str(cache_dir)!r}: {reason}; expected a folder the tokenized (and regenerated) "
                        "data can be cached in (data.cache_dir, or the SWA_DRAFTERS_CACHE environment variable)")
    return cache_dir


def prepare_data(data_cfg: Any, target: Any, seed: int = 0, progress: bool = True) -> tuple[Any, Any, dict[str, Any]]:
    """Read, (optionally) regenerate with the target, tokenize (cached) and split.

    Returns ``(train_dataset, eval_dataset_or_None, summary)``; see ``dataset.load_tokenized``.
    """
    cache_dir = check_cache_dir(data_cfg)
    regen = data_cfg.regenerate
    if not regen.enabled:
        ds, summary = load_tokenized(data_cfg, target.tokenizer, cache_dir / "tokenized")
    else:
        renderer = ChatRenderer(target.tokenizer, data_cfg.chat_template, data_cfg.end_of_turn_token)
        source = resolve_source(data_cfg.path)
        path = cache_dir / "regenerated" / f"{cache_key(regenerated_key(data_cfg, target, renderer, source))}.jsonl"
        conversations = regenerated(path, cache_dir / "locks", source, data_cfg, target, renderer, progress)
        # the regenerated file's size and time too: regenerated again (deleted to redo it, on another engine or device),
        # its replies differ and the tokens cached from the old ones must not be read
        ds, summary = load_tokenized(data_cfg, target.tokenizer, cache_dir / "tokenized", conversations=conversations,
                                     extra_key={"regenerated": str(path), "file": source_fingerprint(str(path))["files"]})
        summary["regenerated_from"] = str(path)
    train_ds, eval_ds, split_counts = split_train_eval(ds, data_cfg.num_eval, seed)
    summary.update(split_counts)
    summary["train_conversations"] = len(train_ds)
    if data_cfg.pack_length:  # after the split: held-out conversations stay one per row
        # packed documents: every row's conversations read apart (the drafter's masks stop at each one's start too)
        fresh = 1.0 if data_cfg.pack_documents else data_cfg.pack_fresh_fraction
        train_ds = pack_conversations(train_ds, data_cfg.pack_length, seed, fresh, best_fit=data_cfg.pack_documents)
        summary["train_packed_rows"] = len(train_ds)
        segments = train_ds["segments"]  # one read of the column
        summary["train_fresh_rows"] = sum(len(s) > 1 for s in segments)
        summary["train_packed_tokens"] = int(sum(sum(s) for s in segments))
        # rows of several conversations: under pack_documents the target reads them in one pass under a document mask
        # (capture_segments), else one conversation at a time (pack_fresh_fraction)
        how = ("rows of several conversations, each read as a document of its own" if data_cfg.pack_documents
               else "rows read by the target one conversation at a time")
        log.info("packed %d training conversations into %d rows of at most %d tokens (%.1f%% of their slots; %d %s)",
                 summary["train_conversations"], len(train_ds), data_cfg.pack_length,
                 100 * summary["train_packed_tokens"] / max(1, len(train_ds) * data_cfg.pack_length), summary["train_fresh_rows"], how)
    summary["eval_conversations"] = 0 if eval_ds is None else len(eval_ds)
    return train_ds, eval_ds, summary


def regenerated(path: Path, locks: Path, source: Any, data_cfg: Any, target: Any, renderer: ChatRenderer,
                progress: bool) -> list[Conversation]:
    """The conversations with the target's own replies: read from ``path``, or regenerated and written there.

    Runs started together on the same data (the DFlash and EAGLE-3 recipes side by side) regenerate it once: the
    others wait on the lock and read the cache (unlocked, both appended to one partial file and did the work twice).
    The lock lives in ``locks``, apart: ``regenerated/`` holds only finished data."""
    regen = data_cfg.regenerate
    lock = locks / f"regenerated-{path.stem}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(lock)):
        if path.exists():
            conversations, _ = read_conversations(path)
            log.info("regenerated conversations from cache %s", path)
            return conversations
        source_conversations, _ = read_conversations(
            source, split=data_cfg.split, skip_bad_lines=data_cfg.skip_bad_lines, max_records=data_cfg.max_records
        )
        partial, resume = partial_files(path)
        if regen.processes > 1:
            conversations, stats = regenerate_in_processes(source_conversations, target, renderer, regen, data_cfg.max_length,
                                                           progress, partial, resume)
        else:
            engine = reply_engine(regen, target, data_cfg.max_length)
            try:
                conversations, stats = regenerate_conversations(source_conversations, engine, renderer, regen,
                                                                data_cfg.max_length, progress, partial=partial, resume=resume)
            finally:
                getattr(engine, "close", lambda: None)()
        write_jsonl_atomic(conversations, path)
        for done in partial_files(path)[1]:
            done.unlink(missing_ok=True)
        log.info("regenerated %d turns with the target -> %s (%s)", stats["turns_regenerated"], path, stats)
        return conversations
