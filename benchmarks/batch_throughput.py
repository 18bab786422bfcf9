"""Batched evaluation against batch 1: throughput (new tokens over the pass's wall time, prefills included) and
whether every turn's tokens and accepted counts per step are the same.

    python benchmarks/batch_throughput.py --target ../shared/targets/qwen3-27m-sharegpt --drafter EXPORT \
        --questions 16 --max-new-tokens 128 --batch-sizes 1 8

Runs MT-Bench's first ``--questions`` conversations (both turns) through ``eval.runner.run_conversations`` for the
target alone, prompt lookup and the drafter (when given), once per batch size (``--repeat``: that many passes each, the
first of a shape compiling and capturing its step graphs on a GPU, the later ones warm); prints one row per pass.
``--interleave`` runs the repeats as pairs (1 8 1 8 ...), each pass's "vs batch 1" against the pass of the first batch
size just before it, and prints the median of those ratios: on a machine whose speed drifts by 10-20% within the hour
(the 2-core CPU machines), a pair measured side by side says more than passes minutes apart.
Prompt lookup drafts ``--pld-drafts`` tokens a step (default: the drafter's block size less one, else 7); ``--dtype``
as eval's (bf16 on a CPU with AMX is faster, but its products are not batch-invariant: the last column then says so).
Drafting options as eval's (``--draft-steps``, ``--tree-topk/--tree-tokens/--tree-lookup/--tree-redraft``; trees at
every batch size, batch 1 included, on the static drafters).
``--phase-times`` (GPU) adds each pass's device time per batch step by phase (draft, verify, tree acceptance, path moves,
drafter append; CUDA events around each) beside its wall time per step: what the host costs between the graphs.
Each batch size runs on eval's default CPU threads for it (1 at batch 1, one per core when batched) unless ``--threads``
fixes one count for all one-process runs; a batch that eval splits over forked one-thread workers (``--cpu-workers``,
auto: one per core when every core gets 4 rows or more) is split here too, whatever ``--threads`` says. On a shared
machine the wall time counts other processes' load: the CPU seconds of this process (all its threads) and of its
workers, and the tokens per CPU second beside them, count only this run's work.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.script import run_main  # noqa: E402

from infer.prompts import mt_bench  # noqa: E402
from eval.runner import cpu_workers, run_conversations  # noqa: E402
from infer.loading import drafting_label, eos_ids, load_models, resolve_device, set_threads  # noqa: E402
from infer.prompt_lookup import PromptLookupDrafter  # noqa: E402
from models.sampling import SamplingConfig  # noqa: E402


def cpu_now() -> float:
    """CPU seconds of this process and of its finished children (eval's forked workers)."""
    return time.process_time() + sum(resource.getrusage(resource.RUSAGE_CHILDREN)[:2])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--target", required=True)
    p.add_argument("--drafter")
    p.add_argument("--questions", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", help="the models' dtype, as eval's --dtype (auto: bfloat16 on a GPU, float32 on the CPU)")
    p.add_argument("--threads", type=int, help="CPU threads for every batch size (default: eval's, 1 at batch 1, one per core above)")
    p.add_argument("--cpu-workers", type=int, default=0,
                   help="batched on the CPU: forked one-thread processes (eval's --cpu-workers; default 0 = eval's auto, here whatever "
                        "--threads says; 1 = one process)")
    p.add_argument("--only", nargs="+", choices=["alone", "pld", "drafter"], help="run only these (default: all three)")
    p.add_argument("--pld-drafts", type=int, default=None,
                   help="prompt lookup's drafts per step (default: the drafter's block size - 1 with --drafter, else 7)")
    p.add_argument("--no-prefix-reuse", dest="prefix_reuse", action="store_false",
                   help="prefill every turn's whole prompt (default: as eval, past what the row's cache holds from the turn before)")
    p.add_argument("--draft-steps", type=int)
    p.add_argument("--tree-topk", type=int)
    p.add_argument("--tree-tokens", type=int)
    p.add_argument("--tree-lookup", type=int, default=0)
    p.add_argument("--tree-redraft", type=int, default=0, help="DFlash trees: depths re-drafted with their path in place")
    p.add_argument("--repeat", type=int, default=1, help="passes per batch size (on a GPU the first compiles and captures)")
    p.add_argument("--interleave", action="store_true",
                   help="with --repeat: the batch sizes in turn (1 8 1 8 ...), each pass compared with the latest pass of the first "
                        "batch size, and the ratios' median printed: a machine whose speed drifts moves both sides of a pair together")
    p.add_argument("--phase-times", action="store_true",
                   help="GPU: CUDA events around each phase of a step (draft, verify, acceptance, path moves, drafter append); "
                        "prints each pass's device time per batch step by phase beside its wall time per step")
    p.add_argument("--out")
    args = p.parse_args()
    if args.pld_drafts is not None and args.pld_drafts < 1:
        p.error(f"--pld-drafts {args.pld_drafts}: expected a positive number of drafts")
    device = resolve_device(args.device)
    target, drafter, tokenizer = load_models(args.target, args.drafter, device, dtype=args.dtype, draft_steps=args.draft_steps, tree_topk=args.tree_topk,
                                             tree_tokens=args.tree_tokens, tree_lookup=args.tree_lookup, tree_redraft=args.tree_redraft)
    eos = eos_ids(tokenizer, target.model)
    conversations = mt_bench(args.questions)
    pld_drafts = args.pld_drafts or ((drafter.block_size - 1) if drafter else 7)
    drafters = {"target alone": None, "prompt lookup": PromptLookupDrafter(num_draft_tokens=pld_drafts,
                                                                            vocab_size=target.lm_head.weight.shape[0])}
    if drafter is not None:
        drafters[f"{type(drafter).__name__} ({drafting_label(drafter)})"] = drafter
    if args.only:
        keep = [name for key, name in zip(["alone", "pld", "drafter"], drafters) if key in args.only]
        drafters = {name: drafters[name] for name in keep}
    device_name = torch.cuda.get_device_name() if device == "cuda" else "cpu (threads: each row's)"
    print(f"# {device_name} | {len(conversations)} conversations, {args.max_new_tokens} new tokens per turn, greedy")
    print("drafter | batch | threads | turns | new tokens | wall s | tokens/s | vs batch 1 | CPU s | tokens/CPU s | vs batch 1 | τ | "
          "same tokens and steps as batch 1")
    rows = []
    for name, d in drafters.items():
        first = None  # the first pass of the first batch size: the tokens and steps every pass must repeat
        latest = None  # with --interleave, the latest pass of the first batch size: what a pass's speed is compared with
        ratios: dict[int, list[float]] = {}
        order = ([b for _ in range(args.repeat) for b in args.batch_sizes] if args.interleave else
                 [b for b in args.batch_sizes for _ in range(args.repeat)])
        for bs in order:
            set_threads(device, args.threads, bs, target.model)  # eval's default for this batch size and target unless --threads says
            # --threads sets the one-process runs (batch 1's faster count, say); forked workers run one thread each
            workers = cpu_workers(device, bs, None, args.cpu_workers if bs > 1 else None)  # the batched runs' workers
            threads = torch.get_num_threads() if workers == 1 else f"1 x {workers} workers"
            phases = PhaseTimer(target, d) if args.phase_times and device == "cuda" else None
            t0, c0 = time.perf_counter(), cpu_now()
            records = run_conversations(target, d, tokenizer, conversations, prefill_tokens=0, sampling=SamplingConfig(),
                                        max_new_tokens=args.max_new_tokens, eos_token_ids=eos, baseline=False, batch_size=bs,
                                        desc=f"{name}, batch {bs}", reuse_prefixes=args.prefix_reuse, workers=workers)
            wall, cpu = time.perf_counter() - t0, cpu_now() - c0
            records = sorted(records, key=lambda r: (str(r["id"]), r["turn"]))
            new = sum(r["stats"]["new_tokens"] for r in records)
            steps = [a for r in records for a in r["stats"]["accepted_per_step"]]
            outcome = [(r["output_ids"], r["stats"]["accepted_per_step"]) for r in records]
            if first is None:
                first = (new / wall, outcome, new / cpu)
            # each pass against the latest pass of the first batch size: without --interleave the first such pass was every
            # row's reference, on a GPU the one that compiled and captured (a 3.75x for a warm-against-warm 2.5x)
            if bs == args.batch_sizes[0]:
                latest = (new / wall, outcome, new / cpu)
            same = sum(a == b for a, b in zip(outcome, first[1]))
            row = {"drafter": name, "batch_size": bs, "turns": len(records), "new_tokens": new, "wall_s": wall, "tokens_per_s": new / wall,
                   "vs_first": new / wall / latest[0], "cpu_s": cpu, "tokens_per_cpu_s": new / cpu,
                   "vs_first_cpu": new / cpu / latest[2], "threads": threads, "tau": sum(a + 1 for a in steps) / max(len(steps), 1), "same": f"{same}/{len(records)}"}
            rows.append(row)
            if bs != args.batch_sizes[0]:
                ratios.setdefault(bs, []).append(row["vs_first"])
            print(f"{name} | {bs} | {threads} | {row['turns']} | {new} | {wall:.1f} | {row['tokens_per_s']:.1f} | {row['vs_first']:.2f}x | {cpu:.1f} | "
                  f"{row['tokens_per_cpu_s']:.1f} | {row['vs_first_cpu']:.2f}x | {row['tau']:.3f} | "
                  f"{row['same']}", flush=True)
            if phases is not None:
                row["phase_ms_per_step"], row["batch_steps"] = phases.finish()
                print(f"  device ms per batch step ({row['batch_steps']} steps, wall {1e3 * wall / max(row['batch_steps'], 1):.2f} ms per step, "
                      "prefills included): " + ", ".join(f"{k} {v:.3f}" for k, v in row["phase_ms_per_step"].items()), flush=True)
        for bs, got in ratios.items():
            print(f"  {name}, batch {bs} / batch {args.batch_sizes[0]}: {', '.join(f'{r:.2f}x' for r in got)}; median "
                  f"{statistics.median(got):.2f}x", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"device": device_name, "args": vars(args), "rows": rows}, indent=2))


class PhaseTimer:
    """CUDA events around the batched loop's phases, by wrapping the target's and drafter's step methods and the tree
    acceptance (``infer.batch.accept_trees``) for one pass; ``finish`` restores them and returns the device time per
    batch step by phase (an event pair spans the phase's kernels and any idle time between them: an eager phase
    launched slower than it runs shows as its launch time) and the number of batch steps (verify calls)."""

    NAMES = {"draft": ("drafter", ["draft_tree", "draft_chain", "block_logits"]), "verify": ("target", ["step", "tree_step", "tree_greedy"]),
             "move paths": ("target", ["move_paths"]), "append": ("drafter", ["append"])}

    def __init__(self, target, drafter):
        import infer.batch

        self.spans: dict[str, list] = {}
        self.restore = []
        owners = {"target": target, "drafter": drafter}
        for phase, (owner, methods) in self.NAMES.items():
            obj = owners[owner]
            for method in methods:
                if obj is not None and hasattr(obj, method):
                    setattr(obj, method, self.wrap(phase, getattr(obj, method)))
                    self.restore.append((obj, method, None))
        self.restore.append((infer.batch, "accept_trees", infer.batch.accept_trees))
        infer.batch.accept_trees = self.wrap("acceptance", infer.batch.accept_trees)

    def wrap(self, phase: str, fn):
        def timed(*args, **kwargs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn(*args, **kwargs)
            end.record()
            self.spans.setdefault(phase, []).append((start, end))
            return out
        return timed

    def finish(self) -> tuple[dict[str, float], int]:
        torch.cuda.synchronize()
        for obj, method, original in self.restore:
            if original is None:
                delattr(obj, method)  # the instance attribute shadowing the class's method
            else:
                setattr(obj, method, original)
        steps = len(self.spans.get("verify", []))
        return {phase: sum(s.elapsed_time(e) for s, e in spans) / max(steps, 1) for phase, spans in self.spans.items()}, steps


if __name__ == "__main__":
    run_main(main)  # bad input (a flag, a missing or malformed file): one line, not a traceback
