"""τ of EAGLE-3 trees (and chains) against prompt lookup on the same prompts, from ``python -m eval`` result folders.

    python benchmarks/tree_table.py RESULTS_DIR [RESULTS_DIR ...]

Each RESULTS_DIR is an ``--out`` folder (``results.json``) named ``<set>_<config>``; folders of the same set (the part
before the first ``_``) are one prompt set. Prompt lookup's τ beside a row: its own run in that folder (eval's default:
as many drafts per step as the drafter's deepest branch), else the run of another folder of the same set with that
many drafts and the same prompts (questions or prompts file, token budget, prefill, temperature), marked "borrowed"
(``--no-pld`` folders reuse it); a folder with other prompts borrows nothing. ``best PLD`` is the highest prompt-lookup τ measured on the set at any
draft count, and ``ratio (best)`` the stricter ratio against it. ``verified`` is the target tokens one step verifies.
``PLD, steps with drafts`` is the same prompt-lookup run's τ over its steps that proposed drafts (vLLM's count: a step
with no n-gram match decodes one token and is no draft there; ``tau_drafting_steps``), beside the ratio against it ("-"
for results saved before the loop counted those steps).
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
    # what makes two folders' prompts the same: a prompt lookup τ is borrowed only between these
    prompts = tuple(config.get(k) for k in ("prompts", "num_questions", "max_new_tokens", "prefill_tokens", "temperature"))
    return {
        "set": folder.name.split("_", 1)[0],
        "prompts": prompts,
        "name": folder.name.split("_", 1)[-1],
        "drafting": (f"tree top-{config['tree_topk']}, {config['tree_tokens']} nodes, depth {config['draft_steps']}" if tree
                     else f"chain of {block - 1}") + (f" + prompt lookup's chain of {lookup}" if lookup else ""),
        "drafts": block - 1,
        "verified": (config["tree_tokens"] + lookup + 1) if tree else block,
        "turns": summary["turns"],
        "tau": summary["tau"],
        "first": summary["acceptance_by_position"][0],
        "pld": summary.get("prompt_lookup", {}).get("tau"),
        "pld_drafting": summary.get("prompt_lookup", {}).get("tau_drafting_steps"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path)
    args = parser.parse_args()
    missing = [str(f) for f in args.folders if not (f / "results.json").is_file()]
    if missing:
        raise SystemExit(f"error: no results.json in {', '.join(missing)} (expected python -m eval --out folders)")
    rows = [load(f) for f in args.folders]
    # (set, prompts, drafts) -> prompt lookup's τ on those prompts
    pld = {(r["set"], r["prompts"], r["drafts"]): r["pld"] for r in rows if r["pld"] is not None}
    pld_drafting = {(r["set"], r["prompts"], r["drafts"]): r["pld_drafting"] for r in rows if r["pld"] is not None}
    best = {}
    for (s, prompts, drafts), tau in pld.items():
        if tau > best.get((s, prompts), (0, 0))[1]:
            best[(s, prompts)] = (drafts, tau)
    print("| set | drafting | verified | turns | τ | 1st draft | prompt lookup (drafts) | ratio | best PLD (drafts) | ratio (best) "
          "| PLD, steps with drafts | ratio (vLLM's count) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in sorted(rows, key=lambda r: (r["set"], r["tau"])):
        same = pld.get((r["set"], r["prompts"], r["drafts"]))
        b = best.get((r["set"], r["prompts"]))
        borrowed = ", borrowed" if same is not None and r["pld"] is None else ""
        print(f"| {r['set']} | {r['drafting']} | {r['verified']} | {r['turns']} | {r['tau']:.3f} | {r['first']:.2f} | "
              + (f"{same:.3f} ({r['drafts']}{borrowed}) | {r['tau'] / same:.2f}× | " if same else "- | - | ")
              + (f"{b[1]:.3f} ({b[0]}) | {r['tau'] / b[1]:.2f}× |" if b else "- | - |")
              + (f" {drafting:.3f} | {r['tau'] / drafting:.2f}× |" if (drafting := pld_drafting.get((r["set"], r["prompts"], r["drafts"])))
                 else " - | - |"))


if __name__ == "__main__":
    main()
