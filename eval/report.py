"""Markdown tables, the τ-versus-context plot and the W&B run of an evaluation."""

from __future__ import annotations

from pathlib import Path

from eval.bootstrap import RESAMPLES, ratio_with_interval


def fmt(value, spec: str, suffix: str = "") -> str:
    """A number, or '-' where the run has none (no baseline, no prompt lookup, another engine's timings)."""
    return "-" if value is None else f"{value:{spec}}{suffix}"


def summary_table(summary: dict, title: str) -> str:
    by_position = summary["acceptance_by_position"]
    acc = " ".join(f"{a:.2f}" for a in by_position[:8]) or "-"
    # the header names the positions shown: a block of 8 drafts 7, a chain of 15 shows its first 8
    positions = f"1..{min(len(by_position), 8)}" if by_position else "none"
    positions += f" of {len(by_position)}" if len(by_position) > 8 else ""
    split = summary["time_split"]
    engine = summary.get("engine", "ours")
    # another engine reports no phase split, and its speed over our baseline's is no speedup
    split_text = f"{100 * split['draft']:.0f}% / {100 * split['verify']:.0f}% / {100 * split['other']:.0f}%" if engine == "ours" else "-"
    same = summary.get("same_as_baseline")
    rows = [
        f"### {title}" + ("" if engine == "ours" else f" (engine: {engine})"), "",
        "| turns | τ | prompt lookup τ | tok/s | AR tok/s | speedup | tokens = target alone | mean prompt | mean latency s | "
        f"draft / verify / other | acceptance by position ({positions}) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
        f"| {summary['turns']} | {summary['tau']:.3f} | {fmt(summary.get('prompt_lookup', {}).get('tau'), '.3f')} | {summary['tokens_per_s']:.1f} | "
        f"{fmt(summary.get('baseline_tokens_per_s'), '.1f')} | {fmt(summary.get('speedup'), '.2f', 'x')} | {fmt(same, '.0%')} | "
        f"{summary['mean_prompt_tokens']:.0f} | {summary['mean_latency_s']:.2f} | {split_text} | {acc} |",
    ]
    for who, pld in (("This drafter", summary), ("Prompt lookup", summary.get("prompt_lookup", {}))):
        if pld.get("steps_without_drafts"):  # the stricter reading of its τ, beside: vLLM counts only steps with drafts
            rows += ["", f"{who} proposed no draft in {pld['steps_without_drafts']} of its {pld['steps']} steps (one token "
                         f"each, counted in its τ); over the steps with drafts, as vLLM's counters count it, its τ is "
                         f"{fmt(pld.get('tau_drafting_steps'), '.3f')}."]
    if summary.get("prompt_lookup_note"):
        rows += ["", f"Prompt lookup's τ: {summary['prompt_lookup_note']}."]
    if summary.get("batch_size"):
        rows += ["", f"Batched, {summary['batch_size']} conversations in flight: the rows' own tok/s above; the batch decoded "
                     f"{summary['batch_tokens_per_s']:.1f} tokens/s."]
    if summary.get("warmup_s"):
        baseline = f" (the baseline's pass: {summary['baseline_warmup_s']:.1f} s)" if summary.get("baseline_warmup_s") else ""
        rows += ["", f"A warm-up of the pass's shapes took {summary['warmup_s']:.1f} s before it{baseline}, not counted above."]
    cats = summary.get("tau_by_category", {})
    if len(cats) > 1:
        pld_cats = summary.get("prompt_lookup", {}).get("tau_by_category", {})  # the same prompts' free baseline, "-" if not run
        rows += ["", "| category | " + " | ".join(cats) + " |", "|---|" + "---:|" * len(cats),
                 "| τ | " + " | ".join(f"{t:.3f}" for t in cats.values()) + " |",
                 "| prompt lookup τ | " + " | ".join(fmt(pld_cats.get(c), ".3f") for c in cats) + " |"]
    return "\n".join(rows)


def sweep_tables(cells: dict[tuple[str, int], dict], texts: dict[tuple[str, int], dict] | None = None,
                 questions: dict[tuple[str, int], dict] | None = None) -> str:
    """τ and tokens/s matrices: one row per window, one column per prefill; then τ kept (each cell's τ over its row's τ
    at the smallest prefill), given ``questions`` ((window or "prompt lookup", prefill) -> ``eval.bootstrap.per_question``)
    its 95% paired-bootstrap interval over questions, and, given ``texts`` ((window, prefill) -> {(id, turn): output
    ids}), how many turns the target answered with the same text as at the smallest prefill: where it did not, a kept τ
    compares drafting on different text (a target that copies the filler into its answer changes what any drafter must
    predict)."""
    windows = sorted({w for w, _ in cells}, key=lambda w: (w != "none", int(w) if w.isdigit() else 0))
    prefills = sorted({p for _, p in cells})
    header = ["| window | " + " | ".join(str(p) for p in prefills) + " |", "|---|" + "---:|" * len(prefills)]
    pld = {p: c["prompt_lookup"]["tau"] for (_, p), c in cells.items() if "prompt_lookup" in c}  # the free baseline
    out = []
    for name, key, fmt in (("τ", "tau", "{:.3f}"), ("tokens/s", "tokens_per_s", "{:.1f}")):
        out += [f"**{name}** (rows: drafter window; columns: prefill tokens)", "", *header]
        for w in windows:
            out.append(f"| {w} | " + " | ".join(fmt.format(cells[(w, p)][key]) if (w, p) in cells else "-" for p in prefills) + " |")
        if key == "tau" and pld:  # same prompts and prefill
            out.append("| prompt lookup | " + " | ".join(fmt.format(pld[p]) if p in pld else "-" for p in prefills) + " |")
            # the stricter reading beside: over the steps that proposed drafts, as vLLM's counters count it (cells
            # computed before the loop counted its steps without drafts have none: "-")
            drafting = {p: c["prompt_lookup"].get("tau_drafting_steps") for (_, p), c in cells.items() if "prompt_lookup" in c}
            if any(v is not None for v in drafting.values()):
                out.append("| prompt lookup, steps with drafts (vLLM's count) | " + " | ".join(
                    fmt.format(drafting[p]) if drafting.get(p) is not None else "-" for p in prefills) + " |")
        notes = sorted({c["prompt_lookup_note"] for c in cells.values() if c.get("prompt_lookup_note")})
        if key == "tau" and notes:  # its row absent, or its later turns on other prompts: said
            out += ["", *(f"Prompt lookup's τ: {n}." for n in notes)]
        out.append("")
    first = prefills[0]
    rows = {w: {p: cells[(w, p)]["tau"] for p in prefills if (w, p) in cells} for w in windows}
    rows["prompt lookup"] = pld
    out += [f"**τ kept** (τ over the same row's τ at prefill {first})", "", *header]
    for w, taus in rows.items():
        if first in taus:
            out.append(f"| {w} | " + " | ".join(f"{taus[p] / taus[first]:.0%}" if p in taus else "-" for p in prefills) + " |")
    out.append("")
    if questions:
        out += [f"**τ kept, 95% interval** (paired bootstrap over the questions, {RESAMPLES:,} draws: how far the few questions "
                "let the row above move)", "", *header]
        for w in rows:
            if (w, first) not in questions:
                continue
            spans = []
            for p in prefills:
                if (w, p) not in questions:
                    spans.append("-")
                    continue
                _, low, high = ratio_with_interval(questions[(w, first)], questions[(w, p)])
                spans.append(f"{low:.0%}-{high:.0%}")
            out.append(f"| {w} | " + " | ".join(spans) + " |")
        out.append("")
    if texts:
        out += [f"**turns with the same target text as at prefill {first}** (greedy output ids, turn by turn)", "", *header]
        for w in windows:
            ref = texts.get((w, first))
            if ref is None:
                continue
            cells_text = [texts.get((w, p)) for p in prefills]
            out.append(f"| {w} | " + " | ".join("-" if t is None else f"{sum(t.get(k) == ids for k, ids in ref.items())}/{len(ref)}"
                                                 for t in cells_text) + " |")
        out.append("")
    return "\n".join(out)


def sweep_plot(cells: dict[tuple[str, int], dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for w in sorted({w for w, _ in cells}):
        points = sorted((p, s["tau"]) for (ww, p), s in cells.items() if ww == w)
        ax.plot([p for p, _ in points], [t for _, t in points], marker="o", label="full attention" if w == "none" else f"W = {w}")
    pld = sorted({p: s["prompt_lookup"]["tau"] for (_, p), s in cells.items() if "prompt_lookup" in s}.items())
    if pld:
        ax.plot([p for p, _ in pld], [t for _, t in pld], marker="x", linestyle="--", color="gray", label="prompt lookup (no training)")
    ax.set_xlabel("prefill tokens before the question")
    ax.set_ylabel("τ (accepted drafts + 1 per step)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)


def log_wandb(mode: str, project: str, name: str, config: dict, summary: dict | None = None, records: list[dict] | None = None,
              cells: dict | None = None, plot: Path | None = None, out_dir: Path | None = None) -> None:
    import wandb

    from common.metrics_logger import has_wandb_key

    if mode == "auto":
        mode = "online" if has_wandb_key() else "offline"
    run = wandb.init(project=project, name=name, config=config, mode=mode, dir=str(out_dir) if out_dir else None)
    if summary:
        run.summary.update({k: v for k, v in summary.items() if isinstance(v, (int, float))})
        if "prompt_lookup" in summary:
            run.summary["prompt_lookup_tau"] = summary["prompt_lookup"]["tau"]
        run.log({f"acceptance/pos_{k + 1}": a for k, a in enumerate(summary["acceptance_by_position"])})
    if records:
        columns = ["id", "category", "turn", "prompt_tokens", "new_tokens", "tau", "tokens_per_s", "output_text"]
        table = wandb.Table(columns=columns)
        for r in records:
            s = r["stats"]
            table.add_data(r["id"], r["category"], r["turn"], r["prompt_tokens"], s["new_tokens"], s["tau"], s["tokens_per_s"], r["output_text"])
        run.log({"questions": table})
    if cells:
        table = wandb.Table(columns=["window", "prefill", "tau", "tokens_per_s", "prompt_lookup_tau"])
        for (w, p), s in sorted(cells.items()):
            table.add_data(w, p, s["tau"], s["tokens_per_s"], s.get("prompt_lookup", {}).get("tau"))
        run.log({"sweep": table})
        if plot is not None:
            run.log({"tau_vs_context": wandb.Image(str(plot))})
    run.finish()
