"""Our loop and vLLM on the same drafter and prompts: τ, acceptance by position, identical tokens, and prompt
lookup's τ on the same prompts beside them.

    SWA_VLLM_PYTHON=~/vllm-venv/bin/python python benchmarks/engines_side_by_side.py RUN [RUN ...] \
        --prompts mtbench --num-questions 10 --max-new-tokens 128 [--server URL]

Each RUN is a training run folder (``python -m train`` output with ``export_speculators`` for EAGLE-3 or
``export_dflash`` for DFlash). Runs ``python -m eval`` twice per drafter (``--engine ours`` with prompt lookup
and ``--engine vllm`` with the target-alone baseline) into ``--out`` and prints one Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from eval.__main__ import main as eval_main  # noqa: E402
from infer.generate import pooled_acceptance  # noqa: E402


def untrimmed(record: dict) -> list[int]:
    """Our steps counted as vLLM counts them: with the drafts the last step accepted past the budget or EOS."""
    steps = list(record["stats"]["accepted_per_step"])
    steps[-1] += record["stats"].get("accepted_past_end", 0)
    return steps


def run(command: list[str], out: Path) -> dict:
    if not (out / "results.json").exists():
        code = eval_main([*command, "--out", str(out)])
        if code != 0:
            raise SystemExit(f"python -m eval {' '.join(command)} exited {code}")
    return json.loads((out / "results.json").read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--prompts", default="mtbench", help="mtbench or a JSONL prompt file")
    p.add_argument("--num-questions", type=int, default=10)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--server", help="also read a running vLLM server serving the first RUN")
    p.add_argument("--out", default="outputs/engines_side_by_side")
    args = p.parse_args()

    rows = []
    for run_dir in args.runs:
        source = ["mtbench"] if args.prompts == "mtbench" else ["prompts", "--prompts", args.prompts]
        common = [*source, "--drafter", run_dir, "--num-questions", str(args.num_questions), "--max-new-tokens", str(args.max_new_tokens),
                  "--device", "cpu"]
        out = Path(args.out) / Path(run_dir).name
        engines = {"ours": run([*common, "--no-baseline"], out / "ours"),
                   "vllm": run([*common, "--engine", "vllm", "--no-pld", "--baseline"], out / "vllm")}
        if args.server and run_dir == args.runs[0]:
            engines["server"] = run([*common, "--server", args.server, "--no-pld", "--baseline"], out / "server")
        ours = engines["ours"]
        pld = ours["summary"].get("prompt_lookup", {}).get("tau", float("nan"))
        s = ours["summary"]
        rows.append((Path(run_dir).name, "ours", s["turns"], s["steps"], s["tau"], s["acceptance_by_position"], "-", "-", "-", pld))
        # ours counted as vLLM counts: with the drafts the last step accepted past the budget or EOS
        tau, acc = pooled_acceptance([x for r in ours["records"] for x in untrimmed(r)], len(s["acceptance_by_position"]) + 1)
        rows.append((Path(run_dir).name, "ours, counted as vLLM counts", s["turns"], s["steps"], tau, acc, "-", "-", "-", pld))
        for name, result in engines.items():
            if name == "ours":
                continue
            s = result["summary"]
            n = s["turns"]
            same_tokens = sum(a["output_ids"] == b["output_ids"] for a, b in zip(ours["records"], result["records"]))
            same_steps = sum(Counter(untrimmed(a)) == Counter(b["stats"]["accepted_per_step"]) for a, b in zip(ours["records"], result["records"]))
            rows.append((Path(run_dir).name, name, n, s["steps"], s["tau"], s["acceptance_by_position"], f"{same_tokens}/{n}",
                         f"{same_steps}/{n}", f"{s.get('same_as_baseline', float('nan')):.0%}", pld))
    print("| drafter | engine | turns | verify steps | τ | acceptance by position | tokens = ours | per-step histogram = ours "
          "(counted as vLLM) | tokens = target alone | prompt lookup τ |")
    print("|---|---|---:|---:|---:|---|---:|---:|---:|---:|")
    for name, engine, turns, steps, tau, acc, same_tokens, same_steps, lossless, pld in rows:
        print(f"| {name} | {engine} | {turns} | {steps} | {tau:.3f} | {' '.join(f'{a:.2f}' for a in acc)} | {same_tokens} | {same_steps} "
              f"| {lossless} | {pld:.3f} |")

if __name__ == "__main__":
    main()
