"""Decode speed at a real shape: the static-cache, captured loop against today's eager loop, in one run.

A random-init target of a real shape (default Qwen3-8B's, bf16) on one GPU. Prints:
  1. the GPU's memory bandwidth as measured here (a device-to-device copy and a reduction; the larger);
  2. autoregressive decoding, batch 1, at each context: tokens/s, ms per token, the fraction of the bandwidth
     the step's bytes (weights + the keys/values it reads) make of it, the time outside the forwards, prefill s;
     the eager loop (``CachedTarget``) beside it at the first and last context;
  3. one captured forward of 1 and of ``--verify-tokens`` tokens at each context (median of CUDA-event timings);
  4. speculative decoding with random drafters of the matching shape whose steps accept a given number of drafts
     (``generate(..., accept_per_step=τ-1)``, the real loop's work per step): tokens/s and speedup over (2) at the
     first context, and over (3)'s one-token forward alone there (the captured greedy step replayed back to back,
     queued behind a GPU sleep: no launch or host turn between forwards, the strictest baseline; before 2026-12-05 each
     forward was timed from an idle GPU, up to 2.3% slower than the loop's own token, which made that column the more
     generous one), τ = ``--taus``: DFlash and EAGLE-3 chains (k = τ) as the loop runs them (static caches, the draft
     captured), and each one's eager drafter, as it ran before its static one, at the second τ; with ``--traces``,
     the static drafters once more per trace, each step accepting what a real run accepted at the same step
     (``eval.acceptance_trace``: eval's results, a sweep cell or a compact copy; thinned evenly across the whole run
     to the steps ``--new-tokens`` takes), at the τ that replay makes (printed beside the whole trace's).

    python benchmarks/decode_speed.py --shape qwen3-8b --contexts 1024 8192 32768 --out decode.json
    python benchmarks/decode_speed.py --contexts 8192 --drafters dflash eagle3 --taus 3 \
        --traces benchmarks/results/issue25_smollm2_dflash_redraft_h100/mtbench_new_chain_summary.json
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.infer_speed import SHAPES  # noqa: E402
from benchmarks.shapes import zlab_feature_layers  # noqa: E402
from eval.acceptance_trace import read_acceptance_trace  # noqa: E402
from infer.generate import generate  # noqa: E402
from models.dflash import DFlashDrafter, DFlashDraftModel, StaticDFlashDrafter, make_dflash_config  # noqa: E402
from models.eagle3 import Eagle3Drafter, Eagle3DraftModel, StaticEagle3Drafter, make_eagle3_config  # noqa: E402
from models.static_target import StaticTarget  # noqa: E402
from models.target import CachedTarget  # noqa: E402
from benchmarks.measure import require_cuda  # noqa: E402
require_cuda(__doc__, __name__, flags=True)  # one line on a machine without a CUDA GPU


# "-eager": the drafter before its static one, at the second τ; "dflash-vocab": DFlash with a draft vocabulary of
# --draft-vocab ids (its head the target's rows of them), the same layers
DRAFTERS = ("dflash", "dflash-vocab", "dflash-eager", "eagle3", "eagle3-eager")
DFLASH_BLOCK = 16  # the benchmark drafter's block (z-lab's Qwen3-8B drafters')
PRODUCTS = {"default": None, "cublas": False, "triton": True}  # --*-products -> the static models' triton_products


def cuda_ms(fn, repeats: int = 20, warmup: int = 3) -> float:
    """Median milliseconds of ``fn()`` between CUDA events, each call from a synchronised start."""
    times = []
    for i in range(warmup + repeats):
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(a.elapsed_time(b))
    return statistics.median(times)


def back_to_back_ms(fn, calls: int = 8) -> float:
    """Milliseconds a call of ``fn()`` (a captured step) takes replayed back to back: ``calls`` calls queued behind a
    GPU sleep (``measure.median_ms(queued=True)``), so no launch, input fill or idle GPU between them counts. Each call
    timed alone from a synchronised start (``cuda_ms``, the timer before 2026-12-05) ran 2.2-2.3% slower than the loop's
    own token at 1K and 32K on an H100: a "forward alone" baseline more generous than the loop it was to be stricter than."""
    from benchmarks.measure import median_ms

    def run():
        for _ in range(calls):
            fn()

    return median_ms(run, queued=True) / calls


def measured_bandwidth() -> dict:
    n = 2 << 30  # 2 GiB per buffer
    src = torch.empty(n // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    copy_ms = cuda_ms(lambda: dst.copy_(src))
    sum_ms = cuda_ms(lambda: src.sum(dtype=torch.float32))
    del src, dst
    torch.cuda.empty_cache()
    copy_bw, sum_bw = 2 * n / copy_ms / 1e9, n / sum_ms / 1e9  # TB/s
    return {"copy_TBps": copy_bw, "read_TBps": sum_bw, "TBps": max(copy_bw, sum_bw)}


def with_draft_vocab(dflash: DFlashDraftModel, target_head: torch.nn.Module, size: int) -> DFlashDraftModel:
    """The same drafter with a draft vocabulary of ``size`` ids (random counts: which ids does not change the speed)."""
    from models.eagle3 import build_draft_vocab

    config = copy.deepcopy(dflash.config)
    config.draft_vocab_size = size
    with torch.device(target_head.weight.device):
        reduced = DFlashDraftModel(config).to(target_head.weight.dtype).eval().requires_grad_(False)
    reduced.load_state_dict(dflash.state_dict(), strict=False)
    counts = torch.randint(1, 1000, (config.vocab_size,), generator=torch.Generator().manual_seed(0))
    reduced.set_draft_vocab(*(t.to(target_head.weight.device) for t in build_draft_vocab(dict(enumerate(counts.tolist())), config.vocab_size, size)),
                            target_head.weight)
    return reduced


def build(shape: str):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**SHAPES[shape])
    torch.manual_seed(0)
    with torch.device("cuda"):
        torch.set_default_dtype(torch.bfloat16)
        model = Qwen3ForCausalLM(config).eval().requires_grad_(False)
        layers = config.num_hidden_layers
        dflash_ids = zlab_feature_layers(layers)
        dflash = DFlashDraftModel(make_dflash_config(config, num_hidden_layers=5, block_size=DFLASH_BLOCK, mask_token_id=151669,
                                                     target_layer_ids=dflash_ids, layer_types=["sliding_attention"] * 4 + ["full_attention"],
                                                     sliding_window=2048)).eval()
        eagle3 = Eagle3DraftModel(make_eagle3_config(config, num_hidden_layers=1, target_layer_ids=[1, layers // 2 - 1, layers - 4],
                                                     layer_types=["sliding_attention"], sliding_window=2048, draft_vocab_size=32000)).eval()
        torch.set_default_dtype(torch.float32)
    eagle3.embed_tokens.weight.data = model.get_input_embeddings().weight.data
    return model, dflash, eagle3


def forcings(name: str, k: int, taus: list[int], traces: list, new_tokens: int) -> list[tuple]:
    """The speculative rows of drafter ``name`` (``k``: DFlash's verified drafts, 0 = its whole block): (τ, the
    ``accept_per_step`` its steps are forced to, the trace or None, why it is skipped or None). A fixed τ accepts τ - 1
    a step (EAGLE-3 drafting a chain of τ); a trace accepts its counts thinned evenly across its whole run to the steps
    ``new_tokens`` takes (``AcceptanceTrace.spread``), EAGLE-3 drafting the run's chain (at least its longest accepted
    run), DFlash its block; τ is then one more than the most drafts a step must hold (EAGLE-3's chain; the replay's own
    τ is the run's to measure). The eager drafters run the second τ only, no trace."""
    rows = []
    for tau in taus if not name.endswith("-eager") else taus[1:2]:
        rows.append((tau, tau - 1, None))
    for trace in traces if not name.endswith("-eager") else []:
        forced = trace.spread(math.ceil(new_tokens / trace.tau) + 1)
        chain = max(max(forced), (trace.block_size or 0) - 1, 1) if name == "eagle3" else max(forced)
        rows.append((chain + 1, forced, trace))
    out = []
    for tau, forced, trace in rows:
        drafts = k or (DFLASH_BLOCK - 1 if name in ("dflash", "dflash-vocab") else tau - 1)
        skipped = None
        if tau - 1 > drafts:
            what = f"{trace.path}'s steps accept up to {tau - 1}" if trace is not None else f"tau {tau}"
            skipped = f"{name} (block {drafts + 1}) | {what} | skipped: a chain of {drafts} drafts accepts at most {drafts} a step"
        out.append((tau, forced, trace, skipped))
    return out


def kv_bytes(target: StaticTarget, positions: float) -> float:
    """Keys + values of ``positions`` positions of one row, every layer: what a step must read of the cache (the
    products path reads the whole capacity; only the visible part is counted, the stricter figure)."""
    layers, _, hkv, _, d = target.k_cache.shape
    return 2 * layers * hkv * d * target.k_cache.element_size() * positions


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="qwen3-8b", choices=sorted(SHAPES))
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 8192, 32768])
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--verify-tokens", type=int, default=16)
    p.add_argument("--taus", type=int, nargs="+", default=[2, 3, 4, 5])
    p.add_argument("--compile", action="store_true", help="decoder layers under torch.compile inside the graphs")
    p.add_argument("--eager-baseline", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--attention", nargs="+", default=["products", "split_kv"], choices=["products", "split_kv"],
                   help="decode attention paths timed in turn (StaticTarget's decode_attention); the last one runs the drafters")
    p.add_argument("--drafters", nargs="+", default=list(DRAFTERS), choices=DRAFTERS, help="speculative rows timed (section 4)")
    p.add_argument("--draft-vocab", type=int, default=32000, help="dflash-vocab's draft vocabulary (EAGLE-3's here: 32000)")
    p.add_argument("--dflash-draft-steps", type=int, nargs="+", default=[0],
                   help="the dflash rows once per K: verify the block's first K drafts (infer's --draft-steps; 0 = the whole "
                   "block). This drafter's full layer is not causal inside the block, so its pass still runs the whole block")
    p.add_argument("--target-products", nargs="+", default=["default"], choices=["default", "cublas", "triton"],
                   help="the autoregressive rows once per choice of the target's few-row products (StaticTarget's "
                   "triton_products); the speculative rows run with the last, against its autoregressive row")
    p.add_argument("--dflash-products", nargs="+", default=["default"], choices=["default", "cublas", "triton"],
                   help="the dflash rows once per choice of the block pass's few-row products (StaticDFlashDrafter's "
                   "triton_products: swa_kernels/skinny_gemm.py where it has a measured tiling, else cuBLAS); default: the loop's")
    p.add_argument("--dflash-attention", nargs="+", default=["default"], choices=["default", "products", "split_kv"],
                   help="the dflash rows once per block attention (StaticDFlashDrafter's block_attention: swa_kernels/block_attention.py's "
                   "split-KV kernel or two products and a masked softmax); default: the loop's")
    p.add_argument("--drafter-weights", "--dflash-weights", dest="drafter_weights", nargs="+", default=["model"], choices=["model", "int8"],
                   help="the dflash and eagle3 rows once per choice of the drafter's matrices: the model's (bf16) or weight-only "
                   "int8 copies (the drafters' weights=; DFlash's LM head it drafts with included, the target's untouched)")
    p.add_argument("--traces", nargs="+", default=[], metavar="FILE",
                   help="real runs' acceptance, replayed step by step by the static drafters (dflash, dflash-vocab, eagle3) "
                   "after the --taus rows: eval's results.json, a sweep cell, a partial .jsonl or a compact copy under "
                   "benchmarks/results (EAGLE-3's chain as long as the run's; DFlash's block as built, the trace's counts within it)")
    p.add_argument("--out")
    args = p.parse_args()
    if any(not 0 <= k < DFLASH_BLOCK for k in args.dflash_draft_steps):
        p.error(f"--dflash-draft-steps {args.dflash_draft_steps}: expected values from 0 (the whole block) to {DFLASH_BLOCK - 1}")
    try:  # read before the GPU work: a bad file fails at once
        traces = [read_acceptance_trace(path) for path in args.traces]
    except ValueError as e:
        p.error(str(e))

    gpu = torch.cuda.get_device_name()
    result = {"gpu": gpu, "torch": torch.__version__, "shape": args.shape, "args": vars(args)}
    bw = result["bandwidth"] = measured_bandwidth()
    print(f"# {gpu} | torch {torch.__version__} | bandwidth: copy {bw['copy_TBps']:.2f} TB/s, read {bw['read_TBps']:.2f} TB/s", flush=True)
    model, dflash_model, eagle3_model = build(args.shape)
    weight_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embed_tokens" not in n)
    result["weight_GB"] = weight_bytes / 1e9
    prompt = lambda n: torch.randint(100, 100_000, (n,)).tolist()  # noqa: E731

    rows = result["autoregressive"] = []
    if args.eager_baseline:  # today's loop (HF modules, eager) before the static target fuses the weights
        eager = CachedTarget(model, [])
        for ctx in sorted({args.contexts[0], args.contexts[-1]}):
            generate(eager, None, prompt(ctx), 4)
            run = generate(eager, None, prompt(ctx), 32)
            rows.append({"loop": "eager (CachedTarget)", "context": ctx, "tokens_per_s": run.stats.tokens_per_s, "prefill_s": run.stats.prefill_s,
                         "outside_forward": run.stats.other_s / run.stats.decode_s})
            print(f"eager loop  ctx {ctx}: {run.stats.tokens_per_s:.1f} tok/s", flush=True)
        del eager
    target = StaticTarget(model, [], compile_layers=args.compile, decode_attention=args.attention[0])
    default_products = target.triton_products  # the loop's own choice, which a --target-products "default" row restores
    steps = result["forward"] = []
    print("loop | context | tok/s | ms/token | bandwidth % | outside forward % | prefill s", flush=True)
    for products, attention, ctx in ((t, a, c) for t in args.target_products for a in args.attention for c in args.contexts):
        want = default_products if products == "default" else PRODUCTS[products]  # "default" after another: back to it
        if target.triton_products != want:
            target.use_triton_products(want)
        if target.decode_attention != attention:
            target.decode_attention = attention
            target.graphs.clear()
        loop = (f"static + CUDA graphs{' + compile' if args.compile else ''}, {attention} attention"
                + ("" if products == "default" else f", {products} products"))
        ids = prompt(ctx)
        target.allocate(ctx + args.new_tokens + args.verify_tokens)  # one capacity for the warm-up and the timed runs
        generate(target, None, ids, 8)  # captures the step
        run = generate(target, None, ids, args.new_tokens)
        ms = 1e3 / run.stats.tokens_per_s
        moved = weight_bytes + kv_bytes(target, ctx + args.new_tokens / 2)  # the mean context over the run
        row = {"loop": loop, "attention": attention, "products": products, "context": ctx, "capacity": target.capacity,
               "tokens_per_s": run.stats.tokens_per_s, "ms_per_token": ms, "bandwidth_frac": moved / (ms / 1e3) / (bw["TBps"] * 1e12),
               "outside_forward": run.stats.other_s / run.stats.decode_s, "prefill_s": run.stats.prefill_s}
        rows.append(row)
        print(f"{row['loop']} | {ctx} | {row['tokens_per_s']:.1f} | {ms:.2f} | {100 * row['bandwidth_frac']:.1f} | "
              f"{100 * row['outside_forward']:.1f} | {row['prefill_s']:.2f}", flush=True)
        if row["outside_forward"] > 0.005:  # a step runs ahead of the host: the GPU should never wait between tokens
            print(f"    note: the loop spent {100 * row['outside_forward']:.1f}% of its time between forwards (the GPU waiting on "
                  f"the host): every ratio over this row is overstated by that share", flush=True)
        pos = torch.tensor([ctx], device="cuda")
        ids_1 = torch.zeros(1, 1, dtype=torch.long, device="cuda")
        ids_n = torch.zeros(1, args.verify_tokens, dtype=torch.long, device="cuda")
        one = back_to_back_ms(lambda: target.greedy_step(ids_1, pos))
        many = back_to_back_ms(lambda: target.greedy_step(ids_n, pos))
        steps.append({"attention": attention, "context": ctx, "capacity": target.capacity, "forward_1_ms": one,
                      f"forward_{args.verify_tokens}_ms": many, "verify_over_decode": many / one,
                      "bandwidth_frac_1": (weight_bytes + kv_bytes(target, ctx + 1)) / (one / 1e3) / (bw["TBps"] * 1e12)})
        print(f"    forward at {ctx}: 1 token {one:.2f} ms ({100 * steps[-1]['bandwidth_frac_1']:.1f}% of bandwidth), "
              f"{args.verify_tokens} tokens {many:.2f} ms ({many / one:.2f}x)", flush=True)

    base = [r for r in rows if r["context"] == args.contexts[0] and r.get("attention") == args.attention[-1]][-1]  # the last products'
    # the strictest baseline beside the loop's: the captured one-token greedy step replayed back to back (queued: no
    # launch or host turn between tokens; ``back_to_back_ms``), timed above in the same process. The loop's own row carries
    # whatever it does between forwards (its "outside forward" share; BENCHMARKS.md "The autoregressive baseline's
    # run-ahead waited for the step it had queued": a baseline slower by that share overstates every ratio by it)
    forward_ms = [st for st in steps if st["context"] == args.contexts[0] and st["attention"] == args.attention[-1]][-1]["forward_1_ms"]
    spec = result["speculative"] = []
    print(f"drafter | tau | drafts/step | tok/s | speedup over AR at {args.contexts[0]} | over its forward alone "
          f"({forward_ms:.2f} ms) | draft % | verify % | other %", flush=True)
    dflash_rows = lambda name: name in ("dflash", "dflash-vocab")  # noqa: E731
    runs = [(name, k, products, weights, attention) for name in args.drafters for k in (args.dflash_draft_steps if dflash_rows(name) else [0])
            for products in (args.dflash_products if dflash_rows(name) else ["default"])
            for weights in (args.drafter_weights if dflash_rows(name) or name == "eagle3" else ["model"])
            for attention in (args.dflash_attention if dflash_rows(name) else ["default"])]
    block_attention = lambda a: None if a == "default" else a  # noqa: E731
    for name, k, products, weights, attention in runs:
        for tau, forced, trace, skipped in forcings(name, k, args.taus, traces, args.new_tokens):
            if skipped:
                print(skipped, flush=True)
                continue
            if name == "dflash":  # the loop's default: fixed-shape caches, captured block pass and append
                drafter = StaticDFlashDrafter(dflash_model, target.embed_tokens, target.lm_head, draft_tokens=k or None,
                                              triton_products=PRODUCTS[products], weights=weights,
                                              block_attention=block_attention(attention))
            elif name == "dflash-vocab":  # the same layers, the head the target's rows of --draft-vocab ids
                drafter = StaticDFlashDrafter(with_draft_vocab(dflash_model, target.lm_head, args.draft_vocab), target.embed_tokens, target.lm_head,
                                              draft_tokens=k or None, triton_products=PRODUCTS[products], weights=weights,
                                              block_attention=block_attention(attention))
            elif name == "dflash-eager":  # before this issue
                drafter = DFlashDrafter(dflash_model, target.embed_tokens, target.lm_head)
            elif name == "eagle3":  # the loop's default for chains: fixed-shape caches, step 0 and the chain in one captured graph
                # a chain one longer than what it accepts (a trace: the run's chain)
                drafter = StaticEagle3Drafter(eagle3_model, steps=tau if trace is None else tau - 1, weights=weights)
            else:  # before issue 24: Python-managed caches, eager
                drafter = Eagle3Drafter(eagle3_model, steps=tau)
            target.set_feature_layers(drafter.target_layer_ids)
            ids = prompt(args.contexts[0])
            target.allocate(args.contexts[0] + args.new_tokens + args.verify_tokens)
            # warm-up at the timed run's capacity: a smaller one made the static drafters reallocate, recapture (and
            # recompile) inside the timed run
            generate(target, drafter, ids, args.new_tokens, accept_per_step=forced)
            run = generate(target, drafter, ids, args.new_tokens, accept_per_step=forced)
            s = run.stats
            row = {"drafter": name, "draft_steps": k or None, "products": products if dflash_rows(name) else None,
                   "trace": None if trace is None else {"path": trace.path, "tau": trace.tau, "steps": len(trace.counts),
                                                        "block_size": trace.block_size, "replayed": len(forced)},
                   "block_attention": drafter.block_attention if dflash_rows(name) else None,
                   "weights": weights if dflash_rows(name) or name == "eagle3" else None, "tau": s.tau, "block_size": drafter.block_size, "tokens_per_s": s.tokens_per_s,
                   "speedup": s.tokens_per_s / base["tokens_per_s"], "speedup_over_forward": s.tokens_per_s * forward_ms / 1e3,
                   "draft_frac": s.draft_s / s.decode_s,
                   "verify_frac": s.verify_s / s.decode_s, "other_frac": s.other_s / s.decode_s, "ms_per_step": 1e3 * s.decode_s / s.steps}
            spec.append(row)
            label = (f"{name} (block {drafter.block_size}{'' if products == 'default' else ', ' + products}"
                     f"{'' if weights == 'model' else ', ' + weights}"
                     f"{', ' + drafter.block_attention + ' attention' if dflash_rows(name) else ''}"
                     f"{'' if trace is None else f', trace {Path(trace.path).name}: tau {trace.tau:.2f} over {len(trace.counts)} steps, {len(forced)} spread across it replayed'})")
            print(f"{label} | {s.tau:.2f} | {drafter.block_size - 1} | {s.tokens_per_s:.1f} | {row['speedup']:.2f}x "
                  f"({row['speedup'] / s.tau:.3f} of tau) | {row['speedup_over_forward']:.2f}x "
                  f"({row['speedup_over_forward'] / s.tau:.3f} of tau) | {100 * row['draft_frac']:.1f} | {100 * row['verify_frac']:.1f} | "
                  f"{100 * row['other_frac']:.1f}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
