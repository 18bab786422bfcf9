"""How many distinct flex-attention kernels EAGLE-3's TTT unroll compiles, with each step's own key length and with
``step_masks(uniform_keys=True)``: a CPU proxy for the GPU's cold compile.

    python benchmarks/flex_ttt_kernels_cpu.py [--steps 6] [--seq 128]

Inductor's flex templates bake the key length into each kernel (the CPU's ``kvSize``, the GPU Triton template's
``KV_LEN``), and with each step's own keys the ``mask_mod``'s step is a constant too, so a TTT unroll of S steps compiles
S flex kernels (forward; the GPU's backward likewise). With uniform key lengths the step is a tensor the kernel reads. This
compiles the unroll's forward (flex has no CPU backward) of a small one-layer drafter in a fresh process per case with an
empty Inductor cache, and counts the generated C++ flex kernels: as written, and with Inductor's buffer numbering
(``out_ptr25``, ``out_ptr145``) made uniform, which is all that separates identical kernels here. Whether the GPU's Triton
kernels come out identical, and so compile once, is measured by ``benchmarks/eagle3_step_compile.py --uniform-keys``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.script import run_main  # noqa: E402


def one_case(uniform: bool, steps: int, seq: int, cache: str) -> dict:
    import torch
    from transformers import LlamaConfig

    from models.eagle3 import Eagle3DraftModel, make_eagle3_config
    from train.eagle3 import step_masks, unroll

    target = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=6, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, max_position_embeddings=4 * seq * steps)
    config = make_eagle3_config(target, num_hidden_layers=1, target_layer_ids=[1, 2, 3], layer_types=["sliding_attention"],
                                sliding_window=seq, draft_vocab_size=32, ttt_length=steps)
    torch.manual_seed(0)
    model = Eagle3DraftModel(config)
    features, ids = torch.randn(2, seq, 96), torch.randint(0, 64, (2, seq))
    valid = torch.ones(2, seq, dtype=torch.bool)
    masks = step_masks(valid, model.layer_types, model.sliding_window, steps, "flex", uniform_keys=uniform)
    fn = torch.compile(lambda f, i, v, m: unroll(model, f, i, v, steps, "flex", masks=m), dynamic=False)
    t0 = time.perf_counter()
    with torch.no_grad():
        fn(features, ids, valid, masks)
    seconds = time.perf_counter() - t0
    sources = [open(p).read() for p in glob.glob(f"{cache}/**/*.cpp", recursive=True)]
    flex = [s for s in sources if "kvBlockSize" in s]  # the CPU flex template's kernels
    renumbered = {re.sub(r"\b(out_ptr|in_ptr|buf|tmp)\d+\b", r"\1", s) for s in flex}
    return {"keys": "uniform" if uniform else "own", "steps": steps, "seq": seq, "kernels": len(sources), "flex": len(flex),
            "flex_distinct": len(renumbered), "seconds": round(seconds, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--one", choices=["own", "uniform"], help=argparse.SUPPRESS)  # a child: one case, JSON on stdout
    args = p.parse_args()
    if args.steps < 2 or args.seq < 16:
        raise ValueError(f"--steps {args.steps} --seq {args.seq}: expected at least 2 steps of 16 tokens")
    if args.one:
        print(json.dumps(one_case(args.one == "uniform", args.steps, args.seq, os.environ["TORCHINDUCTOR_CACHE_DIR"])))
        return
    rows = []
    for keys in ("own", "uniform"):
        with tempfile.TemporaryDirectory(prefix="flex_ttt_") as cache:
            done = subprocess.run([sys.executable, __file__, "--one", keys, "--steps", str(args.steps), "--seq", str(args.seq)],
                                  env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}, capture_output=True, text=True)
        if done.returncode != 0:
            raise ValueError(f"the {keys} case failed: {(done.stderr.strip().splitlines() or ['no output'])[-1]}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"\nEAGLE-3 TTT unroll, forward, flex on the CPU, {args.steps} steps of {args.seq} tokens, one sliding layer\n")
    print("| a step's keys | C++ kernels | flex kernels | distinct flex kernels, buffer numbers aside | compile + run s |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['keys']} | {r['kernels']} | {r['flex']} | {r['flex_distinct']} | {r['seconds']} |")


if __name__ == "__main__":
    run_main(main)
