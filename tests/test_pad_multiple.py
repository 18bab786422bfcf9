"""trainer.pad_multiple: micro-batches padded to a multiple (and DFlash anchors to half of num_anchors) instead of to
data.max_length and num_anchors. Same rows, same anchors, same loss as full padding; only the padding differs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from compose import compose_train

from train.dflash import sample_anchors
from train.trainer import build, to_train_config


def test_anchor_padding_keeps_the_drawn_anchors() -> None:
    loss_mask = torch.zeros(3, 300, dtype=torch.bool)
    loss_mask[0, 10:50] = True  # 39 eligible positions
    loss_mask[1, 100:290] = True  # 189
    loss_mask[2, 5:7] = True  # 1
    full, full_valid = sample_anchors(loss_mask, 256, torch.Generator().manual_seed(3), pad_to_max=True)
    bucketed, bucketed_valid = sample_anchors(loss_mask, 256, torch.Generator().manual_seed(3), pad_to_max=True, pad_multiple=128)
    assert full.shape == (3, 256) and bucketed.shape == (3, 256)  # 189 anchors -> 256 (a multiple of 128, capped)
    assert torch.equal(full[full_valid], bucketed[bucketed_valid])
    short, short_valid = sample_anchors(loss_mask[[0, 2]], 256, torch.Generator().manual_seed(3), pad_to_max=True, pad_multiple=128)
    assert short.shape == (2, 128) and short_valid.sum() == 40  # 39 + 1 anchors, 128 columns


def test_bucketed_padding_gives_the_loss_of_full_padding(tmp_path: Path) -> None:
    """One DFlash step's loss and gradients with rows padded to data.max_length and anchors to num_anchors (the static
    shapes the GPU backends use) against rows padded to a multiple of 64 and anchors to num_anchors / 2."""
    cfg = to_train_config(compose_train(["experiment=dflash_swa_tiny", "trainer.progress=false", "data.num_eval=0", "trainer.loop_eval_prompts=0",
                         "drafter.num_anchors=64", f"output_dir={tmp_path}"]))
    run = build(cfg)
    step, ctx = run.step, run.step.ctx
    shortest = sorted(range(len(run.train_ds)), key=lambda i: len(run.train_ds[i]["input_ids"]))
    rows = [run.train_ds[i] for i in shortest[40:44]]
    assert max(len(r["input_ids"]) for r in rows) < cfg.data.max_length - 64  # padding to max_length is real padding here
    ctx.static_shapes, ctx.pad_to = True, cfg.data.max_length  # what a GPU backend sets (dense masks still run it here)

    def loss_and_grads(pad_multiple: int):
        ctx.pad_multiple, step.anchor_multiple = pad_multiple, (32 if pad_multiple else 0)
        batch = ctx.collate(rows, run.target.pad_id)
        plan = step.plan(batch, torch.Generator().manual_seed(0))
        step.drafter.zero_grad(set_to_none=True)
        stats = step.forward(batch, plan)
        (stats.loss_sum / stats.num_labels).backward()
        grads = {n: p.grad.clone() for n, p in step.drafter.named_parameters() if p.grad is not None}
        return batch["input_ids"].shape[1], plan.anchors.shape[1], stats, grads

    full_len, full_anchors, full, full_grads = loss_and_grads(0)
    len_b, anchors_b, bucketed, grads_b = loss_and_grads(64)
    assert full_len == cfg.data.max_length and len_b < full_len and len_b % 64 == 0
    assert full_anchors == 64 and anchors_b in (32, 64)
    assert float(full.num_labels) == float(bucketed.num_labels) and float(full.accepted_sum) == float(bucketed.accepted_sum)
    assert float(bucketed.loss_sum) == pytest.approx(float(full.loss_sum), rel=1e-5)
    for name, g in full_grads.items():
        torch.testing.assert_close(grads_b[name], g, rtol=1e-4, atol=1e-6, msg=name)
