"""How sure is a τ ratio measured on a few questions? A paired bootstrap over questions.

A cell's τ pools its verify steps: τ = Σ (accepted + 1) / steps over all its turns (``eval.runner.summarize``). A ratio
of two cells on the same questions (τ behind a long prompt over τ at prefill 0; one drafter's τ over another's) is
recomputed on questions redrawn with replacement, the same draw for both cells (a question's turns stay together), and
the interval is the 2.5th-97.5th percentiles of those ratios. Per-question τ on a looping target spreads widely, so on
20 questions a "kept" of 100% can mean anything from 70% to 140%: the sweep prints the interval beside it.
"""

from __future__ import annotations

import numpy as np

RESAMPLES = 10000


def per_question(records: list[dict], drafting_steps_only: bool = False) -> dict[str, tuple[int, int]]:
    """question id -> (Σ (accepted + 1), verify steps) over its turns' records (``run_conversations``' output).

    ``drafting_steps_only``: leave out the steps that proposed no draft (prompt lookup without an n-gram match: one
    token, counted as a step accepting 0), as vLLM's spec-decode counters do; each such step adds exactly 1 to the sum
    and 1 to the steps, so it is taken off both (``stats["steps_without_drafts"]``)."""
    out: dict[str, tuple[int, int]] = {}
    for r in records:
        accepted = r["stats"]["accepted_per_step"]
        if drafting_steps_only and r["stats"].get("steps_without_drafts") is None:
            raise ValueError(f"question {r['id']} turn {r.get('turn')}: no steps_without_drafts count in its record "
                             "(saved before the loop counted it); its τ over drafting steps is not known")
        empty = r["stats"]["steps_without_drafts"] if drafting_steps_only else 0
        s, n = out.get(str(r["id"]), (0, 0))
        out[str(r["id"])] = (s + sum(a + 1 for a in accepted) - empty, n + len(accepted) - empty)
    return out


def shared(questions: dict[str, tuple[int, int]], other: dict) -> dict[str, tuple[int, int]]:
    """``questions`` restricted to the ids ``other`` holds too: the τ printed beside a ratio pools the questions the ratio
    pools (a cell cut short, an interrupted prompt-lookup file, printed its own τ beside a ratio over fewer)."""
    return {i: v for i, v in questions.items() if i in other}


def pooled_tau(questions: dict[str, tuple[int, int]]) -> float:
    return sum(s for s, _ in questions.values()) / sum(n for _, n in questions.values())


def ratio_with_interval(base: dict[str, tuple[int, int]], other: dict[str, tuple[int, int]], resamples: int = RESAMPLES,
                        seed: int = 0) -> tuple[float, float, float]:
    """(ratio, low, high): pooled τ(other) / pooled τ(base) over the questions both hold, and its 95% paired-bootstrap
    interval (``resamples`` draws from a generator seeded with ``seed``: the same inputs give the same interval)."""
    ids = sorted(set(base) & set(other))
    if not ids:
        raise ValueError("the two cells share no question id")
    b = np.array([base[i] for i in ids], dtype=np.float64)  # [Q, 2]: Σ (accepted + 1), steps
    o = np.array([other[i] for i in ids], dtype=np.float64)
    ratio = (o[:, 0].sum() / o[:, 1].sum()) / (b[:, 0].sum() / b[:, 1].sum())
    draws = np.random.default_rng(seed).integers(0, len(ids), size=(resamples, len(ids)))
    bs, os_ = b[draws].sum(axis=1), o[draws].sum(axis=1)  # [resamples, 2]
    ratios = (os_[:, 0] / os_[:, 1]) / (bs[:, 0] / bs[:, 1])
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(ratio), float(low), float(high)
