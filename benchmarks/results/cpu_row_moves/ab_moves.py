"""Issue 24's CPU ratio with and without rows moving between the workers, in rounds of three passes side by side:
batch 1 (2 threads, eval's default for the 27M target), batch 8 over eval's two one-thread workers with rows moving at
the tail (the default), and the same without (``move_rows=False``, the code before). Each batch-8 pass is compared with
the batch-1 pass of its round; every turn's tokens and accepted counts against the first batch-1 pass.

    git apply benchmarks/results/cpu_row_moves/row_moves.patch   # the code measured (tried, not kept: reverted)
    python benchmarks/results/cpu_row_moves/ab_moves.py --drafter EXPORT --questions 16 --rounds 3 [--pld]
"""
import argparse
import statistics
import sys
import time

sys.path.insert(0, ".")
import torch  # noqa: E402

from eval.runner import run_conversations  # noqa: E402
from infer.loading import eos_ids, load_models  # noqa: E402
from infer.prompt_lookup import PromptLookupDrafter  # noqa: E402
from infer.prompts import mt_bench  # noqa: E402
from models.sampling import SamplingConfig  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--target", default="../shared/targets/qwen3-27m-sharegpt")
p.add_argument("--drafter", required=True)
p.add_argument("--questions", type=int, default=16)
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--pld", action="store_true", help="prompt lookup (15 drafts) instead of the drafter")
args = p.parse_args()
target, drafter, tok = load_models(args.target, args.drafter, "cpu", batch_size=8)
if args.pld:
    drafter = PromptLookupDrafter(num_draft_tokens=drafter.block_size - 1, vocab_size=target.lm_head.weight.shape[0])
eos = eos_ids(tok, target.model)
convs = mt_bench(args.questions)
kw = dict(prefill_tokens=0, sampling=SamplingConfig(), max_new_tokens=128, eos_token_ids=eos, baseline=False, desc="pass")
key = lambda r: (str(r["id"]), r["turn"])  # noqa: E731
first, ratios = None, {True: [], False: []}
print(f"# {type(drafter).__name__}, {len(convs)} MT-Bench conversations, 128 new tokens a turn, greedy")
print("round | pass | wall s | tokens/s | vs batch 1 of the round | moves | turns equal to batch 1")
for i in range(args.rounds):
    base = None
    for name, bs, move in (("batch 1, 2 threads", 1, True), ("batch 8, rows move", 8, True), ("batch 8, rows stay", 8, False)):
        torch.set_num_threads(2 if bs == 1 else 1)
        t0 = time.perf_counter()
        got = sorted(run_conversations(target, drafter, tok, convs, batch_size=bs, workers=1 if bs == 1 else 2, move_rows=move, **kw), key=key)
        wall = time.perf_counter() - t0
        out = [(r["output_ids"], r["stats"]["accepted_per_step"]) for r in got]
        first = first or out
        tps = sum(r["stats"]["new_tokens"] for r in got) / wall
        base = base or tps
        if bs == 8:
            ratios[move].append(tps / base)
        print(f"{i + 1} | {name} | {wall:.1f} | {tps:.1f} | {tps / base:.2f}x | {sum(r['stats'].get('moved', 0) for r in got)} | "
              f"{sum(a == b for a, b in zip(out, first))}/{len(out)}", flush=True)
for move, rs in ratios.items():
    print(f"batch 8 / batch 1, rows {'move' if move else 'stay'}: {', '.join(f'{r:.2f}x' for r in rs)}; median {statistics.median(rs):.2f}x")
