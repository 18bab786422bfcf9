"""A drafter's τ over prompt lookup's on the same prompts, with paired-bootstrap intervals, from eval folders.

    python benchmarks/tau_ratio_intervals.py EVAL_DIR [EVAL_DIR ...] [--resamples 10000] [--seed 0]

Reads an ``python -m eval mtbench|prompts --out EVAL_DIR`` folder's ``partial/window-*_prefill-P.jsonl`` (the drafter)
and ``partial/pld_prefill-P.jsonl`` (prompt lookup, run beside it unless ``--no-pld``). For each drafter cell it prints
τ, prompt lookup's τ counted over every step and over the steps with drafts (vLLM's counters' reading: a step without
an n-gram match proposes nothing there), and the drafter's τ over each, with its 95% paired-bootstrap interval over
questions (``eval/bootstrap.py``: a question's turns stay together, both cells redrawn alike). The strict reading of
"τ ≥ 2× prompt lookup" is the last column.

``--pld-dirs PLD_DIR [...]``: one per EVAL_DIR, prompt lookup's cells from a run of its own on the same prompts
(``python -m eval ... --drafter pld --draft-steps 32 --out PLD_DIR``: a deeper prompt lookup than the one beside the
drafter, which drafts as many tokens as the drafter is deep) instead of the cells beside.

    python benchmarks/tau_ratio_intervals.py EVAL_MTBENCH EVAL_PROMPTS --pld-dirs PLD32_MTBENCH PLD32_PROMPTS
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.script import run_main  # noqa: E402
from eval.bootstrap import RESAMPLES, per_question, pooled_tau, ratio_with_interval, shared  # noqa: E402
from eval.runner import read_partial  # noqa: E402

CELL = re.compile(r"window-(?P<window>.+)_prefill-(?P<prefill>\d+)\.jsonl(?:\.gz)?$")


def cells(folder: Path, pld_dir: Path | None = None) -> list[tuple[str, int, Path, Path]]:
    """(window, prefill, drafter file, prompt lookup file) for every drafter cell with prompt lookup beside it (or, with
    ``pld_dir``, in that ``--drafter pld`` run's folder: its cell of the same prefill)."""
    partial = folder / "partial"
    found = []
    for path in sorted(partial.glob("window-*_prefill-*.jsonl*")):
        m = CELL.match(path.name)
        if not m:
            continue
        if pld_dir is None:
            names = [f"pld_prefill-{m['prefill']}.jsonl", f"pld_prefill-{m['prefill']}.jsonl.gz"]
            where, hint = partial, "beside it (run without --no-pld)"
        else:
            names = [f"window-{w}_prefill-{m['prefill']}.jsonl{z}" for w in ("trained", "none") for z in ("", ".gz")]
            where, hint = pld_dir / "partial", "(a `python -m eval ... --drafter pld --out` folder)"
        pld = next((where / n for n in names if (where / n).exists()), None)
        if pld is None:
            raise ValueError(f"{path}: no {where / names[0]} {hint}")
        found.append((m["window"], int(m["prefill"]), path, pld))
    if not found:
        raise ValueError(f"{folder}: no partial/window-*_prefill-*.jsonl; expected a `python -m eval mtbench|prompts --out` folder")
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--resamples", type=int, default=RESAMPLES)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pld-dirs", nargs="+", type=Path, help="one per folder: prompt lookup's own runs on the same prompts")
    args = parser.parse_args(argv)
    if args.pld_dirs is not None and len(args.pld_dirs) != len(args.folders):
        raise ValueError(f"--pld-dirs: {len(args.pld_dirs)} folders for {len(args.folders)} eval folders; expected one each")
    print("| folder | window | prefill | questions | τ | prompt lookup τ | ratio (95% interval) | prompt lookup τ, "
          "steps with drafts | ratio, vLLM's count (95% interval) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for i, folder in enumerate(args.folders):
        for window, prefill, mine_file, pld_file in cells(folder, None if args.pld_dirs is None else args.pld_dirs[i]):
            mine_records, pld_records = list(read_partial(mine_file).values()), list(read_partial(pld_file).values())
            # every column pools the questions both cells hold (a cell cut off by a kill holds fewer)
            pld_counts = {only: per_question(pld_records, drafting_steps_only=only) for only in (False, True)}
            mine = shared(per_question(mine_records), pld_counts[False])
            row = [folder.name, window, str(prefill), str(len(mine)), f"{pooled_tau(mine):.3f}"]
            for drafting_only in (False, True):
                pld = shared(pld_counts[drafting_only], mine)
                ratio, low, high = ratio_with_interval(pld, mine, args.resamples, args.seed)
                row += [f"{pooled_tau(pld):.3f}", f"{ratio:.3f}× ({low:.2f}-{high:.2f})"]
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    run_main(main)
