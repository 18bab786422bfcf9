"""`--window none` behind 31,979 tokens (shards 0 and 1, the deadline left the rest) over the trained window's prefill-0
τ on the same questions (the window changes nothing before 2,048 tokens of context). Run from this folder:
    python none_kept.py     # -> none_kept.txt
"""
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
spec = importlib.util.spec_from_file_location("ci", ROOT / "benchmarks" / "sweep_kept_ci.py")
ci = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ci)
from eval.bootstrap import per_question, pooled_tau, ratio_with_interval  # noqa: E402

print("| drafter | questions | τ at 0 (trained) | τ behind, trained | kept (95% interval) | τ behind, none | kept (95% interval) |")
print("|---|---:|---:|---:|---|---:|---|")
for kind in ("dflash", "eagle3"):
    trained = ci.merge_shards([Path(f"{kind}_s0"), Path(f"{kind}_s1")])
    none = ci.merge_shards([Path(f"{kind}_none_s0"), Path(f"{kind}_none_s1")])
    base, behind, off = (per_question(c) for c in (trained[("trained", 0)], trained[("trained", 31979)], none[("none", 31979)]))
    k, lo, hi = ratio_with_interval(base, behind, 10000, 0)
    kn, lon, hin = ratio_with_interval(base, off, 10000, 0)
    print(f"| {kind} | {len(off)} | {pooled_tau(base):.3f} | {pooled_tau(behind):.3f} | {100 * k:.1f}% ({100 * lo:.1f}-{100 * hi:.1f}%) | "
          f"{pooled_tau(off):.3f} | {100 * kn:.1f}% ({100 * lon:.1f}-{100 * hin:.1f}%) |")
