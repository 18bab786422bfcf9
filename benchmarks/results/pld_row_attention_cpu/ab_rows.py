import sys, time, torch, resource
cpu_now = lambda: time.process_time() + sum(resource.getrusage(resource.RUSAGE_CHILDREN)[:2])
sys.path.insert(0, '.')
import models.static_target as st
from eval.runner import run_conversations, cpu_workers
from infer.loading import eos_ids, load_models, set_threads
from infer.prompts import mt_bench
from infer.prompt_lookup import PromptLookupDrafter
from models.sampling import SamplingConfig
nq, rounds = int(sys.argv[1]), int(sys.argv[2])
target, _, tok = load_models('../shared/targets/qwen3-27m-sharegpt', None, 'cpu')
eos = eos_ids(tok, target.model)
convs = mt_bench(nq)
d = PromptLookupDrafter(num_draft_tokens=15, vocab_size=target.lm_head.weight.shape[0])
def run(bs, flag):
    st.ROW_ATTENTION_ON_CPU = flag
    set_threads('cpu', 2, bs, target.model)
    workers = cpu_workers('cpu', bs, None, 0)
    t = time.perf_counter(); c = cpu_now()
    recs = run_conversations(target, d, tok, convs, prefill_tokens=0, sampling=SamplingConfig(), max_new_tokens=128, eos_token_ids=eos,
                             baseline=False, batch_size=bs, desc='x', reuse_prefixes=True, workers=workers)
    wall = time.perf_counter() - t; cpu = cpu_now() - c
    recs = sorted(recs, key=lambda r: (str(r["id"]), r["turn"]))
    new = sum(r["stats"]["new_tokens"] for r in recs)
    return (new / wall, new / cpu), [(r["output_ids"], r["stats"]["accepted_per_step"]) for r in recs]
for i in range(rounds):
    b1, o1 = run(1, True)
    order = [False, True] if i % 2 == 0 else [True, False]
    res = {flag: run(8, flag) for flag in order}
    (a, oa), (b, ob) = res[False], res[True]
    print(f"round {i} (order {order}): batch 1 {b1[0]:.1f} tok/s, {b1[1]:.1f} tok/CPU s | batch 8 padded {a[0]:.1f} ({a[0]/b1[0]:.2f}x), "
          f"{a[1]:.1f} tok/CPU s ({a[1]/b1[1]:.2f}x) | batch 8 per row {b[0]:.1f} ({b[0]/b1[0]:.2f}x), {b[1]:.1f} tok/CPU s ({b[1]/b1[1]:.2f}x) "
          f"| same as batch 1: {oa == o1} {ob == o1}", flush=True)
