"""Where the autoregressive loop's time goes at a real shape: kernels per token, their time, and the GPU's idle time.

Builds the random-init target as ``decode_speed.py`` does, decodes ``--tokens`` tokens with and without running a
step ahead of the host (``generate(run_ahead=...)``), timed by wall clock over the whole call, then profiles one
run-ahead generation under ``torch.profiler``: the top kernels by GPU time, the kernel count per token, and the gap
between the first kernel's start and the last one's end that no kernel covers (GPU idle).

    python benchmarks/profile_decode_loop.py --context 1024 --tokens 128
    python benchmarks/profile_decode_loop.py --drafter dflash --tau 3     # a speculative loop forced to accept τ-1
    python benchmarks/profile_decode_loop.py --dflash-block               # the DFlash block pass alone, against its floors
    python benchmarks/profile_decode_loop.py --verify-split 16            # a 16-token forward against a 1-token one, kernel by kernel

``--dflash-block [--draft-vocab N ...]`` times the captured block pass (with its fp32 logits, and the greedy drafts alone, the
pass a greedy chain runs and the one profiled) and the captured append alone (CUDA events, median of 50) beside two
floors: reading the drafter's weights and the LM head once at the bandwidth measured here, and the same matrix products
at the same row count (16) captured alone; then the kernels of 20 replays by GPU time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.decode_speed import build  # noqa: E402
from infer.generate import generate  # noqa: E402
from models.static_target import StaticTarget  # noqa: E402
from benchmarks.measure import require_cuda  # noqa: E402
require_cuda(__doc__, __name__, flags=True)  # one line on a machine without a CUDA GPU


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="qwen3-8b")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--drafter", choices=["none", "dflash", "eagle3"], default="none")
    p.add_argument("--tau", type=int, default=3, help="with a drafter: every step accepts τ-1 drafts")
    p.add_argument("--dflash-block", action="store_true", help="profile the DFlash block pass alone (see the docstring)")
    p.add_argument("--draft-vocab", type=int, nargs="*", default=[], help="--dflash-block: also with draft vocabularies of these sizes")
    p.add_argument("--draft-tokens", type=int, nargs="+", default=[0],
                   help="--dflash-block: once per K, a chain verifying the block's first K drafts (0: the whole block)")
    p.add_argument("--products", nargs="+", default=["default"], choices=["default", "cublas", "triton"],
                   help="--dflash-block: once per choice of the pass's few-row products (StaticDFlashDrafter's triton_products)")
    p.add_argument("--dflash-weights", nargs="+", default=["model"], choices=["model", "int8"],
                   help="--dflash-block: once per choice of the drafter's matrices (StaticDFlashDrafter's weights)")
    p.add_argument("--dflash-attention", nargs="+", default=["default"], choices=["default", "products", "split_kv"],
                   help="--dflash-block: once per block attention (StaticDFlashDrafter's block_attention)")
    p.add_argument("--step-timeline", metavar="FILE",
                   help="with a drafter: write every GPU event of the last profiled step (start, duration, gap) to FILE")
    p.add_argument("--verify-split", type=int, default=0, metavar="N",
                   help="the captured forward of 1 token against N tokens, kernel by kernel (where a verify's extra time goes)")
    args = p.parse_args()
    model, dflash_model, eagle3_model = build(args.shape)
    if args.verify_split:
        return verify_split(model, args.context, args.verify_split)
    if args.dflash_block:
        from benchmarks.decode_speed import PRODUCTS, with_draft_vocab

        for k in args.draft_tokens:
            for products in args.products:
                for weights in args.dflash_weights:
                    for attention in args.dflash_attention:
                        attn = None if attention == "default" else attention
                        print(f"\n--- draft tokens {k or 'the whole block'}, products {products}, weights {weights}, attention {attention}")
                        dflash_block(model, dflash_model, args.context, k or None, PRODUCTS[products], weights, attn)
                        for size in args.draft_vocab:
                            print(f"\n--- the same drafter with a draft vocabulary of {size} ids")
                            dflash_block(model, with_draft_vocab(dflash_model, model.get_output_embeddings(), size), args.context,
                                         k or None, PRODUCTS[products], weights, attn)
        return
    target = StaticTarget(model, [], compile_layers=True)
    ids = torch.randint(100, 100_000, (args.context,)).tolist()
    target.allocate(args.context + args.tokens + 16)
    if args.drafter != "none":
        from models.dflash import StaticDFlashDrafter
        from models.eagle3 import StaticEagle3Drafter

        drafter = (StaticDFlashDrafter(dflash_model, target.embed_tokens, target.lm_head) if args.drafter == "dflash"
                   else StaticEagle3Drafter(eagle3_model, steps=args.tau))
        target.set_feature_layers(drafter.target_layer_ids)
        run = lambda: generate(target, drafter, ids, args.tokens, accept_per_step=args.tau - 1)  # noqa: E731
        run()
        run = run()
        s = run.stats
        print(f"{args.drafter} τ {s.tau:.2f}: {s.tokens_per_s:.1f} tok/s, {1e3 * s.decode_s / s.steps:.2f} ms/step: draft "
              f"{1e3 * s.draft_s / s.steps:.2f}, verify {1e3 * s.verify_s / s.steps:.2f}, other {1e3 * s.other_s / s.steps:.2f}")
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            generate(target, drafter, ids, args.tokens, accept_per_step=args.tau - 1)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=70))
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=70))
        report_idle(prof, s.steps, "step")
        if args.step_timeline:
            step_timeline(prof, Path(args.step_timeline))
        return
    generate(target, None, ids, args.tokens)  # compile and capture
    for ahead in (False, True, False, True):
        torch.cuda.synchronize()
        t = time.perf_counter()
        run = generate(target, None, ids, args.tokens, run_ahead=ahead)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t - run.stats.prefill_s
        print(f"run_ahead={ahead}: {run.stats.decoded_tokens / wall:.1f} tok/s by wall clock (prefill and its token excluded), "
              f"{run.stats.tokens_per_s:.1f} by the loop's events, outside forward {100 * run.stats.other_s / run.stats.decode_s:.1f}%")
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        generate(target, None, ids, args.tokens, run_ahead=True)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70))
    report_idle(prof, args.tokens, "token")


def dflash_block(model, dflash_model, context: int, draft_tokens: int | None = None, triton_products: bool | None = None,
                 weights: str = "model", block_attention: str | None = None) -> None:
    from benchmarks.decode_speed import cuda_ms, measured_bandwidth
    from swa_kernels.int8_weights import Int8Weight
    from models.dflash import StaticDFlashDrafter
    from models.static_target import CapturedSteps

    bandwidth = measured_bandwidth()["TBps"]
    target = StaticTarget(model, [], compile_layers=True)
    drafter = StaticDFlashDrafter(dflash_model, target.embed_tokens, target.lm_head, draft_tokens=draft_tokens,
                                  triton_products=triton_products, weights=weights, block_attention=block_attention)
    print(f"  block attention: {drafter.block_attention}")
    b, width = drafter.block_size, dflash_model.fc.weight.shape[1]  # b: the positions an append takes (a verify's)
    drafter.allocate(context + 256, batch=1)
    features = torch.randn(1, context, width, device="cuda", dtype=torch.bfloat16)
    drafter.append(features, torch.zeros(1, dtype=torch.long, device="cuda"))  # the prompt's context, eager
    token, anchor = torch.tensor([7], device="cuda"), torch.tensor([context], device="cuda")
    block_features = torch.randn(1, b, width, device="cuda", dtype=torch.bfloat16)
    block_ms = cuda_ms(lambda: drafter.block_logits(token, anchor), repeats=50)
    greedy_ms = cuda_ms(lambda: drafter.block_greedy(token, anchor), repeats=50)  # the greedy chain's pass (no logits kept)
    append_ms = cuda_ms(lambda: drafter.append(block_features, anchor), repeats=50)
    # the pass's matrices as it multiplies them (int8 copies with weights="int8"); the head: the target's LM head, or a
    # draft vocabulary's rows of it
    mats = [m for layer in drafter.fused.layers for m in (layer.wqkv, layer.w13, layer.wo, layer.w2)] + [drafter.fused.head]
    weight_bytes = sum(m.q.numel() + 4 * m.scale.numel() if isinstance(m, Int8Weight) else m.numel() * m.element_size() for m in mats)
    x = {m.shape[1]: torch.randn(b, m.shape[1], device="cuda", dtype=torch.bfloat16) for m in mats}
    graphs = CapturedSteps()
    products = lambda: [drafter.linear(x[m.shape[1]], m, None) for m in mats]  # noqa: E731  (the pass's own kernels)
    gemm_ms = cuda_ms(lambda: graphs("gemms", products), repeats=50)
    print(f"DFlash block pass at context {context} (5 layers + the LM head, {b} rows), captured: {block_ms:.3f} ms with fp32 "
          f"logits, {greedy_ms:.3f} ms the greedy drafts alone; append of {b} positions {append_ms:.3f} ms")
    print(f"  floors: weights read once at {bandwidth:.2f} TB/s {weight_bytes / bandwidth / 1e9:.3f} ms ({weight_bytes / 1e9:.2f} GB); "
          f"the {len(mats)} products alone (the pass's kernels), captured {gemm_ms:.3f} ms ({weight_bytes / gemm_ms / 1e9:.2f} TB/s)")
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            drafter.block_greedy(token, anchor)  # the pass a greedy chain runs
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=90))
    report_idle(prof, 20, "block pass")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            drafter.append(block_features, anchor)
        torch.cuda.synchronize()
    print(f"the append of {b} positions:")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=20, max_name_column_width=90))
    report_idle(prof, 20, "append")


def verify_split(model, context: int, tokens: int) -> None:
    """Kernel time per name of one captured forward of 1 token and of ``tokens`` tokens at ``context`` (20 replays each)."""
    from benchmarks.decode_speed import cuda_ms
    from torch.profiler import ProfilerActivity, profile

    target = StaticTarget(model, [], compile_layers=True)
    target.allocate(context + 256)
    pos = torch.tensor([context], device="cuda")
    per_kernel = {}
    for n in (1, tokens):
        ids = torch.zeros(1, n, dtype=torch.long, device="cuda")
        ms = cuda_ms(lambda: target.step(ids, pos))
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                target.step(ids, pos)
            torch.cuda.synchronize()
        totals = {}
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() > 0:
                totals[e.name] = totals.get(e.name, 0.0) + e.time_range.elapsed_us() / 20
        per_kernel[n] = totals
        print(f"forward of {n} token(s) at {context}: {ms:.3f} ms (CUDA events), kernel time {sum(totals.values()) / 1e3:.3f} ms")
        report_idle(prof, 20, "forward")
        timeline(prof, 40)
    names = sorted(set(per_kernel[1]) | set(per_kernel[tokens]), key=lambda k: -(per_kernel[tokens].get(k, 0) - per_kernel[1].get(k, 0)))
    print(f"us per forward | 1 token | {tokens} tokens | difference | kernel")
    for name in names[:25]:
        a, b = per_kernel[1].get(name, 0.0), per_kernel[tokens].get(name, 0.0)
        print(f"{a:9.1f} | {b:9.1f} | {b - a:+9.1f} | {name[:100]}")


def timeline(prof, count: int) -> None:
    """The first ``count`` kernels of the last profiled replay: start (µs from the first), duration, the gap before it."""
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() > 0),
                     key=lambda e: e.time_range.start)
    last = kernels[-len(kernels) // 20:]
    t0, end = last[0].time_range.start, last[0].time_range.start
    print("start us | duration us | gap before us | kernel (the last replay's first kernels)")
    for e in last[:count]:
        print(f"{e.time_range.start - t0:9.1f} | {e.time_range.elapsed_us():8.1f} | {e.time_range.start - end:7.1f} | {e.name[:90]}")
        end = max(end, e.time_range.end)


def step_timeline(prof, path: Path) -> None:
    """Every GPU event of the profiled run's last full step, in order, to ``path``; a summary to stdout.

    A step is the span between two copies to the host (``Memcpy DtoH``: the loop reads each step's accepted count and
    tokens once), so the verify graph, the drafter's graphs and the eager work around them (acceptance, input copies) all
    fall inside one. The gaps are time with no kernel running (launch latency between graphs and eager kernels)."""
    events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() > 0),
                    key=lambda e: e.time_range.start)
    reads = [i for i, e in enumerate(events) if "DtoH" in e.name]
    if len(reads) < 3:
        print(f"step timeline: {len(reads)} copies to the host found; need 3")
        return
    step = events[reads[-3] + 1: reads[-2] + 1]
    t0, end = step[0].time_range.start, step[0].time_range.start
    busy, idle, lines, by_kind = 0.0, 0.0, [], {}
    for e in step:
        gap = max(0.0, e.time_range.start - end)
        idle += gap
        busy += e.time_range.elapsed_us()
        end = max(end, e.time_range.end)
        name = e.name
        kind = next((k for k in ("_skinny_mm", "nvjet", "splitKreduce", "_split_kernel", "_merge_kernel", "_block_",
                                 "triton_", "Memcpy", "Memset", "at::native") if k in name), "other")
        t, n, g = by_kind.get(kind, (0.0, 0, 0.0))
        by_kind[kind] = (t + e.time_range.elapsed_us(), n + 1, g + gap)
        lines.append(f"{e.time_range.start - t0:9.1f} | {e.time_range.elapsed_us():8.1f} | {gap:6.1f} | {name[:110]}")
    span = end - t0
    head = [f"one step: {len(step)} GPU events, span {span:.1f} us, kernel time {busy:.1f} us, idle {idle:.1f} us",
            "start us | duration us | gap before us | event"]
    path.write_text("\n".join(head + lines) + "\n")
    print(head[0])
    print("by kind: kernel time us, count, idle before them us")
    for kind, (t, n, g) in sorted(by_kind.items(), key=lambda kv: -kv[1][0]):
        print(f"  {kind:14s} {t:9.1f} {n:5d} {g:8.1f}")


def report_idle(prof, units: int, unit: str) -> None:
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() > 0),
                     key=lambda e: e.time_range.start)
    busy, end, idle, gaps, previous = 0.0, None, 0.0, [], None
    for e in kernels:
        start, stop = e.time_range.start, e.time_range.end
        if end is not None and start > end:
            idle += start - end
            gaps.append((start - end, previous.name[:60], e.name[:60]))
        end = stop if end is None else max(end, stop)
        busy += e.time_range.elapsed_us()
        previous = e
    gaps.sort(reverse=True)
    by_pair: dict = {}
    for gap, before, after in gaps:
        total, count = by_pair.get((before, after), (0.0, 0))
        by_pair[(before, after)] = (total + gap, count + 1)
    print("largest GPU idle gaps, summed by the kernels around them (us total, count, before -> after):")
    for (before, after), (total, count) in sorted(by_pair.items(), key=lambda kv: -kv[1][0])[:12]:
        print(f"  {total:9.0f} {count:5d}  {before} -> {after}")
    span = kernels[-1].time_range.end - kernels[0].time_range.start
    print(f"GPU events {len(kernels)} ({len(kernels) / units:.0f} per {unit}); span {span / 1e3:.1f} ms, "
          f"idle {idle / 1e3:.2f} ms ({100 * idle / span:.1f}%), kernel time {busy / 1e3:.1f} ms")


if __name__ == "__main__":
    main()
