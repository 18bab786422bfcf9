"""The host's share of regeneration and training data that is rendering and tokenizing conversations with the chat
template (``train.data.chat.ChatRenderer``), on a regenerated file.

    python benchmarks/chat_render_speed.py --target builtin:smollm2-135m-instruct --data regen.jsonl [--num 2000]

Two rows, each timed once on this machine's CPU:
- ``prompt_ids``: every assistant turn's prompt, the earlier replies as their stored token ids, asked for in
  regeneration's order (``--rows`` conversations in flight, each one's turns in order, round robin): what
  ``data.regenerate`` renders on the host between the target's steps, a turn at a time.
- ``tokenize_batch``: every conversation as a training row and its loss mask, in batches of 256 (what ``data.path`` on a
  regenerated file tokenizes before training).

``sha`` digests the ids (and masks) in order: two revisions of the code give the same rows where it matches. Run the
script from each revision's tree on the same file to compare them (``--data`` can be ``.xz``; a regenerated file
stores replies as ``token_ids``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.builtin_targets import resolve_target_path  # noqa: E402
from train.data.chat import ChatRenderer  # noqa: E402
from train.data.readers import DataError, read_conversations  # noqa: E402


def regeneration_order(conversations, rows: int) -> list[tuple[list[dict], str]]:
    """Each assistant turn's messages before it, as regeneration asks: ``rows`` conversations at a time, turn k of each
    before turn k+1 of any."""
    turns = [[(c.messages[:i], c.id) for i, m in enumerate(c.messages) if m["role"] == "assistant"] for c in conversations]
    order = []
    for g in range(0, len(turns), rows):
        group = turns[g:g + rows]
        for k in range(max(map(len, group), default=0)):
            order += [t[k] for t in group if k < len(t)]
    return order


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True, help="its tokenizer and chat template (a folder, a hub id or builtin:NAME)")
    p.add_argument("--data", required=True, help="a regenerated JSONL file (replies with token_ids); .xz is read as it is")
    p.add_argument("--num", type=int, default=None, help="the first NUM conversations (default: all)")
    p.add_argument("--rows", type=int, default=256, help="conversations in flight in prompt_ids' order (regeneration's rows)")
    args = p.parse_args()
    data = Path(args.data)
    if not data.is_file():
        sys.exit(f"--data {data}: no such file (expected a regenerated JSONL file, or one compressed with xz)")
    if args.num is not None and args.num < 1 or args.rows < 1:
        sys.exit(f"--num {args.num} / --rows {args.rows}: expected at least 1")
    from transformers import AutoTokenizer

    try:
        with tempfile.TemporaryDirectory() as scratch:
            source = data
            if ".xz" in data.suffixes:  # the readers take JSONL; a lease returns it xz-compressed (regen.jsonl.xz.part00)
                source = Path(scratch) / data.name.split(".xz")[0]
                source.write_bytes(lzma.decompress(data.read_bytes()))
            conversations, _ = read_conversations(source, max_records=args.num)
    except DataError as e:
        sys.exit(str(e))
    except lzma.LZMAError as e:
        sys.exit(f"--data {data}: not one whole xz stream ({e}); join a lease's pieces first (cat regen.jsonl.xz.part*)")
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(resolve_target_path(args.target)))

    order = regeneration_order(conversations, args.rows)
    digest, tokens, t0 = hashlib.sha256(), 0, time.perf_counter()
    for messages, cid in order:
        ids = renderer.prompt_ids(messages, cid)
        tokens += len(ids)
        digest.update(json.dumps(ids).encode())
    prompt_s = time.perf_counter() - t0
    prompt_sha = digest.hexdigest()[:16]

    digest, counts, t0 = hashlib.sha256(), {}, time.perf_counter()
    for g in range(0, len(conversations), 256):
        batch = conversations[g:g + 256]
        for row in renderer.tokenize_batch([c.messages for c in batch], [c.id for c in batch], counts):
            digest.update(json.dumps([row.input_ids, row.loss_mask]).encode())
    rows_s = time.perf_counter() - t0

    print(f"{len(conversations)} conversations, {len(order)} assistant turns ({tokens} prompt tokens in all), "
          f"{counts.get('replies_from_ids', 0)} replies as their ids, {counts.get('replies_from_text', 0)} from their text")
    print("| what | calls | seconds | per call | sha |")
    print("|---|---:|---:|---:|---|")
    print(f"| prompt_ids, regeneration's order ({args.rows} in flight) | {len(order)} | {prompt_s:.2f} | "
          f"{prompt_s / max(len(order), 1) * 1e3:.3f} ms a turn | {prompt_sha} |")
    print(f"| tokenize_batch (rows and loss masks) | {len(conversations)} | {rows_s:.2f} | "
          f"{len(conversations) / max(rows_s, 1e-9):.0f} conversations/s | {digest.hexdigest()[:16]} |")


if __name__ == "__main__":
    main()
