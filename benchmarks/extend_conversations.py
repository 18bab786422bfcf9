"""More on-policy data from the same prompts: a regenerated file's conversations extended with their next ShareGPT user
turns, for ``data.regenerate.keep_replies`` to answer after the target's own earlier replies.

    python benchmarks/extend_conversations.py --regenerated regen_a.jsonl[.gz] [regen_b.jsonl.gz ...] --kept 2 \
        --max-turns 4 --out extended.jsonl
    python -m train ... data.path=extended.jsonl data.regenerate.enabled=true data.regenerate.keep_replies=2

A conversation is extended only where its regenerated replies answer exactly the first ``--kept`` user turns of the
ShareGPT conversation of the same id (the user turns compared as text), so every kept reply is the target's own and no
placeholder is kept. Others are written as they are (all their replies kept). Appended replies hold "." until they are
regenerated. Written to a temporary name, then renamed. Prints the counts.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.script import run_main  # noqa: E402

from common.atomic import atomic_open  # noqa: E402
from train.data.readers import read_conversations, sharegpt_package_file  # noqa: E402


def read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        rows = []
        for n, line in enumerate(f, 1):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SystemExit(f"{path}:{n}: not a JSON line ({e.msg}); expected a regenerated file's {{id, messages}} rows")
        return rows


def extend(regenerated: list[dict], originals: dict[str, list[dict]], kept: int, max_turns: int) -> tuple[list[dict], dict]:
    counts = {"conversations": len(regenerated), "extended": 0, "turns_added": 0, "not_extended_fewer_replies": 0,
              "not_extended_other_user_turns": 0, "not_extended_no_source": 0}
    out = []
    for row in regenerated:
        messages = row["messages"]
        users = [m["content"] for m in messages if m["role"] == "user"]
        replies = sum(m["role"] == "assistant" for m in messages)
        source = originals.get(row["id"])
        source_users = [m["content"] for m in source if m["role"] == "user"] if source is not None else []
        if source is None:
            counts["not_extended_no_source"] += 1
        elif replies != kept or len(users) != kept or messages[-1]["role"] != "assistant":
            counts["not_extended_fewer_replies"] += 1
        elif source_users[:kept] != users:
            counts["not_extended_other_user_turns"] += 1
        elif len(source_users) > kept:
            added = source_users[kept:max_turns]
            messages = messages + [m for text in added for m in ({"role": "user", "content": text}, {"role": "assistant", "content": "."})]
            counts["extended"] += 1
            counts["turns_added"] += len(added)
        out.append({"id": row["id"], "messages": messages})
    return out, counts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--regenerated", nargs="+", required=True, help="regenerated files ({id, messages} JSONL, .gz allowed)")
    p.add_argument("--kept", type=int, default=2, help="replies each regenerated conversation holds (the prompt file's user turns)")
    p.add_argument("--max-turns", type=int, default=4, help="user turns per conversation after extension")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    if args.max_turns <= args.kept:
        raise SystemExit(f"--max-turns {args.max_turns} must exceed --kept {args.kept}")
    conversations, _ = read_conversations(sharegpt_package_file())
    originals = {c.id: c.messages for c in conversations}
    regenerated = [row for path in args.regenerated for row in read_jsonl(Path(path))]
    out, counts = extend(regenerated, originals, args.kept, args.max_turns)
    with atomic_open(Path(args.out)) as f:
        for row in out:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(json.dumps(counts))


if __name__ == "__main__":
    run_main(main)  # bad input (a flag, a missing or malformed file): one line, not a traceback
