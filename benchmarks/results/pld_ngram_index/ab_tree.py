"""python ab_tree.py CONVERSATIONS REPS PREFILL TARGET DRAFTER (a GPU): DFlash trees with prompt lookup's branch
(--tree-topk 32 --tree-tokens 1024 --tree-redraft 4 --tree-lookup 15, batch 8: the held-out 32K sweeps' configuration),
the branch from its growing n-gram index (today) against a scan of the row's text every step (the code before),
alternating in one process."""
import os, sys, time
sys.path.insert(0, ".")  # run from the repository root
import torch
import infer.batch
from infer.prompts import mt_bench
from eval.runner import run_conversations
from infer.loading import eos_ids, load_models
from infer.prompt_lookup import GrowingLookup, lookup_drafts
from models.sampling import SamplingConfig


class ScanningLookup:  # the code before: the whole text scanned every step
    def __call__(self, prompt, out, k):
        return lookup_drafts(prompt + out, k)


DEVICE = os.environ.get("DEVICE", "cuda")
TOPK, TOKENS = (int(x) for x in os.environ.get("TREE", "32,1024").split(","))
target, drafter, tok = load_models(sys.argv[4], sys.argv[5], DEVICE, tree_topk=TOPK, tree_tokens=TOKENS, tree_redraft=4,
                                   tree_lookup=15, batch_size=8)
eos = eos_ids(tok, target.model)
convs = mt_bench(int(sys.argv[1]))
for rep in range(int(sys.argv[2])):
    outs = {}
    for name, cls in (("index", GrowingLookup), ("scan", ScanningLookup)):
        infer.batch.GrowingLookup = cls
        t0 = time.perf_counter()
        recs = run_conversations(target, drafter, tok, convs, prefill_tokens=int(sys.argv[3]), sampling=SamplingConfig(),
                                 max_new_tokens=128, eos_token_ids=eos, baseline=False, batch_size=8, desc="x")
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        new = sum(r["stats"]["new_tokens"] for r in recs)
        steps = [a for r in recs for a in r["stats"]["accepted_per_step"]]
        outs[name] = sorted((str(r["id"]), r["turn"], r["output_ids"], r["stats"]["accepted_per_step"]) for r in recs)
        print(f"rep {rep} {name}: {new / wall:.1f} tok/s ({wall:.1f} s), tau {sum(a + 1 for a in steps) / len(steps):.2f}", flush=True)
    print(f"  same tokens and steps: {outs['index'] == outs['scan']}", flush=True)
