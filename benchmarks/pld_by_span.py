"""Prompt lookup's τ on a regenerated file, replayed on its replies, by where in a conversation the tokens are: every
turn and position (what the trainer's ``eval/block_tau`` and ``eval/pld_block_tau`` read), the first turn, the first
turn's first N tokens (what ``python -m eval`` and ``eval/loop_tau`` decode), the later turns. Text only: no drafter.

    python benchmarks/pld_by_span.py --target builtin:smollm2-135m-instruct --data regenerated.jsonl[.gz] [--num 120]
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.script import run_main  # noqa: E402

from models.builtin_targets import resolve_target_path  # noqa: E402
from train.data.chat import ChatRenderer  # noqa: E402
from train.loop_eval import assistant_turns, prompt_lookup_acceptance, walk_tau  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True, help="the target whose tokenizer and template rendered the training rows")
    p.add_argument("--data", required=True, help="a regenerated file ({id, messages} JSONL, .gz allowed)")
    p.add_argument("--num", type=int, default=120, help="conversations drawn (seed 0)")
    p.add_argument("--first-tokens", type=int, default=256, help="the loop's new tokens per turn")
    p.add_argument("--drafts", type=int, default=15)
    p.add_argument("--max-length", type=int, default=4096)
    args = p.parse_args()
    from transformers import AutoTokenizer

    renderer = ChatRenderer(AutoTokenizer.from_pretrained(resolve_target_path(args.target)))
    opener = gzip.open if args.data.endswith(".gz") else open
    with opener(args.data, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    spans: dict[str, list[int]] = {}
    for row in random.Random(0).sample(rows, min(args.num, len(rows))):
        t = renderer.tokenize(row["messages"])
        ids, mask = t.input_ids[:args.max_length], t.loss_mask[:args.max_length]
        accepted = prompt_lookup_acceptance(ids, mask, args.drafts)
        for turn, (start, end) in enumerate(assistant_turns(mask)):
            cuts = [("all turns, all positions", end), ("turn 1, all positions" if turn == 0 else "turns 2+, all positions", end)]
            if turn == 0:
                cuts.append((f"turn 1, first {args.first_tokens} tokens", min(end, start + args.first_tokens)))
            for name, cut in cuts:
                # a turn cut short: drafts past its new end are not accepted
                n, s = walk_tau([min(x, cut - k - 1) for k, x in enumerate(accepted[start:cut], start=start)])
                spans.setdefault(name, [0, 0])
                spans[name][0] += n
                spans[name][1] += s
    print(f"| span ({min(args.num, len(rows))} conversations of {args.data}) | prompt lookup τ ({args.drafts} drafts) | tokens |")
    print("|---|---:|---:|")
    for name, (n, s) in spans.items():
        print(f"| {name} | {n / s:.3f} | {n} |")


if __name__ == "__main__":
    run_main(main)  # bad input (a flag, a missing or malformed file): one line, not a traceback
