"""One CPU step of the target (StaticTarget.step, B rows x k tokens) and of the DFlash drafter's first slots, median of 30.

    python benchmarks/results/prefix_reuse/stepcost.py THREADS ROWS EXPORT   # from the repository root
"""
import sys, time
sys.path.insert(0, ".")
import torch
from infer.loading import load_models
torch.set_num_threads(int(sys.argv[1]))
target, drafter, tok = load_models("../shared/targets/qwen3-27m-sharegpt", sys.argv[3], "cpu", batch_size=8)
B = int(sys.argv[2])
target.allocate(1024, batch=B); drafter.allocate(1024, batch=B)
pos = torch.full((B,), 300, dtype=torch.long)
def t(fn, n=30):
    fn(); fn()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    ts.sort(); return 1e3 * ts[len(ts) // 2]
for k in [1, 2, 3, 4, 5, 8, 12, 16]:
    ids = torch.randint(0, 8000, (B, k))
    a = t(lambda: target.step(ids, pos))
    tok1 = torch.randint(0, 8000, (B,))
    d = t(lambda: drafter.first_drafts(tok1, pos, k - 1)) if 2 <= k <= 15 else float('nan')
    print(f"B={B} tokens {k:2d}: target.step {a:6.2f} ms   first_drafts({k-1}) {d:6.2f} ms", flush=True)
feats = torch.randn(B, 16, 5 * 512)
print("append 16", t(lambda: drafter.append(feats, pos)))
