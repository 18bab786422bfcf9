"""How sure is a sweep's "τ kept"? A paired bootstrap over questions, from ``python -m eval sweep`` result folders.

    python benchmarks/sweep_kept_ci.py SWEEP_DIR [SWEEP_DIR ...] [--resamples 10000] [--seed 0]
    python benchmarks/sweep_kept_ci.py SWEEP_DIR --against OTHER_SWEEP_DIR     # two drafters, cell by cell

A sweep cell's τ pools its verify steps: τ = Σ (accepted + 1) / steps over all turns. "Kept" is τ behind P prefill tokens
over τ at prefill 0, both cells on the same questions. The bootstrap redraws the questions with replacement (a
question's turns stay together; the same draw for both cells, so the pair stays paired) and recomputes both pooled τs
and their ratio; the interval is the 2.5th-97.5th percentiles. Reads ``cells/*.json`` (the drafter's cells) and
``partial/pld_prefill-*.jsonl`` (prompt lookup's, where the sweep ran it). Prints a markdown table.

``--against``: another drafter's sweep over the same questions and prefills; each cell's τ over the other sweep's same
cell, with the same paired interval. The target's greedy text is the same for both drafters (up to batch rounding), so
this compares drafters on the same text, where "kept" compares one drafter across texts (behind the filler the
target's answers change).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np

CELL = re.compile(r"(?:window-(?P<window>[^_]+)|pld)_prefill-(?P<prefill>\d+)\.jsonl?$")


def per_question(records: list[dict]) -> dict[str, tuple[int, int]]:
    """question id -> (Σ (accepted + 1), steps) over its turns."""
    out: dict[str, tuple[int, int]] = {}
    for r in records:
        accepted = r["stats"]["accepted_per_step"]
        s, n = out.get(str(r["id"]), (0, 0))
        out[str(r["id"])] = (s + sum(a + 1 for a in accepted), n + len(accepted))
    return out


def pooled_tau(questions: dict[str, tuple[int, int]]) -> float:
    return sum(s for s, _ in questions.values()) / sum(n for _, n in questions.values())


def kept_with_interval(base: dict[str, tuple[int, int]], behind: dict[str, tuple[int, int]], resamples: int = 10000,
                       seed: int = 0) -> tuple[float, float, float]:
    """(kept, low, high): pooled τ(behind) / pooled τ(base) and its 95% paired-bootstrap interval over shared questions."""
    ids = sorted(set(base) & set(behind))
    if not ids:
        raise ValueError("the two cells share no question id")
    b = np.array([base[i] for i in ids], dtype=np.float64)
    p = np.array([behind[i] for i in ids], dtype=np.float64)
    kept = (p[:, 0].sum() / p[:, 1].sum()) / (b[:, 0].sum() / b[:, 1].sum())
    draws = np.random.default_rng(seed).integers(0, len(ids), size=(resamples, len(ids)))
    bs, ps = b[draws].sum(axis=1), p[draws].sum(axis=1)  # [resamples, 2]: Σ(accepted + 1), steps
    ratios = (ps[:, 0] / ps[:, 1]) / (bs[:, 0] / bs[:, 1])
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(kept), float(low), float(high)


def read_cells(sweep: Path) -> dict[tuple[str, int], list[dict]]:
    """(window or "prompt lookup", prefill) -> the cell's records."""
    cells: dict[tuple[str, int], list[dict]] = {}
    for path in sorted((sweep / "cells").glob("*.json")) + sorted((sweep / "partial").glob("pld_prefill-*.jsonl")):
        m = CELL.search(path.name)
        if m is None:
            continue
        key = (m["window"] or "prompt lookup", int(m["prefill"]))
        if path.suffix == ".json":
            cells[key] = json.loads(path.read_text())["records"]
        else:
            cells[key] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not cells:
        raise ValueError(f"{sweep}: no cells/*.json or partial/pld_prefill-*.jsonl; expected a `python -m eval sweep --out` folder")
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweeps", nargs="+", type=Path)
    parser.add_argument("--resamples", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--against", type=Path, help="another sweep folder: print each cell's τ over that sweep's same cell")
    args = parser.parse_args()
    if args.against is not None:
        other = read_cells(args.against)
        print(f"| sweep | window | prefill | questions | τ | τ of {args.against.name} | ratio | 95% interval |")
        print("|---|---|---:|---:|---:|---:|---:|---|")
        for sweep in args.sweeps:
            for key, records in sorted(read_cells(sweep).items()):
                if key not in other:
                    continue
                mine, theirs = per_question(records), per_question(other[key])
                ratio, low, high = kept_with_interval(theirs, mine, args.resamples, args.seed)
                print(f"| {sweep.name} | {key[0]} | {key[1]} | {len(set(mine) & set(theirs))} | {pooled_tau(mine):.3f} | "
                      f"{pooled_tau(theirs):.3f} | {ratio:.3f} | {low:.3f}-{high:.3f} |")
        return
    print("| sweep | window | prefill | questions | τ at 0 | τ behind | kept | 95% interval |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for sweep in args.sweeps:
        cells = read_cells(sweep)
        for (window, prefill), records in sorted(cells.items()):
            if prefill == 0 or (window, 0) not in cells:
                continue
            base, behind = per_question(cells[(window, 0)]), per_question(records)
            kept, low, high = kept_with_interval(base, behind, args.resamples, args.seed)
            print(f"| {sweep.name} | {window} | {prefill} | {len(set(base) & set(behind))} | {pooled_tau(base):.3f} | {pooled_tau(behind):.3f} | "
                  f"{100 * kept:.1f}% | {100 * low:.1f}-{100 * high:.1f}% |")


if __name__ == "__main__":
    main()
