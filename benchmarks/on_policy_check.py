"""Is regenerated training data the target's own greedy text? The target, teacher-forced over conversations tokenized
as the trainer tokenizes them, against the stored reply tokens.

    python benchmarks/on_policy_check.py --target builtin:smollm2-135m-instruct --data regenerated.jsonl[.gz] --num 30

Prints the share of loss-masked positions where the target's argmax is the stored token: in a reply's first 256 tokens,
after them, and at the reply's first token. Greedy regeneration gives ~1.0 (ties and the regenerating engine's dtype
take the rest); a low share means the labels are not what the loop will ask the drafter to predict.
"""

from __future__ import annotations

import argparse
import gzip
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.script import run_main  # noqa: E402

from models.builtin_targets import resolve_target_path  # noqa: E402
from models.target import TargetModel  # noqa: E402
from train.data.chat import ChatRenderer  # noqa: E402
from train.data.readers import read_conversations  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--data", required=True, help="conversations as python -m train's data.path reads them (data.regenerate's "
                                                 "output: <cache>.jsonl), or a .jsonl.gz of them")
    p.add_argument("--num", type=int, default=30, help="conversations, from the file's start")
    p.add_argument("--max-length", type=int, default=2048)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    conversations = read_gz_jsonl(args.data) if args.data.endswith(".gz") else read_conversations(args.data)[0]
    conversations = conversations[:args.num]  # read before the target loads: a bad file is one line at once
    if not conversations:
        raise ValueError(f"--data {args.data}: no conversation with an assistant turn; expected regenerated conversations")
    path = resolve_target_path(args.target)
    target = TargetModel.from_pretrained(path, args.device)
    renderer = ChatRenderer(target.tokenizer, where=path)
    counts = {"first 256": [0, 0], "after 256": [0, 0], "first token": [0, 0]}
    replies: dict[str, int] = {}  # replies scored as their stored token_ids, and stored ids that did not spell their text
    for conversation in conversations:
        (tokenized,) = renderer.tokenize_batch([conversation.messages], [conversation.id], replies)
        ids = torch.tensor(tokenized.input_ids[:args.max_length], device=args.device)
        mask = tokenized.loss_mask[:args.max_length]
        with torch.no_grad():
            predicted = target.model(ids[None]).logits[0].argmax(-1).tolist()  # position i predicts token i + 1
        in_reply = 0
        for i in range(1, len(mask)):
            if not mask[i]:
                continue
            in_reply = 0 if not mask[i - 1] else in_reply + 1
            hit = int(predicted[i - 1] == int(ids[i]))
            for name in (["first token"] if in_reply == 0 else []) + ["first 256" if in_reply < 256 else "after 256"]:
                counts[name][0] += hit
                counts[name][1] += 1
    total = [sum(counts[k][j] for k in ("first 256", "after 256")) for j in (0, 1)]
    print(f"{len(conversations)} conversations of {args.data}, target {args.target}: argmax = stored token at "
          f"{total[0]}/{total[1]} = {total[0] / max(1, total[1]):.4f} of loss-masked positions")
    for name, (hit, seen) in counts.items():
        print(f"  {name}: {hit}/{seen} = {hit / max(1, seen):.4f}")
    print(f"  replies scored as their stored token_ids: {replies.get('replies_from_ids', 0)}; stored ids that do not spell their "
          f"text (scored as the text tokenized again): {replies.get('replies_from_text', 0)}")


def read_gz_jsonl(path: str) -> list:
    """A gzipped JSONL of conversations, read as ``read_conversations`` reads the plain file (written to a temporary one)."""
    import tempfile

    try:
        data = gzip.decompress(Path(path).read_bytes())
    except (OSError, EOFError) as e:
        raise ValueError(f"--data {path}: not a readable gzip file ({e})") from None
    with tempfile.TemporaryDirectory() as folder:
        plain = Path(folder) / Path(path).name[:-3]
        plain.write_bytes(data)
        return read_conversations(plain)[0]


if __name__ == "__main__":
    run_main(main)  # bad input (a flag, a missing or malformed file): one line, not a traceback
