"""Numerics gate for refactors (torchtitan's): train both drafters with a fixed seed and record every
logged loss, the evaluation metrics and a hash of every exported tensor, so a run of the code before
and after a refactor can be compared bit for bit.

    python benchmarks/numerics_gate.py record OUT.json [--steps 30] [--device cpu] [--backend sdpa] [--only dflash]
    python benchmarks/numerics_gate.py compare BEFORE.json AFTER.json

``record`` runs ``python -m train`` in a subprocess from the current directory (so the code checked
out there is the code measured) on the tiny experiments (CPU) or on the reference target
(``--target PATH --data PATH``, GPU backends). ``compare`` prints a table and exits 1 on any
difference.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.script import run_main  # noqa: E402

EXPERIMENTS = {"dflash": "dflash_swa_tiny", "eagle3": "eagle3_swa_tiny"}
EXPERIMENTS_REAL = {"dflash": "dflash_swa", "eagle3": "eagle3_swa"}


def tensor_hashes(path: Path) -> dict[str, str]:
    from safetensors.torch import load_file

    return {name: hashlib.sha256(t.contiguous().view(-1).view(dtype=__import__("torch").uint8).numpy().tobytes()).hexdigest()[:16]
            for name, t in sorted(load_file(path).items())}


def record_one(kind: str, args, out_dir: Path) -> dict:
    experiment = (EXPERIMENTS_REAL if args.target else EXPERIMENTS)[kind]
    overrides = [f"experiment={experiment}", f"trainer.max_steps={args.steps}", "trainer.log_every=1", f"trainer.eval_every={args.steps // 2}",
                 "trainer.checkpoint_every=0", "trainer.progress=false", f"trainer.device={args.device}",
                 f"trainer.attention_backend={args.backend}", "trainer.loop_eval_prompts=2", "trainer.loop_eval_max_new_tokens=32",
                 "data.num_eval=8", "logger=none", f"output_dir={out_dir}"]
    if args.target:
        overrides += [f"target.path={args.target}", f"data.path={args.data}", "data.max_records=200", "data.max_length=1024",
                      "target.compile_layers=false"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *filter(None, [os.environ.get("PYTHONPATH")])])}
    subprocess.run([sys.executable, "-m", "train", *overrides], check=True, env=env)
    history = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    losses = {str(h["step"]): h["train/loss"] for h in history if "train/loss" in h}
    evals = {str(h["step"]): {k: v for k, v in h.items() if k.startswith("eval/")} for h in history if "eval/loss" in h}
    return {"overrides": overrides, "train_loss": losses, "eval": evals, "export": tensor_hashes(out_dir / "export" / "model.safetensors")}


def record(args) -> None:
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.only or list(EXPERIMENTS):
            result[kind] = record_one(kind, args, Path(tmp) / kind)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


def compare(args) -> None:
    before, after = json.loads(Path(args.before).read_text()), json.loads(Path(args.after).read_text())
    failed = False
    print("| drafter | train losses equal | eval metrics equal | exported tensors equal |")
    print("|---|---|---|---|")
    for kind in before:
        b, a = before[kind], after.get(kind)
        if a is None:
            print(f"| {kind} | missing after | | |")
            failed = True
            continue
        losses = b["train_loss"] == a["train_loss"]
        evals = b["eval"] == a["eval"]
        same = [n for n in b["export"] if a["export"].get(n) == b["export"][n]]
        tensors = len(same) == len(b["export"]) == len(a["export"])
        print(f"| {kind} | {losses} ({len(b['train_loss'])} steps) | {evals} ({sum(len(v) for v in b['eval'].values())} values) | "
              f"{tensors} ({len(same)}/{len(b['export'])}) |")
        failed |= not (losses and evals and tensors)
        if not evals:
            for step in b["eval"]:
                for key, value in b["eval"][step].items():
                    if a["eval"].get(step, {}).get(key) != value:
                        print(f"  step {step} {key}: {value} -> {a['eval'].get(step, {}).get(key)}")
    sys.exit(1 if failed else 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("out")
    rec.add_argument("--steps", type=int, default=30)
    rec.add_argument("--device", default="cpu")
    rec.add_argument("--backend", default="sdpa")
    rec.add_argument("--only", nargs="*", choices=list(EXPERIMENTS))
    rec.add_argument("--target", help="the reference target's folder (GPU runs; default: the tiny experiments)")
    rec.add_argument("--data", help="conversations for --target")
    cmp = sub.add_parser("compare")
    cmp.add_argument("before")
    cmp.add_argument("after")
    args = parser.parse_args()
    record(args) if args.cmd == "record" else compare(args)


if __name__ == "__main__":
    run_main(main)  # bad input (a flag, a missing or malformed file): one line, not a traceback
