"""Per-turn τ of the fourteenth session's SmolLM2 EAGLE-3 with two tree sizes on the CPU (fp32), from the two runs' records:
whether the text is the same, then steps and τ per turn for each tree, and the pooled τ. Run from this folder."""
import gzip
import json
def load(p):
    out={}
    for l in gzip.open(p, "rt"):
        try: r=json.loads(l)
        except Exception: continue
        out[(r["id"],r["turn"])]=r
    return out
a=load("k16n384d16/window-trained_prefill-0.jsonl.gz")
b=load("k16n1024d24/window-trained_prefill-0.jsonl.gz")
k=sorted(set(a)&set(b))
def acc(r):
    s=r["stats"]; steps=s["accepted_per_step"] if "accepted_per_step" in s else None
    return steps
ta=[];tb=[]
for key in k:
    sa=acc(a[key]); sb=acc(b[key])
    same=a[key]["output_ids"]==b[key]["output_ids"]
    print(key, "same text" if same else "DIFF", len(sa), (sum(sa)+len(sa))/len(sa), len(sb), (sum(sb)+len(sb))/len(sb))
    ta+=sa; tb+=sb
print("pooled tau 384:", (sum(ta)+len(ta))/len(ta), "1024:", (sum(tb)+len(tb))/len(tb), "turns", len(k))
