"""The frozen target's forward during drafter training: the Hugging Face way against ours.

    python benchmarks/target_forward.py --shape qwen3-8b --tokens 4096 [--drafter dflash|eagle3]

Random-init target of a real shape (bf16, on the GPU, SDPA). Rows:
  hf forward, output_hidden_states   ``model(ids, output_hidden_states=True)``: every layer, the
                                     final norm and the LM head, all hidden states kept (the usual
                                     way; the issue's 29.2K tokens/s reference point)
  capture                            ``TargetModel.capture``: hooks on the drafter's layers only,
                                     the forward stops after the deepest one, no LM head
  capture, compiled layers           the same with each decoder layer under ``torch.compile``
                                     (RMSNorm, RoPE and the MLP's SiLU-multiply fused)
  + logits (EAGLE-3)                 capture with the LM head (EAGLE-3's soft targets)

tokens/s is the median over 10 forwards after 3 warm-ups; TFLOP/s counts the work each row does
(2 x linear weights per token for the layers run, + the LM head when run, + causal attention pairs).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.measure import median_ms  # noqa: E402
from benchmarks.shapes import TARGET_SHAPES, random_target  # noqa: E402
from models.target import TargetModel, default_layer_ids  # noqa: E402
from benchmarks.measure import require_cuda  # noqa: E402
require_cuda(__doc__, __name__, flags=True)  # one line on a machine without a CUDA GPU


def forward_flops(target: TargetModel, tokens: int, layers_run: int, lm_head: bool) -> float:
    cfg = target.config
    per_layer = sum(p.numel() for n, p in target.layers[0].named_parameters() if p.dim() == 2)
    attn = 4 * cfg.head_dim * cfg.num_attention_heads * tokens * (tokens + 1) / 2
    flops = layers_run * (2 * per_layer * tokens + attn)
    if lm_head:
        flops += 2 * target.lm_head.weight.numel() * tokens
    return flops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen3-8b", choices=sorted(TARGET_SHAPES))
    parser.add_argument("--tokens", type=int, nargs="+", default=[4096])
    parser.add_argument("--drafter", default="dflash", choices=["dflash", "eagle3"])
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args()

    target = random_target(args.shape, "cuda")
    layer_ids = default_layer_ids(args.drafter, target.num_layers, 5 if args.drafter == "dflash" else None)
    rows = []
    for tokens in args.tokens:
        ids = torch.randint(100, target.vocab_size - 100, (1, tokens), device="cuda")
        cases = [
            ("hf forward, output_hidden_states", lambda: target.model(input_ids=ids, output_hidden_states=True, use_cache=False),
             target.num_layers, True),
            ("capture", lambda: target.capture(ids, layer_ids), max(layer_ids) + 1, False),
            ("capture + logits", lambda: target.capture(ids, layer_ids, with_logits=True), target.num_layers, True),
        ]
        for name, fn, layers_run, lm_head in cases:
            with torch.no_grad():
                ms = median_ms(fn)
            rows.append((tokens, name, ms, forward_flops(target, tokens, layers_run, lm_head)))
            print(rows[-1], flush=True)
        if not args.no_compile:
            target.compile_layers()
            for name, fn, layers_run, lm_head in cases[1:]:
                with torch.no_grad():
                    ms = median_ms(fn)
                rows.append((tokens, name + ", compiled layers", ms, forward_flops(target, tokens, layers_run, lm_head)))
                print(rows[-1], flush=True)
            target.uncompile_layers()
    print(f"{torch.cuda.get_device_name()}, {args.shape} random init, bf16, SDPA, {args.drafter} layers {layer_ids}")
    print("| tokens | forward | ms | tokens/s | TFLOP/s | speed vs hf |")
    print("|---:|---|---:|---:|---:|---:|")
    base = {t: ms for t, name, ms, _ in rows if name.startswith("hf")}
    for tokens, name, ms, flops in rows:
        print(f"| {tokens} | {name} | {ms:.1f} | {tokens / ms * 1e3:,.0f} | {flops / ms / 1e9:.0f} | {base[tokens] / ms:.2f}x |")


if __name__ == "__main__":
    main()
