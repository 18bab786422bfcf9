"""The trainer's tokens/s on a real (small) target: the training loop's own build and step, timed.

    python benchmarks/train_throughput.py experiment=dflash_swa target.path=TARGET data.path=DATA --steps 40 [--profile 3]

Builds the run exactly as ``python -m train`` does (``train.trainer.build``: target, data, drafter,
optimizer, the step of ``drafter.kind``), then runs ``--warmup`` untimed optimizer steps and ``--steps``
timed ones through ``train.trainer.train_step`` with the loop's own batch collation, synchronising
only at the end. Prints tokens/s (real tokens, padding excluded, as ``train/tokens_per_s``), the host's time
to queue a step (near the step's time: the host, not the GPU, is the bound, unless the step synchronises inside:
``--sync-debug`` runs one more step with CUDA's synchronisation debugging on, which warns at every synchronising call with
where it came from), the loss per step (to compare two
implementations at the same global batch) and, with ``--profile N``, the
top operators of N steps by host and by device time (where a host-bound step spends its time).
``--json OUT`` writes the numbers. Any Hydra override of the training config is passed through.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose, initialize_config_module

    from train.trainer import to_train_config

    with initialize_config_module(config_module="configs", version_base="1.3"):
        return to_train_config(hydra_compose(config_name="train", overrides=["logger=none", "trainer.loop_eval_prompts=0",
                                                                             "trainer.progress=false", *overrides]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the training config")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--profile", type=int, default=0, help="profile this many steps after the timed ones")
    parser.add_argument("--cprofile", type=int, default=0, help="cProfile this many steps: the host's Python time by function")
    parser.add_argument("--json", default=None)
    parser.add_argument("--sync-debug", action="store_true",
                        help="after the timed steps, one step under torch.cuda.set_sync_debug_mode('warn'): every call that "
                             "makes the host wait for the GPU warns, with its stack")
    parser.add_argument("--serial-timing", nargs=2, metavar=("DIR", "N"), default=None,
                        help="several runs on one GPU: compile in parallel, time one at a time. After its warm-up each run "
                             "writes DIR/ready.PID (a run that fails writes DIR/failed.PID), waits until N have (at most 10 minutes), "
                             "then holds DIR/lock while it times")
    args = parser.parse_intermixed_args()
    try:
        measure(args)
    except BaseException:
        if args.serial_timing:  # counts as ready: the other runs' barrier does not wait for a run that died
            folder = Path(args.serial_timing[0])
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"failed.{os.getpid()}").touch()
        raise


def measure(args: argparse.Namespace) -> None:
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `timeout -s USR1 ...` prints where a stalled step is
    from train.trainer import build, train_step

    cfg = compose([f"output_dir=/tmp/train_throughput/{time.time_ns()}", *args.overrides])
    run = build(cfg)
    step = run.step
    sync = torch.cuda.synchronize if run.device.type == "cuda" else (lambda: None)

    def one_step(n: int):
        """(the step's summed stats, its real tokens)"""
        micro = run.next_micro_batches()
        stats, _ = train_step(step, micro, n, run.optimizer, run.scheduler, run.engine, run.ranks)
        return stats, int(sum(b["attention_mask"].sum() for b in micro))

    losses = []
    for n in range(1, args.warmup + 1):
        stats, _ = one_step(n)
        losses.append(float(stats.loss_sum / stats.num_labels))
    sync()
    lock = wait_for_turn(*args.serial_timing) if args.serial_timing else None
    start, tokens, timed = time.perf_counter(), 0, []
    for n in range(args.warmup + 1, args.warmup + args.steps + 1):
        stats, t = one_step(n)
        tokens += t
        timed.append(stats)
    host_seconds = time.perf_counter() - start  # the host has queued every step: at ~seconds, the host is the bound
    sync()
    seconds = time.perf_counter() - start
    losses += [float(s.loss_sum / s.num_labels) for s in timed]
    tc = cfg.trainer
    result = {
        "device": torch.cuda.get_device_name() if run.device.type == "cuda" else "cpu",
        "drafter": cfg.drafter.kind, "attention": step.ctx.backend, "batch_size": tc.batch_size, "grad_accum": tc.grad_accum,
        "max_length": cfg.data.max_length, "steps": args.steps, "seconds": seconds, "tokens": tokens,
        "tokens_per_s": tokens / seconds, "ms_per_step": 1e3 * seconds / args.steps,
        "host_ms_per_step": 1e3 * host_seconds / args.steps, "losses": losses,
        "overrides": args.overrides,
    }
    print(f"{result['device']}: {cfg.drafter.kind} ({step.ctx.backend}), batch {tc.batch_size} x accum {tc.grad_accum} x "
          f"{cfg.data.max_length} tokens: {result['tokens_per_s']:,.0f} tokens/s, {result['ms_per_step']:.1f} ms/step "
          f"(the host queued a step in {result['host_ms_per_step']:.1f} ms)")
    print("loss by step:", " ".join(f"{x:.4f}" for x in losses))
    if args.sync_debug and run.device.type == "cuda":
        import traceback
        import warnings

        def show(message, category, filename, lineno, file=None, line=None):  # the stack of each synchronising call
            print(f"SYNC: {message}\n" + "".join(traceback.format_stack(limit=14)[:-1]), flush=True)

        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = show
            torch.cuda.set_sync_debug_mode("warn")
            try:
                one_step(20_000)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        sync()
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if run.device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            sync()
            profiled_start = time.perf_counter()
            for n in range(args.profile):
                one_step(10_000 + n)
            sync()
            profiled_s = time.perf_counter() - profiled_start
        table = prof.key_averages()
        print(table.table(sort_by="self_cpu_time_total", row_limit=25))
        if run.device.type == "cuda":
            print(table.table(sort_by="self_device_time_total", row_limit=60))
            # the GPU's share of the profiled steps' wall time (the profiler slows the host, so an upper bound on idle)
            from torch.autograd import DeviceType

            # the kernels' own events only, as the table's "Self CUDA time total" (an op's row repeats its kernels' time)
            kernels = sorted((e for e in table if e.device_type == DeviceType.CUDA and not e.is_user_annotation),
                             key=lambda e: -e.self_device_time_total)
            kernels_ms = sum(e.self_device_time_total for e in kernels) / 1e3 / args.profile
            print(f"GPU busy: {kernels_ms:.1f} ms of kernels per step over {1e3 * profiled_s / args.profile:.1f} ms of wall time "
                  f"under the profiler ({kernels_ms / (1e3 * profiled_s / args.profile):.0%})")
            # every kernel by its full name (the tables cut names at 55 characters, where Inductor's say what they fuse)
            print("kernels per step (ms, calls, name):")
            for e in kernels:
                if e.self_device_time_total / args.profile >= 5:  # >= 5 us a step
                    print(f"  {e.self_device_time_total / 1e3 / args.profile:8.3f} {e.count / args.profile:6.1f}  {e.key[:200]}")
    if args.cprofile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
        for n in range(args.cprofile):
            one_step(20_000 + n)
        sync()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    if lock is not None:
        lock.close()  # the next run's turn


def wait_for_turn(folder: str, runs: str):
    """Block until ``runs`` runs have warmed up (no compilation competing for the host), then until no other run
    times; returns the held lock file (closing it releases the lock)."""
    import fcntl

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"ready.{os.getpid()}").touch()
    deadline = time.monotonic() + 600
    while len(list(folder.glob("ready.*")) + list(folder.glob("failed.*"))) < int(runs) and time.monotonic() < deadline:
        time.sleep(0.5)
    lock = open(folder / "lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    return lock


if __name__ == "__main__":
    main()
