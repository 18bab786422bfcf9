"""τ of EAGLE-3 trees (and chains) against prompt lookup on the same prompts, from ``python -m eval`` result folders.

    python benchmarks/tree_table.py RESULTS_DIR [RESULTS_DIR ...]

Each RESULTS_DIR is an ``--out`` folder (``results.json``) named ``<set>_<config>``; folders of the same set (the part
before the first ``_``) are one prompt set. Prompt lookup's τ beside a row: its own run in that folder (eval's default:
as many drafts per step as the drafter's deepest branch), else the run of another folder of the same set with that
many drafts (``--no-pld`` folders reuse it). ``best PLD`` is the highest prompt-lookup τ measured on the set at any
draft count, and ``ratio (best)`` the stricter ratio against it. ``verified`` is the target tokens one step verifies.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def load(folder: Path) -> dict:
    result = json.loads((folder / "results.json").read_text())
    config, summary = result["config"], result["summary"]
    tree = config.get("tree_topk") is not None or config.get("tree_tokens") is not None
    block = result["records"][0]["stats"]["block_size"]
    lookup = config.get("tree_lookup") or 0
    return {
        "set": folder.name.split("_", 1)[0],
        "name": folder.name.split("_", 1)[-1],
        "drafting": (f"tree top-{config['tree_topk']}, {config['tree_tokens']} nodes, depth {config['draft_steps']}" if tree
                     else f"chain of {block - 1}") + (f" + prompt lookup's chain of {lookup}" if lookup else ""),
        "drafts": block - 1,
        "verified": (config["tree_tokens"] + lookup + 1) if tree else block,
        "turns": summary["turns"],
        "tau": summary["tau"],
        "first": summary["acceptance_by_position"][0],
        "pld": summary.get("prompt_lookup", {}).get("tau"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path)
    args = parser.parse_args()
    missing = [str(f) for f in args.folders if not (f / "results.json").is_file()]
    if missing:
        raise SystemExit(f"error: no results.json in {', '.join(missing)} (expected python -m eval --out folders)")
    rows = [load(f) for f in args.folders]
    pld = {(r["set"], r["drafts"]): r["pld"] for r in rows if r["pld"] is not None}  # (set, drafts) -> prompt lookup's τ
    best = {}
    for (s, drafts), tau in pld.items():
        if tau > best.get(s, (0, 0))[1]:
            best[s] = (drafts, tau)
    print("| set | drafting | verified | turns | τ | 1st draft | prompt lookup (drafts) | ratio | best PLD (drafts) | ratio (best) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in sorted(rows, key=lambda r: (r["set"], r["tau"])):
        same = pld.get((r["set"], r["drafts"]))
        b = best.get(r["set"])
        print(f"| {r['set']} | {r['drafting']} | {r['verified']} | {r['turns']} | {r['tau']:.3f} | {r['first']:.2f} | "
              + (f"{same:.3f} ({r['drafts']}) | {r['tau'] / same:.2f}× | " if same else "- | - | ")
              + (f"{b[1]:.3f} ({b[0]}) | {r['tau'] / b[1]:.2f}× |" if b else "- | - |"))


if __name__ == "__main__":
    main()
