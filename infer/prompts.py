"""Prompts for the loop and its evaluation: a question behind a long prefill.

A long-prefill prompt is one user turn: a filler document of exactly ``prefill_tokens`` tokens
(ShareGPT conversations from the bundled sample, as plain text), a blank line, then the question,
rendered with the target's chat template and its generation prompt. The filler is deterministic
(``offset`` picks where in the sample it starts), so every run and every engine sees the same text.

Prompt sets (``python -m eval``, ``python -m infer --prompts``): MT-Bench (bundled, both turns) and any JSONL file of
conversations, one record per line, any of
    {"prompt": "..."}                     one user turn
    {"turns": ["...", "..."]}             user turns; each later turn follows the model's own answer
    {"messages": [{"role": "user", "content": "..."}, ...]}   the user messages are the turns
with optional "id" and "category".
"""

from __future__ import annotations

import codecs
import functools
import io
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

MT_BENCH = Path(__file__).resolve().parents[1] / "eval" / "data" / "mt_bench" / "question.jsonl"


def mt_bench_questions(path: str | Path = MT_BENCH) -> list[dict]:
    """MT-Bench records ``{question_id, category, turns}`` (the bundled copy unless ``path`` says)."""
    path = Path(path)
    records = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{line_no}: not valid JSON ({e.msg})") from None
            turns = record.get("turns") if isinstance(record, dict) else None
            if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
                raise ValueError(f"{path}:{line_no}: field 'turns' must be a non-empty list of strings")
            records.append(record)
    return records


@functools.cache
def filler_text() -> str:
    """The bundled ShareGPT sample's turns as one long plain text."""
    sample = resources.files("train.data") / "samples" / "sharegpt_sample.jsonl"
    parts = []
    for line in sample.read_text(encoding="utf-8").splitlines():
        for turn in json.loads(line)["conversations"]:
            parts.append(turn["value"])
    return "\n\n".join(parts)


def filler_ids(tokenizer, num_tokens: int, offset: int = 0) -> list[int]:
    """Exactly ``num_tokens`` token ids of filler text starting ``offset`` tokens in (wrapping around)."""
    if num_tokens == 0:
        return []
    ids = _tokenized_filler(tokenizer)
    out = []
    while len(out) < num_tokens:
        take = ids[offset % len(ids):][: num_tokens - len(out)]
        out.extend(take)
        offset += len(take)
    return out


_FILLER_IDS: dict[tuple, list[int]] = {}


def _tokenized_filler(tokenizer) -> list[int]:
    key = (tokenizer.name_or_path, len(tokenizer))
    if key not in _FILLER_IDS:
        _FILLER_IDS[key] = tokenizer(filler_text(), add_special_tokens=False, verbose=False)["input_ids"]
    return _FILLER_IDS[key]


def first_turn_content(tokenizer, question: str, prefill_tokens: int = 0, offset: int = 0) -> str:
    """The first user message: a filler document of ``prefill_tokens`` tokens, a blank line, the question."""
    if prefill_tokens < 0:
        raise ValueError(f"prefill_tokens={prefill_tokens}; expected >= 0")
    if not prefill_tokens:
        return question
    return f"{tokenizer.decode(filler_ids(tokenizer, prefill_tokens, offset))}\n\n{question}"


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a chat rendered with the tokenizer's template and its generation prompt."""
    if not getattr(tokenizer, "chat_template", None):  # transformers' own message names neither the folder nor a way out
        raise ValueError(f"the target's tokenizer ({getattr(tokenizer, 'name_or_path', '?')}) has no chat template; expected an "
                         "instruct/chat model (tokenizer_config.json 'chat_template' or chat_template.jinja)")
    return tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)


def long_prompt_ids(tokenizer, question: str, prefill_tokens: int = 0, offset: int = 0) -> list[int]:
    """Chat-templated ids of [filler document of ``prefill_tokens`` tokens, question] + generation prompt."""
    return chat_ids(tokenizer, [{"role": "user", "content": first_turn_content(tokenizer, question, prefill_tokens, offset)}])


# ----------------------------------------------------------------------------- prompt sets

@dataclass(frozen=True)
class Conversation:
    id: str
    category: str
    turns: tuple[str, ...]  # user messages


def mt_bench(num_questions: int | None = None) -> list[Conversation]:
    """The first ``num_questions`` MT-Bench questions (all when None)."""
    if num_questions is not None and num_questions < 1:  # -1 sliced off the last question: 79 ran, none said
        raise ValueError(f"--questions {num_questions}; expected a number of MT-Bench questions >= 1 (80 in all)")
    records = mt_bench_questions(MT_BENCH)
    return [Conversation(str(r["question_id"]), r.get("category", ""), tuple(r["turns"])) for r in records[:num_questions]]


def prompts_file(path: str | Path, num_questions: int | None = None) -> list[Conversation]:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--prompts {path}: {'a folder' if path.is_dir() else 'no such file'}; expected a JSONL file of prompts")
    out = []
    lines_of: dict[str, int] = {}  # each id's line: results resume by (id, turn), so two records of one id would mix
    data = path.read_bytes()
    try:  # -sig: a leading byte-order mark (Windows tools write one) skipped
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:  # was "'utf-8' codec can't decode byte ...", naming no file
        at = e.start + (3 if data.startswith(codecs.BOM_UTF8) else 0)  # e.start counts from past the mark
        line_no = data[:at].count(b"\n") + 1
        raise ValueError(f"{path}:{line_no}: not UTF-8 text (byte {data[at]:#04x} at byte offset {at}); expected a UTF-8 "
                         "JSONL file of prompts") from None
    with io.StringIO(text, newline=None) as f:  # line ends as a text-mode open reads them (\r\n, \r)
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{where}: expected a JSON object with 'prompt', 'turns' or 'messages'")
            if "prompt" in record:
                turns = [record["prompt"]]
            elif "turns" in record:
                turns = record["turns"]
                if not isinstance(turns, list):  # a bare string would read as one turn per character
                    raise ValueError(f"{where}: 'turns' is {type(turns).__name__} {turns!r:.40}; expected a list of user messages")
            elif "messages" in record:
                messages = record["messages"]
                if not isinstance(messages, list):
                    raise ValueError(f"{where}: 'messages' is {type(messages).__name__} {messages!r:.40}; expected a list of "
                                     "{role, content} objects")
                turns = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
            else:
                raise ValueError(f"{where}: expected a field 'prompt', 'turns' or 'messages'")
            if not turns or not all(isinstance(t, str) and t.strip() for t in turns):  # blank: as --prompt '  ' is refused
                raise ValueError(f"{where}: the user turns must be non-empty strings")
            conv_id = str(record.get("id", line_no))  # a record without an id: its line number
            if conv_id in lines_of:
                raise ValueError(f"{where}: id {conv_id!r} is line {lines_of[conv_id]}'s too; expected one record per id "
                                 "(results are kept and resumed by id and turn)")
            lines_of[conv_id] = line_no
            out.append(Conversation(conv_id, str(record.get("category", "")), tuple(turns)))
    if not out:
        raise ValueError(f"--prompts {path}: no records")
    return out[:num_questions]
