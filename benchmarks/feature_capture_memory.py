"""Peak memory of capturing drafter features from the target: hooks + early exit vs all hidden states.

    python benchmarks/feature_capture_memory.py --target ../shared/targets/qwen3-27m-sharegpt \
        --device cpu --batch 1 --seq 8192 --layers 1,3,4

Modes (same inputs, same selected layers):
  hooks          TargetModel.capture: forward hooks on the selected layers, stop after the deepest
                 (no later layers, no final norm, no LM head / logits)
  hooks+logits   TargetModel.capture(with_logits=True): hooks, full forward (EAGLE-3 needs logits)
  hidden_states  model(output_hidden_states=True) then pick the layers: keeps all L+1 states + logits

CPU: each mode runs in a fresh process; peak = ru_maxrss after the forward minus resident memory
before it. CUDA: torch.cuda.max_memory_allocated during the forward minus memory before it.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODES = ("hooks", "hooks+logits", "hidden_states")


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def measure(args: argparse.Namespace) -> dict:
    import torch

    from models.target import TargetModel

    device = torch.device(args.device)
    target = TargetModel.from_pretrained(args.target, device)
    layer_ids = [int(x) for x in args.layers.split(",")]
    torch.manual_seed(0)
    input_ids = torch.randint(16, target.vocab_size, (args.batch, args.seq), device=device)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = rss_bytes()
    start = time.perf_counter()
    with torch.no_grad():
        if args.mode == "hidden_states":
            out = target.model(input_ids=input_ids, output_hidden_states=True, use_cache=False)
            features = torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)
        else:
            features = target.capture(input_ids, layer_ids, with_logits=args.mode == "hooks+logits").features
    if device.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    seconds = time.perf_counter() - start
    return {"mode": args.mode, "peak_mib": peak / 2**20, "features_mib": features.numel() * features.element_size() / 2**20, "seconds": seconds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--layers", default="1,3,4", help="layer ids (default: EAGLE-3's for an 8-layer target)")
    p.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.mode:  # child process: one measurement, JSON on stdout
        print(json.dumps(measure(args)))
        return
    rows = []
    for mode in MODES:
        cmd = [sys.executable, __file__, "--mode", mode] + [f"--{k}={v}" for k, v in vars(args).items() if k != "mode"]
        rows.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1]))
    print(f"\ntarget {args.target}  device {args.device}  batch {args.batch} x {args.seq} tokens  layers {args.layers}\n")
    print("| mode | peak memory above inputs (MiB) | features (MiB) | seconds |\n|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['mode']} | {r['peak_mib']:.0f} | {r['features_mib']:.0f} | {r['seconds']:.2f} |")


if __name__ == "__main__":
    main()
