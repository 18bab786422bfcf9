# batch-1 trees: the eager drafter through generate against the static drafter through generate_batch(batch_size=1)
import sys, time, json, torch
sys.path.insert(0, "/work/main")
from infer.loading import load_models
from infer.generate import generate
from infer.batch import generate_batch
torch.set_num_threads(int(__import__("os").environ.get("THREADS", "2")))
T = "/work/shared/targets/qwen3-27m-sharegpt"
qs = [json.loads(l) for l in open("/work/shared/data/mt_bench/question.jsonl")][:6]
for kind, backend in (("eager", "flashinfer"), ("static", "sdpa")):
    target, drafter, tok = load_models(T, "/work/recipe_export", tree_topk=8, tree_tokens=64, tree_lookup=15)
    if kind == "eager":  # the eager drafter (SDPA) beside the static target, as load_models built it for batch-1 trees before
        from models.dflash import DFlashDrafter
        drafter = DFlashDrafter(drafter.model, target.embed_tokens, target.lm_head, tree_topk=8, tree_tokens=64, tree_lookup=15)
    prompts = [tok.apply_chat_template([{"role": "user", "content": q["turns"][0]}], add_generation_prompt=True) for q in qs]
    prompts = [p if isinstance(p, list) else p["input_ids"] for p in prompts]
    for rep in range(2):
        t = time.time()
        if kind == "eager":
            gens = [generate(target, drafter, p, 96) for p in prompts]
        else:
            gens = generate_batch(target, drafter, prompts, 96, batch_size=1)
        dt = time.time() - t
        n = sum(len(g.tokens) for g in gens); steps = sum(len(g.stats.accepted_per_step) for g in gens)
        print(kind, rep, f"{n/dt:.1f} tok/s tau {n/steps:.3f}", [len(g.tokens) for g in gens], flush=True)
    if kind == "eager": ref = [g.tokens for g in gens]
    else: print("same tokens:", ref == [g.tokens for g in gens])
