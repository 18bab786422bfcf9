import sys, time, torch
sys.path.insert(0, "/work/main")
from eval.runner import run_conversations
from infer.loading import eos_ids, load_models
from infer.prompts import mt_bench
from infer.prompt_lookup import PromptLookupDrafter
from models.sampling import SamplingConfig
half = int(sys.argv[1]); torch.set_num_threads(1)
target, _, tok = load_models("/work/shared/targets/qwen3-27m-sharegpt", None, "cpu")
eos = eos_ids(tok, target.model)
convs = mt_bench(16)[half::2]
d = PromptLookupDrafter(num_draft_tokens=15, vocab_size=target.lm_head.weight.shape[0])
kw = dict(prefill_tokens=0, sampling=SamplingConfig(), max_new_tokens=128, eos_token_ids=eos, baseline=False, batch_size=4, desc="x", reuse_prefixes=True, workers=1)
run_conversations(target, d, tok, mt_bench(16)[:1], **kw)
open(f"/tmp/prof/ready{half}", "w").close()
while not all(__import__("os").path.exists(f"/tmp/prof/ready{h}") for h in (0, 1)): time.sleep(0.05)
t0 = time.perf_counter(); c0 = time.process_time()
recs = run_conversations(target, d, tok, convs, **kw)
wall = time.perf_counter() - t0; cpu = time.process_time() - c0
new = sum(r["stats"]["new_tokens"] for r in recs)
print(f"half {half}: {new} tokens in {wall:.2f}s = {new/wall:.1f} tok/s, cpu {cpu:.2f}s")
