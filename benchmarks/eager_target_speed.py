"""Decode speed of a target the static loop refuses (gpt-oss: sliding layers, attention sinks, experts), at a real
shape with random bf16 weights, on the eager ``CachedTarget`` the loop falls back to: what that fallback costs.

    python benchmarks/eager_target_speed.py --shape gpt-oss-20b --contexts 1024 8192 --new-tokens 64

Prints the GPU's measured bandwidth (``decode_speed.measured_bandwidth``), then per context, batch 1, greedy:
autoregressive tokens/s and the fraction of the bandwidth a token's bytes make of it (the weights one token reads:
attention, router, norms, the head, and its top-k experts' share of the experts, the embedding's one row aside; plus
the keys/values it reads, a sliding layer's window of them), the time outside the forwards; then a random DFlash
drafter of the matching shape (``models.dflash.make_dflash_config``: 5 layers, block 16, W = 2048) whose steps are
forced to accept τ - 1 drafts (``generate(accept_per_step=)``): tokens/s and speedup at each τ. Random weights: the
tokens mean nothing, τ is the forced one. ``--shape tiny-gpt-oss --device cpu`` runs the code paths in seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.script import run_main  # noqa: E402
from benchmarks.shapes import TARGET_SHAPES, random_target, zlab_feature_layers  # noqa: E402

from infer.generate import generate  # noqa: E402
from models.dflash import DFlashDrafter, DFlashDraftModel, make_dflash_config  # noqa: E402
from models.target import CachedTarget, layer_windows  # noqa: E402


def bytes_per_token(model: torch.nn.Module, context: int) -> int:
    """The bytes one decoded token reads: every weight but the experts' and the embedding's, the top-k experts' share
    of the experts (each token's k experts are distinct), and the keys and values of ``context`` positions (a sliding
    layer's window of them)."""
    config = model.config.get_text_config()
    experts = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if ".experts." in n)
    embedding = model.get_input_embeddings().weight
    rest = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if ".experts." not in n) - embedding.numel() * embedding.element_size()
    k_share = getattr(config, "num_experts_per_tok", 1) / max(getattr(config, "num_local_experts", 1), 1)
    kv_row = 2 * config.num_key_value_heads * config.head_dim * embedding.element_size()
    keys = sum(min(context, window or context) for window in layer_windows(config))
    return int(rest + k_share * experts + kv_row * keys)


def measured_bandwidth_or_none(device: str) -> dict | None:
    if device != "cuda":
        return None
    from benchmarks.decode_speed import measured_bandwidth

    return measured_bandwidth()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="gpt-oss-20b", choices=sorted(TARGET_SHAPES))
    p.add_argument("--device", default="cuda")
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 8192])
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--taus", type=int, nargs="+", default=[3])
    p.add_argument("--out")
    args = p.parse_args()

    bandwidth = measured_bandwidth_or_none(args.device)
    target_model = random_target(args.shape, args.device).model
    config = target_model.config
    layers = config.num_hidden_layers
    feature_ids = zlab_feature_layers(layers)
    with torch.device(args.device):
        draft = DFlashDraftModel(make_dflash_config(config, num_hidden_layers=5, block_size=16, mask_token_id=3, target_layer_ids=feature_ids,
                                                    layer_types=["sliding_attention"] * 4 + ["full_attention"], sliding_window=2048))
    draft = draft.to(target_model.dtype).eval().requires_grad_(False)
    target = CachedTarget(target_model, feature_ids)
    drafter = DFlashDrafter(draft, target_model.get_input_embeddings(), target_model.get_output_embeddings())
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    bw = f"{bandwidth['TBps']:.2f} TB/s measured" if bandwidth else "no bandwidth (CPU)"
    print(f"# {device} | {args.shape}, random {str(target_model.dtype).removeprefix('torch.')} weights, the eager CachedTarget | {bw}")
    print("context | AR tok/s | ms/token | % of bandwidth | outside forwards % | " + " | ".join(f"DFlash τ={t} tok/s (speedup, /τ)" for t in args.taus))
    rows = []
    generator = torch.Generator().manual_seed(0)
    for context in args.contexts:
        prompt = torch.randint(100, config.vocab_size - 1, (context,), generator=generator).tolist()
        generate(target, None, prompt, 8)  # warm-up: allocations, kernel choices
        ar = generate(target, None, prompt, args.new_tokens).stats
        ar_tps = ar.new_tokens / ar.decode_s
        row = {"context": context, "ar_tokens_per_s": ar_tps, "ms_per_token": 1e3 * ar.decode_s / ar.new_tokens,
               "outside_forwards": ar.other_s / ar.decode_s, "bytes_per_token": bytes_per_token(target_model, context), "spec": {}}
        if bandwidth:
            row["bandwidth_fraction"] = row["bytes_per_token"] * ar_tps / (bandwidth["TBps"] * 1e12)
        for tau in args.taus:
            generate(target, drafter, prompt, 16, accept_per_step=tau - 1)
            spec = generate(target, drafter, prompt, args.new_tokens, accept_per_step=tau - 1).stats
            tps = spec.new_tokens / spec.decode_s
            row["spec"][tau] = {"tokens_per_s": tps, "speedup": tps / ar_tps, "draft_frac": spec.draft_s / spec.decode_s,
                                "verify_frac": spec.verify_s / spec.decode_s}
        rows.append(row)
        frac = f"{100 * row['bandwidth_fraction']:.1f}%" if bandwidth else "-"
        print(f"{context} | {ar_tps:.1f} | {row['ms_per_token']:.2f} | {frac} | {100 * row['outside_forwards']:.1f} | "
              + " | ".join(f"{s['tokens_per_s']:.1f} ({s['speedup']:.2f}x, {s['speedup'] / t:.3f})" for t, s in row["spec"].items()), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"device": device, "shape": args.shape, "bandwidth": bandwidth, "rows": rows}, indent=2))


if __name__ == "__main__":
    run_main(main)  # bad input (a flag, a missing file): one line, not a traceback
