import sys, time, torch
sys.path.insert(0, "/work/main")
from eval.runner import run_conversations
from infer.loading import eos_ids, load_models
from infer.prompts import mt_bench
from infer.prompt_lookup import PromptLookupDrafter
from models.sampling import SamplingConfig
bs = int(sys.argv[1]); threads = int(sys.argv[2]); nq = int(sys.argv[3])
torch.set_num_threads(threads)
target, _, tok = load_models("/work/shared/targets/qwen3-27m-sharegpt", None, "cpu")
eos = eos_ids(tok, target.model)
convs = mt_bench(nq)
d = PromptLookupDrafter(num_draft_tokens=15, vocab_size=target.lm_head.weight.shape[0])
kw = dict(prefill_tokens=0, sampling=SamplingConfig(), max_new_tokens=128, eos_token_ids=eos, baseline=False, batch_size=bs, desc="x", reuse_prefixes=True, workers=1)
run_conversations(target, d, tok, convs[:2], **kw)
t0 = time.perf_counter()
import contextlib, os
prof_on = os.environ.get("PROF") == "1"
with (torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if prof_on else contextlib.nullcontext()) as prof:
    recs = run_conversations(target, d, tok, convs, **kw)
wall = time.perf_counter() - t0
new = sum(r["stats"]["new_tokens"] for r in recs)
print(f"bs {bs} threads {threads}: {new} tokens in {wall:.2f}s (profiled) = {new/wall:.1f} tok/s")
if prof_on: print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
