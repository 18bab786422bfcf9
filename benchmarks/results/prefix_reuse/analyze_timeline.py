"""Per worker: live rows over the pass, step time by live rows, and when each conversation's turns ended."""
import json, collections, statistics, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
steps = [e for e in ev if isinstance(e[0], int)]
t0 = min(e[1] for e in steps); t1 = max(e[2] for e in steps)
print(f"pass {t1 - t0:.2f} s (first verify to last)")
by = collections.defaultdict(list)
for p, a, b, m in steps: by[p].append((a - t0, b - t0, m))
per = collections.defaultdict(list)
for w, (p, xs) in enumerate(sorted(by.items())):
    print(f"worker {w}: {len(xs)} steps, last ends {xs[-1][1]:.2f} s; mean live rows per second:")
    print("   " + " ".join(f"{sum(m for a, b, m in xs if s <= a < s + 1) / max(1, sum(1 for a, b, m in xs if s <= a < s + 1)):.1f}"
                         if any(s <= a < s + 1 for a, b, m in xs) else " -" for s in range(int(t1 - t0) + 1)))
    for (a, b, m), (a2, _, _) in zip(xs, xs[1:]):
        per[m].append(a2 - a)
print("median step (verify start to next) by live rows: " + ", ".join(f"{m}: {1e3 * statistics.median(v):.1f} ms ({len(v)})" for m, v in sorted(per.items())))
for e in ev:
    if e[0] == "turn":
        print(f"turn ends {e[2] - t0:6.2f} s worker pid {e[1]} question {e[3]} turn {e[4]} steps {e[5]} prompt {e[6]} new {e[7]}")
