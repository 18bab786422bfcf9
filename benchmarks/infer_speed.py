"""Speculative decoding speed: tau, tokens/s, speedup over autoregressive decoding and the time split.

Two setups:
  - a real target and an exported drafter (``--target PATH --drafter PATH``): MT-Bench questions
    behind filler prefills, greedy, every window in ``--windows``;
  - a random-init target of a real shape (``--random-shape qwen3-8b``) with a random drafter of the
    matching shape: speed only (tau is meaningless), plus the per-forward timings behind the goals
    "verify a B-token block <= 1.3x a one-token decode step" and "time outside the forwards <= 10%".

    python benchmarks/infer_speed.py --target .target/qwen3-27m-sharegpt --drafter /tmp/gpurun/export \
        --device cuda --prefills 0 2048 8192 32768 --windows trained none 512 --questions 10 --max-new-tokens 256
    python benchmarks/infer_speed.py --random-shape qwen3-8b --device cuda --prefills 0 8192 32768

Prints one table row per (prefill, window, backend) and writes all numbers as JSON (``--out``). With a real target,
prompt lookup's tau on the same prompts sits beside the drafter's (as many drafts a step as the drafter's block, eval's
rule; ``--no-pld`` leaves it out); with random weights both taus mean nothing and the column reads "-".
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.script import run_main  # noqa: E402
from benchmarks.shapes import zlab_feature_layers  # noqa: E402

from models.dflash import DFlashDrafter  # noqa: E402
from infer.generate import generate  # noqa: E402
from infer.prompt_lookup import PromptLookupDrafter  # noqa: E402
from infer.loading import eos_ids, load_models, parse_window  # noqa: E402
from infer.prompts import long_prompt_ids, mt_bench_questions  # noqa: E402
from models.target import CachedTarget  # noqa: E402
from models.dflash import DFlashDraftModel, make_dflash_config  # noqa: E402

SHAPES = {
    # Qwen3-8B's config.json (hidden 4096, 36 layers, 32 q / 8 kv heads of 128, MLP 12288, vocab 151936)
    "qwen3-8b": dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                     tie_word_embeddings=False),
}


def random_models(shape: str, device: str, block_size: int, window: int, attention_backend: str):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**SHAPES[shape])
    torch.manual_seed(0)
    with torch.device(device):
        torch.set_default_dtype(torch.bfloat16)
        model = Qwen3ForCausalLM(config).eval()
        layers = config.num_hidden_layers
        target_layer_ids = zlab_feature_layers(layers)
        draft_config = make_dflash_config(config, num_hidden_layers=5, block_size=block_size, mask_token_id=151669,
                                          target_layer_ids=target_layer_ids, layer_types=["sliding_attention"] * 4 + ["full_attention"],
                                          sliding_window=window)
        drafter_model = DFlashDraftModel(draft_config).eval()
        torch.set_default_dtype(torch.float32)
    target = CachedTarget(model, target_layer_ids, attention_backend)
    return target, drafter_model


def forward_timings(target: CachedTarget, context: int, block_size: int, repeats: int = 20) -> dict:
    """Median ms of one target forward of 1 token and of ``block_size`` tokens behind ``context`` cached positions."""
    target.allocate(context + block_size + 1)
    ids = torch.randint(100, 1000, (block_size,), device=target.device)
    out = {}
    for n in (1, block_size):
        times = []
        for _ in range(repeats + 3):
            torch.cuda.synchronize()
            t = time.perf_counter()
            target.forward(ids[:n], context)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t) * 1e3)
        out[f"forward_{n}_ms"] = statistics.median(times[3:])
    out["verify_over_decode"] = out[f"forward_{block_size}_ms"] / out["forward_1_ms"]
    return out


def summarize(runs: list) -> dict:
    steps = sum(r.stats.steps for r in runs)
    decode_s = sum(r.stats.decode_s for r in runs)
    new = sum(r.stats.new_tokens for r in runs)
    accepted = [a for r in runs for a in r.stats.accepted_per_step]
    block = runs[0].stats.block_size
    return {
        "tau": sum(a + 1 for a in accepted) / max(len(accepted), 1),
        "tokens_per_s": new / decode_s,
        "new_tokens": new,
        "steps": steps,
        "draft_frac": sum(r.stats.draft_s for r in runs) / decode_s,
        "verify_frac": sum(r.stats.verify_s for r in runs) / decode_s,
        "other_frac": sum(r.stats.other_s for r in runs) / decode_s,
        "ms_per_step": 1e3 * decode_s / max(steps, 1),
        "acceptance_by_position": [sum(a >= k for a in accepted) / max(len(accepted), 1) for k in range(1, block)],
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--target")
    p.add_argument("--drafter")
    p.add_argument("--random-shape", choices=sorted(SHAPES))
    p.add_argument("--device", default="cuda")
    p.add_argument("--prefills", type=int, nargs="+", default=[0, 2048, 8192])
    p.add_argument("--windows", nargs="+", default=["trained"])
    p.add_argument("--backends", nargs="+", default=["sdpa"])
    p.add_argument("--questions", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--block-size", type=int, default=16, help="random drafter only")
    p.add_argument("--pld", action=argparse.BooleanOptionalAction, default=True,
                   help="prompt lookup's tau on the same prompts beside the drafter's (real targets only)")
    p.add_argument("--out")
    args = p.parse_args()

    rows = []
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    print(f"# {gpu} | torch {torch.__version__}")
    header = "prefill | window | backend | tau | PLD tau | spec tok/s | AR tok/s | speedup | ms/step | draft % | verify % | other % | same output"
    print(header)
    for backend in args.backends:
        if args.random_shape:
            target, drafter_model = random_models(args.random_shape, args.device, args.block_size, 2048, backend)
            tokenizer, eos = None, []
        for window_arg in args.windows:
            window = parse_window(window_arg)
            if args.random_shape:
                drafter = DFlashDrafter(drafter_model, target.embed_tokens, target.lm_head, window=window, attention_backend=backend)
            else:
                target, drafter, tokenizer = load_models(args.target, args.drafter, args.device, "auto", window, backend)
                eos = eos_ids(tokenizer, target.model)
            for prefill in args.prefills:
                spec_runs, base_runs, pld_runs, same = [], [], [], 0
                pld = None
                if args.pld and tokenizer is not None and not isinstance(drafter, PromptLookupDrafter):  # the free baseline, decoded the same way on the same prompts
                    pld = PromptLookupDrafter(num_draft_tokens=drafter.block_size - 1, vocab_size=target.lm_head.weight.shape[0])
                for i in range(args.questions):
                    if tokenizer is None:
                        prompt = torch.randint(100, 100_000, (prefill + 64,)).tolist()
                    else:
                        question = mt_bench_questions()[i]["turns"][0]
                        prompt = long_prompt_ids(tokenizer, question, prefill, offset=997 * i)
                    if i == 0:  # warm-up (allocations, kernel selection)
                        generate(target, drafter, prompt, 32, eos_token_ids=eos)
                    spec = generate(target, drafter, prompt, args.max_new_tokens, eos_token_ids=eos)
                    base = generate(target, None, prompt, args.max_new_tokens, eos_token_ids=eos)
                    same += spec.tokens == base.tokens
                    spec_runs.append(spec)
                    base_runs.append(base)
                    if pld is not None:
                        pld_runs.append(generate(target, pld, prompt, args.max_new_tokens, eos_token_ids=eos))
                s, b = summarize(spec_runs), summarize(base_runs)
                row = {"prefill": prefill, "window": window_arg, "backend": backend, "spec": s, "autoregressive": b,
                       "speedup": s["tokens_per_s"] / b["tokens_per_s"], "same_output": f"{same}/{args.questions}",
                       "prompt_lookup_tau": summarize(pld_runs)["tau"] if pld_runs else None, "gpu": gpu}
                if args.random_shape and torch.cuda.is_available():
                    row["forward"] = forward_timings(target, prefill + 64, drafter.block_size)
                rows.append(row)
                pld_tau = "-" if row["prompt_lookup_tau"] is None else f"{row['prompt_lookup_tau']:.3f}"
                print(f"{prefill} | {window_arg} | {backend} | {s['tau']:.3f} | {pld_tau} | {s['tokens_per_s']:.1f} | {b['tokens_per_s']:.1f} | "
                      f"{row['speedup']:.2f}x | {s['ms_per_step']:.2f} | {100 * s['draft_frac']:.1f} | {100 * s['verify_frac']:.1f} | "
                      f"{100 * s['other_frac']:.1f} | {row['same_output']}", flush=True)
                if "forward" in row:
                    f = row["forward"]
                    print(f"    target forward at {prefill + 64}: 1 token {f['forward_1_ms']:.2f} ms, {drafter.block_size} tokens "
                          f"{f[f'forward_{drafter.block_size}_ms']:.2f} ms ({f['verify_over_decode']:.2f}x); AR other {100 * b['other_frac']:.1f}%",
                          flush=True)
                print(f"    acceptance by position: {' '.join(f'{a:.2f}' for a in s['acceptance_by_position'])}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    run_main(main)  # bad input (a flag, a missing or malformed file): one line, not a traceback
