"""python ab.py 80 2 (conversations, repetitions). A/B: prompt lookup's staged verify (verify_stages -> 4) against one pass (None), alternating, batch 8 workers and batch 1."""
import sys, time
sys.path.insert(0, ".")  # run from the repository root with pld_staged.patch applied (git apply)
import torch
import infer.generate as G
from infer.prompts import mt_bench
from eval.runner import cpu_workers, run_conversations
from infer.loading import eos_ids, load_models, set_threads
from infer.prompt_lookup import PromptLookupDrafter
from models.sampling import SamplingConfig

target, _, tok = load_models("../shared/targets/qwen3-27m-sharegpt", None, "cpu", batch_size=8)
eos = eos_ids(tok, target.model)
convs = mt_bench(int(sys.argv[1]))
pld = PromptLookupDrafter(num_draft_tokens=15, vocab_size=target.lm_head.weight.shape[0])
orig = G.verify_stages
for rep in range(int(sys.argv[2])):
    for bs in (8, 1):
        for mode in ("staged", "one pass"):
            G.verify_stages = orig if mode == "staged" else (lambda *a, **k: None)
            set_threads("cpu", 2, bs, target.model)
            workers = cpu_workers("cpu", bs, None, 0)
            t0 = time.perf_counter()
            recs = run_conversations(target, pld, tok, convs, prefill_tokens=0, sampling=SamplingConfig(), max_new_tokens=128,
                                     eos_token_ids=eos, baseline=False, batch_size=bs, workers=workers, desc="x")
            wall = time.perf_counter() - t0
            new = sum(r["stats"]["new_tokens"] for r in recs)
            print(f"rep {rep} batch {bs} {mode}: {new / wall:.1f} tok/s ({wall:.1f} s)", flush=True)
