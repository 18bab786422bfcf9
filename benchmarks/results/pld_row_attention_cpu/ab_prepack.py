"""A/B of the mid-sized matrices' products by rows (models.static_target.PREPACK_MIN_ROWS: 8, or never = plain as before),
batch 1 (2 threads) and batch 8 (two one-thread workers), prompt lookup (15 drafts), MT-Bench conversations, 128 new tokens."""
import sys, time, torch, resource
sys.path.insert(0, '.')
import models.static_target as st
from eval.runner import run_conversations, cpu_workers
from infer.loading import eos_ids, load_models, set_threads
from infer.prompts import mt_bench
from infer.prompt_lookup import PromptLookupDrafter
from models.sampling import SamplingConfig
cpu_now = lambda: time.process_time() + sum(resource.getrusage(resource.RUSAGE_CHILDREN)[:2])
nq, rounds = int(sys.argv[1]), int(sys.argv[2])
target, _, tok = load_models('../shared/targets/qwen3-27m-sharegpt', None, 'cpu')
assert any(isinstance(w.wqkv, st.RowsPrepacked) for w in target.weights), "no mid-sized matrix kept both ways here"
eos = eos_ids(tok, target.model)
convs = mt_bench(nq)
d = PromptLookupDrafter(num_draft_tokens=15, vocab_size=target.lm_head.weight.shape[0])
def run(bs, min_rows):
    st.PREPACK_MIN_ROWS = min_rows
    set_threads('cpu', 2, bs, target.model)
    workers = cpu_workers('cpu', bs, None, 0)
    t, c = time.perf_counter(), cpu_now()
    recs = run_conversations(target, d, tok, convs, prefill_tokens=0, sampling=SamplingConfig(), max_new_tokens=128, eos_token_ids=eos,
                             baseline=False, batch_size=bs, desc='x', reuse_prefixes=True, workers=workers)
    wall, cpu = time.perf_counter() - t, cpu_now() - c
    recs = sorted(recs, key=lambda r: (str(r["id"]), r["turn"]))
    new = sum(r["stats"]["new_tokens"] for r in recs)
    return new / wall, new / cpu, [(r["output_ids"], r["stats"]["accepted_per_step"]) for r in recs]
PLAIN, BY_ROWS = 10 ** 9, 8
for i in range(rounds):
    order = [PLAIN, BY_ROWS] if i % 2 == 0 else [BY_ROWS, PLAIN]
    res = {(bs, r): run(bs, r) for r in order for bs in (1, 8)}
    ref = res[(1, PLAIN)][2]
    line = " | ".join(f"{'plain' if r == PLAIN else 'by rows'}: batch 1 {res[(1, r)][0]:.1f}, batch 8 {res[(8, r)][0]:.1f} tok/s "
                      f"({res[(8, r)][0] / res[(1, r)][0]:.2f}x; per CPU s {res[(8, r)][1] / res[(1, r)][1]:.2f}x)" for r in (PLAIN, BY_ROWS))
    same = all(res[k][2] == ref for k in res)
    print(f"round {i} (first: {'plain' if order[0] == PLAIN else 'by rows'}): {line} | every pass's tokens and steps equal: {same}", flush=True)
