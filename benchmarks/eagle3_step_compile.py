"""EAGLE-3's compiled training step from cold caches: how long its first step takes, and its warm step, by soft-CE chunks.

    python benchmarks/eagle3_step_compile.py --shape smollm2-135m --rows 16x2048 --chunks 8 1 --ttt 10 --layers 1 2
    python benchmarks/eagle3_step_compile.py --device cpu --backend sdpa --rows 12x512 --draft-vocab 2048 --chunks 8 2 1   # the CPU proxy

The trainer compiles ``train.eagle3.unroll_and_loss`` whole (``trainer.compile_scope=step``): the TTT unroll and its soft
CE, whose row chunks are each a checkpointed region. A lease's first steps wait on that compile (SmolLM2's step, 16 x 2,048
packed rows, TTT 10: 6.8-8 minutes on a fresh H100 or H200, BENCHMARKS.md), so this script times it as a fresh machine
sees it: every case in its own process with empty Inductor and Triton cache folders. ``--chunks N``: the step's rows in N
chunks a TTT step (the trainer's rule, ``train.eagle3.soft_ce_chunk_rows``, is printed beside), each checkpointed when
there are several or the rows exceed ``SOFT_CE_KEPT_ROWS`` (4,096; the CPU proxy above has 6,144 for that reason). The
drafter has the recipe's settings (``experiment=eagle3_swa_small``: norm before fc, normed output, sliding window 2,048)
over a random-init config of ``--shape`` (benchmarks/shapes.py), draft vocabulary ``--draft-vocab``; features, tokens and
soft labels random (bf16 on a GPU, as the trainer's). The block masks' first build is timed apart (on a GPU flex's
tile tables are compiled graphs, one per TTT step); ``--backend sdpa`` on a GPU leaves flex out (its kernels are specialised
per TTT step: each step's key length and its ``mask_mod``'s step), so flex's share of the cold compile is the difference;
``--uniform-keys`` gives every step the last step's key length and its step as a tensor (``step_masks(uniform_keys=True)``),
which should leave one flex kernel pair for all steps.
The warm step and the peak memory after the first step are the median of ``--warm-steps`` steps and their high-water
mark. The cases run one after another; the GPU's compile threads are the machine's, so two copies of this script side by
side slow each other. Each case says on stderr, as it goes, when it starts compiling and how long its first step took: a
run cut short (a lease's call limit) still shows how far it got. It imports the trainer, so it needs the project's
dependencies (hydra among them), checked before any case starts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.script import run_main  # noqa: E402
from benchmarks.shapes import TARGET_SHAPES  # noqa: E402


def parse_rows(text: str) -> tuple[int, int]:
    try:
        bsz, seq = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"--rows {text!r}: expected ROWSxLENGTH, e.g. 16x2048") from None
    if bsz < 1 or seq < 2:
        raise ValueError(f"--rows {text!r}: expected at least 1 row of 2 tokens")
    return bsz, seq


def one_case(args) -> dict:
    """Build, compile and step once (the cold compile), then time warm steps; in a process of its own."""
    from transformers import AutoConfig

    from models.eagle3 import Eagle3DraftModel, make_eagle3_config
    from train.eagle3 import SOFT_CE_KEPT_ROWS, soft_ce_chunk_rows, step_masks, unroll_and_loss

    device = torch.device(args.device)
    bsz, seq = parse_rows(args.rows)
    model_type, kwargs = TARGET_SHAPES[args.shape]
    target_config = AutoConfig.for_model(model_type, **kwargs)
    n = target_config.num_hidden_layers
    config = make_eagle3_config(target_config, num_hidden_layers=args.layers[0], target_layer_ids=[1, n // 2 - 1, n - 4],
                                layer_types=["sliding_attention"] * args.layers[0], sliding_window=2048,
                                draft_vocab_size=args.draft_vocab, ttt_length=args.ttt, norm_before_fc=True, norm_output=True)
    torch.manual_seed(0)
    model = Eagle3DraftModel(config).to(device)
    vd, h = config.draft_vocab_size, target_config.hidden_size
    bf16 = device.type == "cuda"
    dtype = torch.bfloat16 if bf16 else torch.float32  # the trainer's features and soft labels: bf16 on a GPU
    features = torch.randn(bsz, seq, 3 * h, device=device, dtype=dtype)
    ids = torch.randint(0, target_config.vocab_size, (bsz, seq), device=device)
    valid = torch.ones(bsz, seq, dtype=torch.bool, device=device)
    labels = (torch.randint(0, target_config.vocab_size, (bsz, seq), device=device), torch.randn(bsz, seq, vd, device=device, dtype=dtype))
    chunk_rows = -(-(bsz * seq) // args.chunks[0])
    checkpointed = args.chunks[0] > 1 or bsz * seq > SOFT_CE_KEPT_ROWS
    # the block masks' first build: on a GPU flex's tile tables are compiled graphs (train.eagle3.tile_structure_fn), one
    # per TTT step, which a fresh lease compiles before its first step too
    t0 = time.perf_counter()
    masks = step_masks(valid, model.layer_types, model.sliding_window, args.ttt, args.backend, uniform_keys=args.uniform_keys)
    if device.type == "cuda":
        torch.cuda.synchronize()
    masks_s = time.perf_counter() - t0
    fn = torch.compile(unroll_and_loss, dynamic=False)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            stats = fn(model, features, ids, valid, valid, valid.long(), labels, args.ttt, args.backend, masks, False,
                       chunk_rows=chunk_rows)
        stats.loss_sum.backward()
        if device.type == "cuda":
            torch.cuda.synchronize()

    say = f"layers {args.layers[0]}, chunks {args.chunks[0]}:"
    print(f"{say} built; compiling the first step", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    step()
    cold = time.perf_counter() - t0
    print(f"{say} first step (the cold compile) {cold:.1f} s; {args.warm_steps} warm steps", file=sys.stderr, flush=True)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()  # the warm steps' high-water mark, not the compile's
    times = []
    for _ in range(args.warm_steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    times.sort()
    return {"layers": args.layers[0], "ttt": args.ttt, "rows": f"{bsz}x{seq}", "chunks": args.chunks[0], "chunk_rows": chunk_rows,
            "checkpointed": checkpointed, "keys": "uniform" if args.uniform_keys else "own",
            "trainer_chunks": -(-(bsz * seq) // soft_ce_chunk_rows(vd)), "masks_s": round(masks_s, 1), "cold_s": round(cold, 1),
            "warm_ms": round(1000 * times[len(times) // 2], 1),
            "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.type == "cuda" else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="smollm2-135m", choices=sorted(TARGET_SHAPES))
    p.add_argument("--rows", default="16x2048", help="ROWSxLENGTH of a step (the recipe packs 16 x 2,048)")
    p.add_argument("--chunks", type=int, nargs="+", default=[8, 1], help="soft-CE chunks a TTT step (4,096-row chunks: 8 at 16 x 2,048)")
    p.add_argument("--layers", type=int, nargs="+", default=[1])
    p.add_argument("--ttt", type=int, default=10)
    p.add_argument("--draft-vocab", type=int, default=16384)
    p.add_argument("--backend", default="flex", choices=["flex", "sdpa"])
    p.add_argument("--device", default="cuda")
    p.add_argument("--warm-steps", type=int, default=5)
    p.add_argument("--uniform-keys", action="store_true",
                   help="every TTT step's attention over the last step's key length (train.eagle3.step_masks(uniform_keys=True))")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: one case, JSON on the last line
    args = p.parse_args()
    parse_rows(args.rows)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no GPU here; --device cpu runs the CPU proxy (with --backend sdpa)")
    if min(args.chunks) < 1 or min(args.layers) < 1 or args.ttt < 1 or args.warm_steps < 1:
        raise ValueError("--chunks, --layers, --ttt and --warm-steps: expected positive integers")
    if args.draft_vocab < 2 or args.draft_vocab > TARGET_SHAPES[args.shape][1]["vocab_size"]:
        raise ValueError(f"--draft-vocab {args.draft_vocab}: expected 2 to {args.shape}'s vocabulary "
                         f"({TARGET_SHAPES[args.shape][1]['vocab_size']})")
    if args.device == "cpu" and args.backend == "flex":
        raise ValueError("--device cpu --backend flex: flex attention has no CPU backward; use --backend sdpa on the CPU")
    try:  # each case imports the trainer: without its dependencies every case would fail after its process started
        import train.eagle3  # noqa: F401
    except ImportError as e:
        raise ValueError(f"{e}: this script imports the trainer (train.eagle3); install the project's dependencies "
                         "(on a lease machine, the carried wheels on PYTHONPATH)") from None
    if args.one:
        print(json.dumps(one_case(args)))
        return
    rows, failed = [], 0
    for layers in args.layers:
        for chunks in args.chunks:
            with tempfile.TemporaryDirectory(prefix="eagle3_compile_") as cold:  # a fresh machine's empty caches
                env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{cold}/inductor", "TRITON_CACHE_DIR": f"{cold}/triton"}
                argv = [sys.executable, __file__, "--one", "--shape", args.shape, "--rows", args.rows, "--chunks", str(chunks),
                        "--layers", str(layers), "--ttt", str(args.ttt), "--draft-vocab", str(args.draft_vocab),
                        "--backend", args.backend, "--device", args.device, "--warm-steps", str(args.warm_steps)]
                argv += ["--uniform-keys"] if args.uniform_keys else []
                # the child's stderr streamed as it comes (a run cut short still shows how far each case got), its
                # stdout (one JSON line) to a file
                with open(f"{cold}/result.json", "w") as result:
                    child = subprocess.Popen(argv, env=env, stdout=result, stderr=subprocess.PIPE, text=True)
                    lines = []
                    for line in child.stderr:
                        lines.append(line.rstrip())
                        if line.startswith(f"layers {layers}, chunks {chunks}:"):
                            print(f"{time.strftime('%H:%M:%S')} {line.rstrip()}", file=sys.stderr, flush=True)
                    returncode = child.wait()
                out = Path(f"{cold}/result.json").read_text().strip().splitlines()
            if returncode != 0 or not out:
                lines = lines or ["no output"]
                reason = next((line for line in reversed(lines) if "Error" in line), lines[-1])
                print(f"layers {layers}, chunks {chunks}: failed (exit {returncode}): {reason}", file=sys.stderr, flush=True)
                failed += 1
                continue
            rows.append(json.loads(out[-1]))
            print(json.dumps(rows[-1]), flush=True)
    device = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU ({os.cpu_count()} cores)"
    print(f"\n{args.shape}, {args.backend}, {device}; each case from empty Inductor/Triton caches\n")
    print("| layers | TTT | rows | soft-CE chunks a TTT step (rows each) | checkpointed | the trainer's chunks | a step's keys "
          "| block masks s, cold | first step s, cold | warm step ms | warm peak GiB |")
    print("|---:|---:|---|---:|---|---:|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['layers']} | {r['ttt']} | {r['rows']} | {r['chunks']} ({r['chunk_rows']}) | {'yes' if r['checkpointed'] else 'no'} "
              f"| {r['trainer_chunks']} | {r['keys']} | {r['masks_s']} | {r['cold_s']} | {r['warm_ms']} "
              f"| {r['peak_gib'] if r['peak_gib'] is not None else '-'} |")
    if failed:
        raise SystemExit(f"error: {failed} of {failed + len(rows)} cases failed (above)")


if __name__ == "__main__":
    run_main(main)
