"""Where a wave of prefills spends its time: ``StaticTarget.prefill_rows`` at the shapes regeneration hands it, timed
(device-synchronised wall, median of repeats) and then under ``torch.profiler`` (the top ops by device and by host time).

    python benchmarks/profile_prefill_rows.py --shape smollm2-135m --device cuda

The seventeenth session's ``profile_regen.py`` on an H100 found regeneration's prefill waves at ~80-95 ms a call, 31-65%
of the wall time, where the arithmetic of ~4,000 tokens of a 135M model is ~1 ms: this says which op it is. A random
model of the target's shape (``benchmarks.shapes.random_target``, bf16 on a GPU) stands for the target: the time does not
depend on the weights' values.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.measure import Timed, sync  # noqa: E402
from benchmarks.shapes import TARGET_SHAPES, random_target  # noqa: E402
from models.static_target import StaticTarget  # noqa: E402
from swa_kernels import attention  # noqa: E402

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH,
            "cudnn": SDPBackend.CUDNN_ATTENTION}


@contextlib.contextmanager
def backend_choice(name: str):
    """Prompt attention's backends for a row of the tables: ours (``prompt_sdpa``: cuDNN left out), torch (its own
    choice, cuDNN first on Hopper: the code before), or one backend alone (``BACKENDS``)."""
    attention.PROMPT_SDPA_SKIPS_CUDNN = name == "ours"
    try:
        with sdpa_kernel([BACKENDS[name]]) if name in BACKENDS else contextlib.nullcontext():
            yield
    finally:
        attention.PROMPT_SDPA_SKIPS_CUDNN = True


def regenerate_synthetic(target: StaticTarget, args, vocab: int) -> None:
    """Regeneration's pattern on random token ids (the model is random: its replies run to the budget): ``--streams``
    conversations of up to 6 turns, a system and user prompt of 100-600 tokens then user turns of 50-400, each turn's
    prompt the conversation so far, cut where it would pass 2,048 tokens; 128 rows, waves of refills, each stream's turns
    in its row (``generate_streams``, as ``data.regenerate.reuse_turns``). The same conversations once per backend set,
    the whole wall time and the waves' (``prefill_rows`` wrapped in a device-synchronising timer)."""
    from infer.batch import generate_streams

    g = torch.Generator().manual_seed(0)
    turns = [[torch.randint(0, vocab, (int(torch.randint(100 if t == 0 else 50, 600 if t == 0 else 400, (1,), generator=g)),),
                            generator=g).tolist() for t in range(6)] for _ in range(args.streams)]
    limit, capacity = 2048, 2048 + args.max_new_tokens + 1 + 8
    plain = target.prefill_rows
    print(f"\n| backends | conversations | replies | wall s | prefill waves s (calls) | tokens/s |\n|---|---:|---:|---:|---:|---:|")
    for name in args.backends:
        state = {s: [list(turns[s][0]), 1] for s in range(args.streams)}  # stream -> [prompt so far, next turn]
        replies, waves = [0], Timed(plain)

        def driver(stream, finished):
            prompt, turn = state[stream]
            if finished is None:
                return prompt
            replies[0] += 1
            if turn >= 6:
                return None
            nxt = prompt + finished.tokens + turns[stream][turn]
            if len(nxt) + args.max_new_tokens > limit:
                return None
            state[stream] = [nxt, turn + 1]
            return nxt

        target.prefill_rows = waves
        sync()
        t0 = time.perf_counter()
        with backend_choice(name):
            generate_streams(target, None, driver, args.streams, batch_size=128, capacity=capacity,
                             max_new_tokens=args.max_new_tokens, eos_token_ids=(), run_steps=8)
        sync()
        wall = time.perf_counter() - t0
        del target.prefill_rows
        print(f"| {name} | {args.streams} | {replies[0]} | {wall:.1f} | {waves.seconds:.1f} ({waves.calls}) | "
              f"{replies[0] * args.max_new_tokens / wall:.0f} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(TARGET_SHAPES), default="smollm2-135m")
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch", type=int, default=128, help="rows the caches hold")
    p.add_argument("--capacity", type=int, default=2313)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--cases", nargs="*", default=["6x650@0", "16x200@1000", "3x1300@0", "1x2000@0", "16x60@1500"],
                   help="MxN@S: M prompts of N tokens into rows 0..M-1 at start S (S > 0: past a cached prefix)")
    p.add_argument("--trace", nargs="*", default=None, help="cases to profile (default: every case)")
    p.add_argument("--streams", type=int, default=0,
                   help="then regenerate this many synthetic 6-turn conversations (infer.batch.generate_streams, turns "
                        "reused in their rows, 128 rows) once per --backends entry: the waves' share of a whole run")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--backends", nargs="*", default=["ours", "torch", "efficient"], choices=["ours", "torch", *BACKENDS],
                   help="prompt attention's backends, a row each: ours (no cuDNN), torch (its own choice), or one alone")
    args = p.parse_args()
    for case in args.cases + (args.trace or []):  # MxN@S, each fitting a row of the caches
        match = re.fullmatch(r"(\d+)x(\d+)@(\d+)", case)
        if not match or int(match[1]) < 1 or int(match[2]) < 1:
            p.error(f"--cases/--trace {case!r}: expected MxN@S (M prompts of N >= 1 tokens from position S), e.g. 6x650@0")
        if int(match[1]) > args.batch or int(match[3]) + int(match[2]) + 200 > args.capacity:
            p.error(f"--cases/--trace {case!r}: needs at most --batch {args.batch} rows and S + N + 200 (new lengths) <= "
                    f"--capacity {args.capacity}")

    device = torch.device(args.device)
    model = random_target(args.shape, device=args.device).model  # bf16 on a GPU, fp32 on the CPU
    target = StaticTarget(model, [], compile_layers=device.type == "cuda")
    target.allocate(args.capacity, batch=args.batch)
    vocab = model.config.vocab_size
    backends_seen = 0  # each backend's new lengths differ from the earlier backends' (not seen before)

    def run(case: str, extra: int = 0) -> None:
        shape, start = case.split("@")
        m, n = (int(v) for v in shape.split("x"))
        n += extra
        prompts = [torch.randint(0, vocab, (n,), device=device) for _ in range(m)]
        target.prefill_rows(prompts, list(range(m)), [int(start)] * m)

    # same: the case's shape every repeat; new: a new length every repeat (n + 7 i), as regeneration's waves come (a
    # cost paid once per shape shows only here)
    print(f"| backend | case | tokens | ms, same shape (median of {args.repeats}) | ms, a new length each (median) |\n|---|---|---:|---:|---:|")
    for name in args.backends:
        for case in args.cases:
            row = []
            for vary in (False, True):
                with backend_choice(name):
                    try:
                        run(case, 3 if vary else 0)  # warm-up
                    except RuntimeError as e:  # flash alone takes no mask (a case past a cached prefix)
                        row.append(f"n/a ({str(e).splitlines()[0][:40]})")
                        continue
                    times = []
                    for i in range(args.repeats):
                        sync()
                        t0 = time.perf_counter()
                        run(case, 7 * (i + 1) + 100 * backends_seen if vary else 0)
                        sync()
                        times.append(time.perf_counter() - t0)
                row.append(f"{statistics.median(times) * 1000:.2f}")
            m, n = (int(v) for v in case.split("@")[0].split("x"))
            print(f"| {name} | {case} | {m * n} | {row[0]} | {row[1]} |", flush=True)
        backends_seen += 1

    if args.streams:
        regenerate_synthetic(target, args, vocab)
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
    for case in args.trace if args.trace is not None else args.cases:
        with torch.profiler.profile(activities=activities) as prof:
            run(case)
            sync()
        for key in (["cuda_time_total"] if device.type == "cuda" else []) + ["cpu_time_total"]:
            print(f"\n### {case}, by {key}\n")
            print(prof.key_averages().table(sort_by=key, row_limit=14, max_name_column_width=60))


if __name__ == "__main__":
    main()
