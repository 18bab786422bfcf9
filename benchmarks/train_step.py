"""One whole drafter training step at real scale: tokens/s, model FLOP utilisation, peak memory.

    python benchmarks/train_step.py --shape qwen3-8b --drafter dflash eagle3 --seq 2048 3072 8192 32768 --windows full 512 2048
    python benchmarks/train_step.py trainer.compile_scope=regions --shape qwen3-8b --drafter dflash --seq 3072 --windows 2048

Hydra overrides (positional) go before the options: after ``--windows`` they would be read as windows (an error).

Random-init target of a real shape (bf16, compiled layers, lean capture) and the drafter of the
experiment's recipe (``experiment=dflash_swa`` / ``eagle3_swa``: DFlash 5 layers, block 16, 512
anchors; EAGLE-3 1 layer, TTT 7, 32K draft vocabulary), built by the trainer's own functions and
stepped by its ``train_step`` (target capture, drafter forward + backward, AdamW), one sequence of
T random tokens per step, every token in the loss. Windows: ``full`` = every drafter layer full
attention; W = the recipe's layer types with sliding_window W.

Model FLOPs of a step: every Linear's 2·in·out per row, counted by hooks over one step (x1 under
no_grad, x3 with a trainable weight whose input takes a gradient, x2 with one whose input does not (the fc
over the target's features) and for a frozen weight the gradient passes through), plus attention 4·D·Hq per
visible query-key pair (x1 in the target, x3 in the drafter: forward and backward, no recomputation
credited), visible pairs counted from the masks' own rules. MFU = FLOPs / time
/ 779 TFLOP/s (bf16 matrix product on this H100, the issue's reference).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.measure import count_pairs, median_ms  # noqa: E402
from benchmarks.shapes import TARGET_SHAPES, random_target  # noqa: E402
from train.dflash import DFlashStep  # noqa: E402
from models.dflash import LayerMaskSpec, dflash_visible  # noqa: E402
from train.trainer import build_step, target_layer_ids, train_step  # noqa: E402

PEAK = 779e12


def compose(drafter: str, seq: int, window: str, extra: list[str] = ()):
    from hydra import compose as hydra_compose, initialize_config_module

    from train.trainer import to_train_config

    overrides = [f"experiment={drafter}_swa", "output_dir=/tmp/train_step_bench", f"data.max_length={seq}", "logger=none"]
    layers = 5 if drafter == "dflash" else 1
    if window == "full":
        overrides += [f"drafter.layer_types=[{','.join(['full_attention'] * layers)}]", "drafter.sliding_window=null"]
    else:
        overrides += [f"drafter.sliding_window={window}"]
    with initialize_config_module(config_module="configs", version_base="1.3"):
        return to_train_config(hydra_compose(config_name="train", overrides=overrides + list(extra)))


class LinearFlops:
    """Counts 2·in·out per row of every nn.Linear call, weighted by what its backward will do."""

    def __init__(self, *modules: torch.nn.Module):
        self.total = 0.0
        self.handles = [m.register_forward_hook(self.hook) for root in modules for m in root.modules() if isinstance(m, torch.nn.Linear)]

    def hook(self, module, args, output) -> None:
        x = args[0]
        flops = 2 * (x.numel() // module.in_features) * module.in_features * module.out_features
        if not torch.is_grad_enabled():
            backward = 0  # the frozen target
        elif module.weight.requires_grad:
            # the weight gradient, and the input's where the input takes one: the fc over the target's features (no
            # gradient) costs 2x forward, not 3x (counted 3x before 2026-12-05: DFlash's step +0.44%, EAGLE-3's +0.32%)
            backward = 1 + (1 if x.requires_grad else 0)
        else:
            backward = 1 if x.requires_grad else 0  # a frozen head the gradient passes through
        self.total += flops * (1 + backward)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def attention_flops(step, plan, target, seq: int) -> float:
    """4·D·Hq per visible pair: the target's causal layers (forward) + the drafter's masks (x3)."""
    tcfg = target.config
    per_pair_t = 4 * tcfg.head_dim * tcfg.num_attention_heads
    is_dflash = isinstance(step, DFlashStep)
    layers_run = max(step.ctx.layer_ids) + 1 if is_dflash else target.num_layers
    flops = layers_run * per_pair_t * seq * (seq + 1) / 2
    dcfg = step.drafter.config
    # x3: forward and a backward of twice its products, the model-FLOP convention (the Linear count credits no
    # recomputation either); FlashAttention's x3.5 counts its backward's recomputed QK^T (used before 2026-12-05, +0.25-0.4%)
    per_pair_d = 4 * getattr(dcfg, "head_dim", dcfg.hidden_size // dcfg.num_attention_heads) * dcfg.num_attention_heads * 3
    window = step.cfg.drafter.sliding_window
    for layer_type in step.drafter.layer_types:
        w = window if layer_type == "sliding_attention" else None
        if is_dflash:
            spec = LayerMaskSpec.for_layer(layer_type, window, step.cfg.drafter.sliding_block_causal)
            anchors = plan.anchors.to(step.ctx.device)
            valid = torch.ones(1, seq, dtype=torch.bool, device=step.ctx.device)
            q_len = anchors.shape[1] * step.block_size
            pairs = count_pairs(lambda b, q, kv: dflash_visible(b, q, kv, anchors, valid, step.block_size, spec), q_len, seq + q_len,
                                step.ctx.device, chunk=512)
        else:
            pairs = 0
            for j in range(step.steps):
                ctx = seq * (seq + 1) // 2 if w is None else sum(min(t + 1, w - j) for t in range(seq))
                pairs += ctx + j * seq
        flops += per_pair_d * pairs
    return flops


def window_arg(value: str) -> str:
    """``full`` or a positive W; anything else (e.g. a Hydra override swallowed by ``--windows``' list) is an error."""
    if value != "full" and not (value.isdigit() and int(value) > 0):
        raise argparse.ArgumentTypeError(f"expected full or a positive integer, got {value!r} (Hydra overrides go before the options)")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen3-8b", choices=sorted(TARGET_SHAPES))
    parser.add_argument("--drafter", nargs="+", default=["dflash", "eagle3"])
    parser.add_argument("--seq", type=int, nargs="+", default=[2048, 3072, 8192, 32768])
    parser.add_argument("--windows", nargs="+", type=window_arg, default=["full", "512", "2048"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--backend", default="auto", help="trainer.attention_backend")
    parser.add_argument("--checkpoint", action="store_true", help="trainer.activation_checkpointing (EAGLE-3 TTT steps)")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test of the code paths (tiny shapes), no speed")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides on top of the experiment, e.g. trainer.compile_scope=step")
    args = parser.parse_args()

    device = torch.device(args.device)
    target = random_target(args.shape, args.device)
    on_gpu = device.type == "cuda"

    rows = []
    for kind in args.drafter:
        for seq in args.seq:
            for window in args.windows:
                cfg = compose(kind, seq, window, args.overrides)
                cfg.trainer.attention_backend = args.backend
                cfg.trainer.activation_checkpointing = args.checkpoint
                layer_ids = target_layer_ids(cfg, target)
                torch.manual_seed(0)
                row = {"input_ids": torch.randint(100, target.vocab_size - 100, (seq,)).tolist(), "attention_mask": [1] * seq, "loss_mask": [1] * seq}
                if kind == "dflash":
                    cfg.drafter.mask_token_id = target.vocab_size - 1
                step = build_step(cfg, target, layer_ids, device, [row])
                drafter = step.drafter
                optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=1e-5, fused=True)
                scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
                batch = step.ctx.collate([row], 0)
                label = f"{kind} T={seq} window={window} ({step.ctx.backend}{', checkpointed steps' if args.checkpoint else ''})"
                try:
                    # Linear FLOPs of one forward, target eager (hooks inside compiled code would not fire);
                    # the backward is weighted in, not counted, so recomputation is not credited
                    target.uncompile_layers()
                    plan = step.plan(batch, torch.Generator().manual_seed(0))
                    counter = LinearFlops(target.model, drafter)
                    with step.eager() if hasattr(step, "eager") else contextlib.nullcontext():  # hooks do not fire in compiled code
                        stats = step.forward(batch, plan)
                    counter.remove()
                    stats.loss_sum.backward()
                    drafter.zero_grad(set_to_none=True)
                    del stats
                    flops = counter.total + attention_flops(step, plan, target, seq)
                    target.compile_layers()
                    for i in range(2):
                        train_step(step, [batch], i, optimizer, scheduler)
                    if on_gpu:
                        torch.cuda.reset_peak_memory_stats()
                    ms = median_ms(lambda: train_step(step, [batch], 0, optimizer, scheduler), warmup=0, repeats=args.repeats)
                    # the target's share: the capture alone
                    ids_d, mask_d = batch["input_ids"].to(device), batch["attention_mask"].to(device)
                    target_ms = median_ms(lambda: target.capture(ids_d, layer_ids, mask_d, with_logits=kind == "eagle3"), warmup=0, repeats=3)
                    peak = torch.cuda.max_memory_allocated() / 2**30 if on_gpu else float("nan")
                    rows.append((label, seq, ms, target_ms, flops, peak))
                except torch.OutOfMemoryError as e:
                    print(f"{label}: {str(e).splitlines()[0]}", flush=True)
                    import traceback

                    traceback.print_exc(limit=-4)
                    rows.append((label, seq, None, None, None, None))
                print(rows[-1], flush=True)
                drafter = step = optimizer = None  # freed before the next config (not del: the timing lambdas above name them)
                torch.cuda.empty_cache()

    print(f"{torch.cuda.get_device_name() if on_gpu else 'CPU'}, target {args.shape} random init (bf16, compiled layers), one sequence per step")
    print("| drafter, tokens, window (attention) | step ms | target ms | tokens/s | model TFLOP | TFLOP/s | MFU | peak GiB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, seq, ms, target_ms, flops, peak in rows:
        if ms is None:
            print(f"| {label} | OOM | | | | | | |")
            continue
        print(f"| {label} | {ms:.1f} | {target_ms:.1f} | {seq / ms * 1e3:,.0f} | {flops / 1e12:.1f} | {flops / ms / 1e9:.0f} | "
              f"{100 * flops / (ms / 1e3) / PEAK:.1f}% | {peak:.1f} |")


if __name__ == "__main__":
    main()
