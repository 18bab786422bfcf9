"""How sure is a sweep's "τ kept"? A paired bootstrap over questions, from ``python -m eval sweep`` result folders.

    python benchmarks/sweep_kept_ci.py SWEEP_DIR [SWEEP_DIR ...] [--resamples 10000] [--seed 0]
    python benchmarks/sweep_kept_ci.py SWEEP_DIR --against OTHER_SWEEP_DIR     # two drafters, cell by cell
    python benchmarks/sweep_kept_ci.py SHARD_DIR [SHARD_DIR ...] --merge NAME   # one sweep run as shards (one per GPU)

"Kept" is τ behind P prefill tokens over τ at prefill 0, both cells on the same questions, with its paired-bootstrap
interval over questions (``eval/bootstrap.py``; ``python -m eval sweep`` prints the same in ``sweep.md``, for sweeps
made before it did, or for other draw counts). Reads ``cells/*.json`` (the drafter's cells) and
``partial/pld_prefill-*.jsonl`` (prompt lookup's, where the sweep ran it). Prints a markdown table.

``--against``: another drafter's sweep over the same questions and prefills; each cell's τ over the other sweep's same
cell, with the same paired interval. The target's greedy text is the same for both drafters (up to batch rounding), so
this compares drafters on the same text, where "kept" compares one drafter across texts (behind the filler the
target's answers change).

``--merge NAME``: the folders are shards of one sweep (the same settings over disjoint prompt files, e.g.
``benchmarks/prompts_that_fit.py --shards``): their cells are joined and read as one sweep called NAME; a question id in
two shards is refused.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eval.bootstrap import per_question, pooled_tau, ratio_with_interval, shared  # noqa: E402
from common.json_file import read_eval_text  # noqa: E402
from eval.runner import read_partial  # noqa: E402

CELL = re.compile(r"(?:window-(?P<window>[^_]+)|pld)_prefill-(?P<prefill>\d+)\.(?P<kind>jsonl?)(?:\.gz)?$")


def read_cells(sweep: Path) -> dict[tuple[str, int], list[dict]]:
    """(window or "prompt lookup", prefill) -> the cell's records."""
    cells: dict[tuple[str, int], list[dict]] = {}
    # committed result folders may hold them gzipped (.json.gz, .jsonl.gz)
    paths = [p for pattern in ("*.json", "*.json.gz") for p in sorted((sweep / "cells").glob(pattern))]
    paths += [p for pattern in ("pld_prefill-*.jsonl", "pld_prefill-*.jsonl.gz") for p in sorted((sweep / "partial").glob(pattern))]
    for path in paths:
        m = CELL.search(path.name)
        if m is None:
            continue
        key = (m["window"] or "prompt lookup", int(m["prefill"]))
        try:
            if m["kind"] == "json":
                records = json.loads(read_eval_text(path))["records"]
                if not isinstance(records, list):
                    raise ValueError(f"'records' is {type(records).__name__}")
                cells[key] = records
            else:  # the sweep's own reader: a turn written twice (again with its baseline) counts once, its last line
                cells[key] = list(read_partial(path).values())
        except (OSError, EOFError, ValueError, KeyError, TypeError) as e:  # a cut or corrupt file: named, not a traceback
            raise ValueError(f"{path}: not a readable sweep cell ({type(e).__name__}: {e}); expected `python -m eval sweep`'s output") from None
    if not cells:
        raise ValueError(f"{sweep}: no cells/*.json or partial/pld_prefill-*.jsonl; expected a `python -m eval sweep --out` folder")
    # prompt lookup's partial files keep every question ever decoded into the folder; a sweep rerun there on fewer
    # questions rebuilt its cells on those alone: prompt lookup's rows are read on the cells' questions
    asked = {str(r["id"]) for (window, _), records in cells.items() if window != "prompt lookup" for r in records}
    if asked:
        cells = {key: [r for r in records if key[0] != "prompt lookup" or str(r["id"]) in asked] for key, records in cells.items()}
    return cells


def merge_shards(shards: list[Path]) -> dict[tuple[str, int], list[dict]]:
    """One sweep's cells from its shards: the records of each cell every shard holds, joined."""
    per_shard = [read_cells(shard) for shard in shards]
    owner: dict[str, int] = {}
    for i, cells in enumerate(per_shard):
        for records in cells.values():
            for r in records:
                if owner.setdefault(str(r["id"]), i) != i:
                    raise ValueError(f"question {r['id']} is in two shards ({shards[owner[str(r['id'])]]}, {shards[i]}); "
                                     "expected disjoint prompt files")
    common = set.intersection(*(set(cells) for cells in per_shard))
    return {key: [r for cells in per_shard for r in cells[key]] for key in sorted(common)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweeps", nargs="+", type=Path)
    parser.add_argument("--resamples", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--against", type=Path, help="another sweep folder: print each cell's τ over that sweep's same cell")
    parser.add_argument("--merge", metavar="NAME", help="the folders are shards of one sweep: read them as one, called NAME")
    args = parser.parse_args()
    if args.merge is not None and args.against is not None:
        parser.error("--merge and --against: one at a time")
    if args.against is not None:
        other = read_cells(args.against)
        print(f"| sweep | window | prefill | questions | τ | τ of {args.against.name} | ratio | 95% interval |")
        print("|---|---|---:|---:|---:|---:|---:|---|")
        for sweep in args.sweeps:
            for key, records in sorted(read_cells(sweep).items()):
                if key not in other:
                    continue
                mine, theirs = per_question(records), per_question(other[key])
                ratio, low, high = ratio_with_interval(theirs, mine, args.resamples, args.seed)
                mine, theirs = shared(mine, theirs), shared(theirs, mine)  # the τ columns over the questions the ratio reads
                print(f"| {sweep.name} | {key[0]} | {key[1]} | {len(mine)} | {pooled_tau(mine):.3f} | "
                      f"{pooled_tau(theirs):.3f} | {ratio:.3f} | {low:.3f}-{high:.3f} |")
        return
    groups = [(args.merge, merge_shards(args.sweeps))] if args.merge is not None else [(s.name, read_cells(s)) for s in args.sweeps]
    print("| sweep | window | prefill | questions | τ at 0 | τ behind | kept | 95% interval |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for name, cells in groups:
        for (window, prefill), records in sorted(cells.items()):
            if prefill == 0 or (window, 0) not in cells:
                continue
            base, behind = per_question(cells[(window, 0)]), per_question(records)
            kept, low, high = ratio_with_interval(base, behind, args.resamples, args.seed)
            base, behind = shared(base, behind), shared(behind, base)  # a partial cell: τ over what "kept" reads
            print(f"| {name} | {window} | {prefill} | {len(base)} | {pooled_tau(base):.3f} | {pooled_tau(behind):.3f} | "
                  f"{100 * kept:.1f}% | {100 * low:.1f}-{100 * high:.1f}% |")


if __name__ == "__main__":
    try:
        main()
    except ValueError as e:
        sys.exit(f"error: {e}")
