"""DFlash's block attention at a real shape: ``swa_kernels/block_attention.py``'s split-KV kernel against the two-product
path the drafter ran before (``grouped_attention`` over the mask ``block_visible`` builds from the slot positions), one
layer, each captured in a CUDA graph of 20 calls. Qwen3-8B's drafter widths (32 query heads, 8 KV heads, head_dim 128),
a block of 16 slots, bf16; a sliding layer's ring (W + block slots, W = 2048) and a full layer's cache (the capacity),
with the context filled up to each anchor. Prints µs per call for the products and for the kernel at its default split,
at the split rule's one wave rounded up (``ceil_wave``: ``split_size(equal_splits=False)``, the rule before), with the
key/value loads masked by the slot positions (``slot_loads``, the kernel before) rather than bounded by the block's last
slot, and at the ``--keys-per-split`` values, and the largest difference from the products' output.

    python benchmarks/block_attention.py --anchors 1024 8192 32768 --keys-per-split 128 256 512 1024
    python benchmarks/block_attention.py --anchors 8192 --keys-per-split 64 128 256 --warps 2 4 8 --stages 1 2 3
    python benchmarks/block_attention.py --anchors 8192 --raw --keys-per-split 64 128 256 --warps 2 4 8 --stages 1 2 3

``--raw``: the call the static drafter makes (``StaticDFlashDrafter._block_pass``): q and the block's keys and values
as raw projections (``k_new``/``v_new``, the scratch slots unread), q/k norms and RoPE inside the kernel; the reference
the products over the same keys normed and rotated in fp32 first; ``new_keys_in_last_split`` times the layout before the
block's own keys got a split of their own.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.measure import captured_us, require_cuda  # noqa: E402
from swa_kernels.attention import grouped_attention  # noqa: E402
from swa_kernels.block_attention import _launch, block_attention  # noqa: E402
from swa_kernels.decode_attention import Rope  # noqa: E402
from models.dflash import LayerAttention, _softmax_over_slots, block_visible  # noqa: E402
from models.static_target import rms_norm, rotate  # noqa: E402
require_cuda(__doc__, __name__, flags=True)  # one line on a machine without a CUDA GPU

HQ, HKV, D, BLOCK, WINDOW = 32, 8, 128, 16, 2048


def layer_case(anchor: int, rule: LayerAttention, capacity: int) -> dict:
    slots = capacity if rule.window is None else min(capacity, rule.window + BLOCK)  # as StaticDFlashDrafter.allocate
    g = torch.Generator(device="cuda").manual_seed(anchor)
    k, v = (torch.randn(1, HKV, slots + BLOCK, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    q = torch.randn(1, BLOCK, HQ, D, device="cuda", dtype=torch.bfloat16, generator=g)
    held = torch.arange(anchor, device="cuda")
    slot_pos = torch.full((1, slots), -1, dtype=torch.long, device="cuda")
    slot_pos[0, held[-slots:] % slots] = held[-slots:]
    anchor_t = torch.tensor([anchor], device="cuda")
    raw = {}
    if ARGS.raw:  # the block's own keys apart and q raw: norms and RoPE in the kernel, as the static drafter calls it
        k_new, v_new = (torch.randn(1, BLOCK, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        positions = torch.arange(capacity + BLOCK, device="cuda", dtype=torch.float32)
        freq = 1e6 ** (-torch.arange(0, D, 2, device="cuda", dtype=torch.float32) / D)
        angles = torch.cat([positions[:, None] * freq] * 2, dim=-1)
        q_w, k_w = ((1 + 0.1 * torch.randn(D, device="cuda", generator=g)).to(torch.bfloat16) for _ in range(2))  # the norms' weights
        rope = Rope(angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16), q_w, k_w, 1e-6)
        raw = {"k_new": k_new, "v_new": v_new, "rope": rope}

        def normed_rotated(x, w, pos):  # [1, n, H, D] at positions pos [n], in fp32
            cos, sin = rope.cos[pos].float()[None, :, None], rope.sin[pos].float()[None, :, None]
            return rotate(rms_norm(x.float(), w.float(), 1e-6), cos, sin)

        block_pos = anchor_t + torch.arange(BLOCK, device="cuda")
        q_ref = normed_rotated(q, q_w, block_pos).to(torch.bfloat16)
        k_ref = k.clone()
        v_ref = v.clone()
        k_ref[0, :, slots:slots + BLOCK] = normed_rotated(k_new, k_w, block_pos).to(torch.bfloat16)[0].transpose(0, 1)
        v_ref[0, :, slots:slots + BLOCK] = v_new[0].transpose(0, 1)
    else:
        q_ref, k_ref, v_ref = q, k, v
    scale = D ** -0.5

    def products():  # the drafter's path before the kernel: the mask from the slot positions, two products, a softmax
        visible = block_visible(slot_pos, anchor_t, BLOCK, rule)[:, None, None]
        qg = q_ref.transpose(1, 2).reshape(1, HKV, HQ // HKV * BLOCK, D)
        out = grouped_attention(qg, k_ref, v_ref, visible, scale, softmax=_softmax_over_slots)
        return out.view(1, HQ, BLOCK, D).transpose(1, 2)

    want = products().float()
    row = {"anchor": anchor, "layer": "full" if rule.window is None else f"sliding W={rule.window}", "slots": slots,
           "products_us": captured_us(products)}

    def timed(name, fn):
        row[f"{name}_us"] = captured_us(fn)
        row[f"{name}_maxdiff"] = (fn().float() - want).abs().max().item()

    timed("kernel_ceil_wave", lambda: _launch(q, k, v, slot_pos, anchor_t, scale, rule.causal, rule.window, None, equal_splits=False, **raw))
    if ARGS.raw:  # the layout before: the block's own keys in the split holding the last context slots
        timed("kernel_new_keys_in_last_split",
              lambda: _launch(q, k, v, slot_pos, anchor_t, scale, rule.causal, rule.window, None, new_keys_apart=False, **raw))
    if not ARGS.raw:
        timed("kernel_slot_loads", lambda: _launch(q, k, v, slot_pos, anchor_t, scale, rule.causal, rule.window, None, loads_by_slots=True))
    for size in [None, *ARGS.keys_per_split]:
        timed(f"kernel_{size or 'default'}",
              lambda: block_attention(q, k, v, slot_pos, anchor_t, scale, rule.causal, rule.window, keys_per_split=size, **raw))
        for warps in ARGS.warps or ([4] if ARGS.stages else []):  # pass 1's launch settings, where asked
            for stages in ARGS.stages or [2]:
                timed(f"kernel_{size or 'default'}_w{warps}s{stages}",
                      lambda: _launch(q, k, v, slot_pos, anchor_t, scale, rule.causal, rule.window, size, warps, stages, **raw))
    return row


def main() -> None:
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--anchors", type=int, nargs="+", default=[1024, 8192, 32768])
    p.add_argument("--keys-per-split", type=int, nargs="*", default=[128, 256, 512, 1024])
    p.add_argument("--warps", type=int, nargs="*", default=[], help="also time pass 1 at these num_warps (default 4)")
    p.add_argument("--stages", type=int, nargs="*", default=[], help="also time pass 1 at these num_stages (default 2)")
    p.add_argument("--raw", action="store_true", help="the static drafter's call: raw q and new keys, norms and RoPE in the kernel")
    p.add_argument("--out")
    ARGS = p.parse_args()
    rows = []
    print(f"# {torch.cuda.get_device_name()} | torch {torch.__version__}")
    for anchor in ARGS.anchors:
        capacity = anchor + 256 + BLOCK  # decode_speed's: the context, the new tokens, a block
        for rule in (LayerAttention(causal=True, window=WINDOW), LayerAttention(causal=False, window=None)):
            row = layer_case(anchor, rule, capacity)
            rows.append(row)
            kernels = " | ".join(f"{k[7:-3]} {v:.1f}" for k, v in row.items() if k.startswith("kernel_") and k.endswith("_us"))
            diff = max(v for k, v in row.items() if k.endswith("maxdiff"))
            print(f"anchor {anchor:>6} | {row['layer']:<16} | {row['slots']:>6} slots | products {row['products_us']:.1f} us | "
                  f"kernel: {kernels} | max diff {diff:.3g}", flush=True)
    if ARGS.out:
        Path(ARGS.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
