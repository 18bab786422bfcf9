import sys, time, torch
sys.path.insert(0, ".")  # run from the repository root
torch.set_num_threads(1)
from collections import Counter
from infer.loading import load_models, eos_ids
from infer.prompts import mt_bench, chat_ids
from infer.generate import generate
target, drafter, tok = load_models("/work/shared/targets/qwen3-27m-sharegpt", "/work/recipe_export", torch.device("cpu"))
print(type(target).__name__, type(drafter).__name__, drafter.block_size)
eos = eos_ids(tok, None) if False else [tok.convert_tokens_to_ids("<|im_end|>")]
h = Counter(); t = time.time(); n = 0
for c in mt_bench(12):
    ids = chat_ids(tok, [{"role": "user", "content": c.turns[0]}])
    g = generate(target, drafter, ids, 128, eos_token_ids=eos)
    h.update(g.stats.accepted_per_step); n += g.stats.new_tokens
print("tokens/s", n / (time.time() - t))
tot = sum(h.values())
print(sorted(h.items()))
for c in range(1, 16):
    print(c, "P(acc>=c)=%.3f" % (sum(v for k, v in h.items() if k >= c) / tot))
