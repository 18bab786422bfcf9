"""python ab_gpu.py CONVERSATIONS REPS PREFILL TARGET (on a GPU): prompt lookup drafting from its n-gram index (today) against the scan of the whole
sequence every step (the code before: a subclass), alternating in one process, batch 1 and batch 8 (one process on the GPU)."""
import sys, time
sys.path.insert(0, ".")  # run from the repository root
import torch
from infer.prompts import mt_bench
from eval.runner import cpu_workers, run_conversations
from infer.loading import eos_ids, load_models, set_threads
from infer.prompt_lookup import PromptLookupDrafter, lookup_drafts
from models.sampling import SamplingConfig


class ScanningLookup(PromptLookupDrafter):  # the code before: every draft scans the whole sequence
    def draft(self, token, anchor, sampling, generator):
        return torch.tensor(lookup_drafts(self.tokens + [int(token)], self.num_draft_tokens, self.max_ngram, self.min_ngram),
                            dtype=torch.long, device=token.device), None


target, _, tok = load_models(sys.argv[4], None, "cuda", batch_size=8)
eos = eos_ids(tok, target.model)
convs = mt_bench(int(sys.argv[1]))
prefill = int(sys.argv[3]) if len(sys.argv) > 3 else 0
k, V = 15, target.lm_head.weight.shape[0]
for rep in range(int(sys.argv[2])):
    for bs in (1, 8):
        outs = {}
        for name, cls in (("index", PromptLookupDrafter), ("scan", ScanningLookup)):
            pass
            workers = 1
            t0 = time.perf_counter()
            recs = run_conversations(target, cls(num_draft_tokens=k, vocab_size=V), tok, convs, prefill_tokens=prefill,
                                     sampling=SamplingConfig(), max_new_tokens=128, eos_token_ids=eos, baseline=False,
                                     batch_size=bs, workers=workers, desc="x")
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
            new = sum(r["stats"]["new_tokens"] for r in recs)
            outs[name] = sorted((str(r["id"]), r["turn"], r["output_ids"], r["stats"]["accepted_per_step"]) for r in recs)
            print(f"rep {rep} batch {bs} {name}: {new / wall:.1f} tok/s ({wall:.1f} s)", flush=True)
        print(f"  same tokens and steps: {outs['index'] == outs['scan']}", flush=True)
