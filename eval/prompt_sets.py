"""Prompt sets: MT-Bench (bundled, both turns) and any JSONL file of conversations.

A ``--prompts`` file holds one record per line, any of
    {"prompt": "..."}                     one user turn
    {"turns": ["...", "..."]}             user turns; each later turn follows the model's own answer
    {"messages": [{"role": "user", "content": "..."}, ...]}   the user messages are the turns
with optional "id" and "category".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from infer.prompts import MT_BENCH, mt_bench_questions


@dataclass(frozen=True)
class Conversation:
    id: str
    category: str
    turns: tuple[str, ...]  # user messages


def mt_bench(num_questions: int | None = None) -> list[Conversation]:
    records = mt_bench_questions(MT_BENCH)
    return [Conversation(str(r["question_id"]), r.get("category", ""), tuple(r["turns"])) for r in records[:num_questions]]


def prompts_file(path: str | Path, num_questions: int | None = None) -> list[Conversation]:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--prompts {path}: no such file")
    out = []
    with open(path, encoding="utf-8") as f:
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
            elif "messages" in record:
                turns = [m.get("content") for m in record["messages"] if isinstance(m, dict) and m.get("role") == "user"]
            else:
                raise ValueError(f"{where}: expected a field 'prompt', 'turns' or 'messages'")
            if not turns or not all(isinstance(t, str) and t for t in turns):
                raise ValueError(f"{where}: the user turns must be non-empty strings")
            out.append(Conversation(str(record.get("id", line_no)), str(record.get("category", "")), tuple(turns)))
    if not out:
        raise ValueError(f"--prompts {path}: no records")
    return out[:num_questions]
