"""python draft_cost.py: prompt lookup's cost per draft, its n-gram index against the scan, over the last 128 positions of
real text (eval's ShareGPT filler document before an MT-Bench question) at 1K, 8K and 32K tokens; the drafts compared."""
import sys
import time

import torch
from transformers import AutoTokenizer

sys.path.insert(0, ".")  # run from the repository root
from infer.prompts import chat_ids, first_turn_content  # noqa: E402
from infer.prompt_lookup import PromptLookupDrafter, lookup_drafts  # noqa: E402
from models.sampling import SamplingConfig  # noqa: E402

tok = AutoTokenizer.from_pretrained("../shared/targets/qwen3-27m-sharegpt")
for prefill in (1000, 8000, 32000):
    ids = chat_ids(tok, [{"role": "user", "content": first_turn_content(tok, "Write a haiku about rain.", prefill, offset=0)}])
    L = len(ids) - 128
    d = PromptLookupDrafter(15)
    d.append_context(None, 0, torch.tensor(ids[:L]))
    t_index = t_scan = 0.0
    same = True
    for p in range(L, L + 128):
        t = time.perf_counter()
        a = d.draft(torch.tensor(ids[p]), p, SamplingConfig(), None)[0].tolist()
        t_index += time.perf_counter() - t
        t = time.perf_counter()
        b = lookup_drafts(ids[:p + 1], 15)
        t_scan += time.perf_counter() - t
        same &= a == b
        d.append_context(None, p, torch.tensor([ids[p]]))
    print(f"context {len(ids)} tokens (real ShareGPT filler), 128 steps: index {t_index / 128 * 1e3:.3f} ms a draft, "
          f"scan {t_scan / 128 * 1e3:.3f} ms; same drafts {same}")
