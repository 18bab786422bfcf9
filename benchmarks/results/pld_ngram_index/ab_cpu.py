"""python ab_cpu.py CONVERSATIONS REPS [PREFILL]: prompt lookup drafting from its n-gram index (today) against the scan of the whole
sequence every step (the code before: a subclass), alternating in one process, batch 8 over eval's workers and batch 1."""
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


target, _, tok = load_models("../shared/targets/qwen3-27m-sharegpt", None, "cpu", batch_size=8)
eos = eos_ids(tok, target.model)
convs = mt_bench(int(sys.argv[1]))
prefill = int(sys.argv[3]) if len(sys.argv) > 3 else 0
k, V = 15, target.lm_head.weight.shape[0]
for rep in range(int(sys.argv[2])):
    for bs in (8, 1):
        outs = {}
        for name, cls in (("index", PromptLookupDrafter), ("scan", ScanningLookup)):
            set_threads("cpu", 2, bs, target.model)
            workers = cpu_workers("cpu", bs, None, 0)
            t0 = time.perf_counter()
            recs = run_conversations(target, cls(num_draft_tokens=k, vocab_size=V), tok, convs, prefill_tokens=prefill,
                                     sampling=SamplingConfig(), max_new_tokens=128, eos_token_ids=eos, baseline=False,
                                     batch_size=bs, workers=workers, desc="x")
            wall = time.perf_counter() - t0
            new = sum(r["stats"]["new_tokens"] for r in recs)
            outs[name] = sorted((str(r["id"]), r["turn"], r["output_ids"], r["stats"]["accepted_per_step"]) for r in recs)
            print(f"rep {rep} batch {bs} {name}: {new / wall:.1f} tok/s ({wall:.1f} s)", flush=True)
        print(f"  same tokens and steps: {outs['index'] == outs['scan']}", flush=True)
