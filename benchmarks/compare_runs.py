"""Two training runs side by side: loss per logged step, throughput, exported weights.

    python benchmarks/compare_runs.py RUN_A RUN_B [--skip-windows 1]

RUN_* are output_dir folders (metrics.jsonl, export/model.safetensors). Throughput is the median of
``train/tokens_per_s`` over the logging windows after the first ``--skip-windows`` (compilation).
"""

from __future__ import annotations

import sys
import argparse
import json
import statistics
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.script import run_main  # noqa: E402


def history(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if "train/loss" in line]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--skip-windows", type=int, default=1)
    parser.add_argument("--every", type=int, default=1, help="print every k-th logged step")
    args = parser.parse_args()
    ha, hb = history(args.a), history(args.b)
    steps = sorted({h["step"] for h in ha} & {h["step"] for h in hb})
    la, lb = ({h["step"]: h for h in hs} for hs in (ha, hb))
    print(f"| step | loss {args.a.name} | loss {args.b.name} | |Δ| | tokens (both) |\n|---:|---:|---:|---:|---:|")
    worst = 0.0
    for i, s in enumerate(steps):
        d = abs(la[s]["train/loss"] - lb[s]["train/loss"])
        worst = max(worst, d)
        if i % args.every == 0 or s == steps[-1]:
            same = "same" if la[s]["train/tokens"] == lb[s]["train/tokens"] else f"{la[s]['train/tokens']} / {lb[s]['train/tokens']}"
            print(f"| {s} | {la[s]['train/loss']:.5f} | {lb[s]['train/loss']:.5f} | {d:.1e} | {same} |")
    rate = {}
    for name, hs in ((args.a.name, ha), (args.b.name, hb)):
        rate[name] = statistics.median(h["train/tokens_per_s"] for h in hs[args.skip_windows:])
    ratio = rate[args.b.name] / rate[args.a.name]
    print(f"\nmax |Δ loss| over {len(steps)} logged steps: {worst:.2e}")
    print(f"tokens/s (median over windows): {args.a.name} {rate[args.a.name]:,.0f}, {args.b.name} {rate[args.b.name]:,.0f}: {ratio:.2f}x")
    wa_file, wb_file = args.a / "export" / "model.safetensors", args.b / "export" / "model.safetensors"
    if wa_file.exists() and wb_file.exists():
        wa, wb = load_file(wa_file), load_file(wb_file)
        diff = max((wa[k].float() - wb[k].float()).abs().max().item() for k in wa)
        identical = all(torch.equal(wa[k], wb[k]) for k in wa)
        print(f"exported weights: max |Δ| {diff:.2e}, bit for bit: {identical}")
    print(json.dumps({"max_abs_loss_diff": worst, "tokens_per_s": rate, "speedup": ratio}))


if __name__ == "__main__":
    run_main(main)  # bad input (a flag, a missing or malformed file): one line, not a traceback
