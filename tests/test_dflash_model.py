"""DFlash drafter: batched multi-anchor training forward == one block at a time, by the definition.

Reference for one block anchored at a: a fresh forward with context = features[:a] (in a sliding
layer only the last W - 1 - k positions matter for slot k) and the block alone, using masks built
for a single anchor. If the batched masks let blocks see each other or the future, they differ.
"""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config

from train.dflash import IGNORE, BlockStats, block_loss, build_blocks, dpace_weights, layer_masks, sample_anchors
from models.dflash import DFlashDraftModel, make_dflash_config


def tiny_config(layer_types: list[str], window: int | None, block_size: int = 4, block_causal: bool = True) -> Qwen3Config:
    target = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=8, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, max_position_embeddings=256)
    return make_dflash_config(target, num_hidden_layers=len(layer_types), block_size=block_size, mask_token_id=5,
                              target_layer_ids=[1, 3], layer_types=layer_types, sliding_window=window, sliding_block_causal=block_causal)


def run(model: DFlashDraftModel, embed: torch.nn.Embedding, features, input_ids, loss_mask, anchors, valid, ctx_valid):
    cfg = model.config
    blocks = build_blocks(input_ids, loss_mask, anchors, valid, model.block_size, model.mask_token_id)
    masks = layer_masks(blocks, ctx_valid, model.block_size, cfg.layer_types, cfg.sliding_window, cfg.sliding_block_causal, "sdpa")
    return model(embed(blocks.block_ids), features, blocks.positions, masks), blocks


@pytest.mark.parametrize("layer_types,window,block_causal", [
    (["sliding_attention", "full_attention"], 6, True),
    (["sliding_attention", "sliding_attention"], 3, False),
    (["full_attention"], None, False),
    (["sliding_attention"], 1, True),
])
def test_batched_blocks_equal_one_block_at_a_time(layer_types, window, block_causal) -> None:
    torch.manual_seed(0)
    config = tiny_config(layer_types, window, block_causal=block_causal)
    model = DFlashDraftModel(config).eval()
    embed = torch.nn.Embedding(64, 32)
    seq_len = 24
    input_ids = torch.randint(6, 64, (1, seq_len))
    loss_mask = torch.ones(1, seq_len, dtype=torch.bool)
    features = torch.randn(1, seq_len, 2 * 32)
    ctx_valid = torch.ones(1, seq_len, dtype=torch.bool)
    anchors = torch.tensor([[2, 7, 8, 15, 22]])  # adjacent, overlapping blocks, one running past the end
    valid = torch.ones_like(anchors, dtype=torch.bool)
    with torch.no_grad():
        batched, blocks = run(model, embed, features, input_ids, loss_mask, anchors, valid, ctx_valid)
        for n, a in enumerate(anchors[0].tolist()):
            # Only the context before the anchor exists for this block: features beyond it are garbage.
            feats = features.clone()
            feats[:, a:] = 1e3 * torch.randn_like(feats[:, a:])
            single, _ = run(model, embed, feats, input_ids, loss_mask, torch.tensor([[a]]), torch.tensor([[True]]), ctx_valid)
            got = batched[0, n * 4 : (n + 1) * 4]
            torch.testing.assert_close(got, single[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layer_types,window", [(["sliding_attention", "full_attention"], 6), (["sliding_attention"], 3)])
def test_group_major_key_interval_masks_equal_sdpa(layer_types, window) -> None:
    """The trainer's ``fa4`` masks ask for q's heads in group-major order (``KeyIntervalMask.group_major``);
    the drafter then permutes q_proj's rows and o_proj's columns in the forward. Same outputs and
    parameter gradients as with SDPA's dense masks (on CPU the key-interval path is PyTorch's reference)."""
    torch.manual_seed(1)
    config = tiny_config(layer_types, window)
    config.num_attention_heads, config.num_key_value_heads = 6, 2  # 3 query heads per KV head: a wrong order shows
    config.attention_bias = True  # q_proj's bias is permuted with its rows
    model = DFlashDraftModel(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))  # no zero-initialised weights hiding a head order
    embed = torch.nn.Embedding(64, 32)
    seq_len = 24
    input_ids = torch.randint(6, 64, (2, seq_len))
    loss_mask = torch.ones(2, seq_len, dtype=torch.bool)
    features = torch.randn(2, seq_len, 2 * 32)
    ctx_valid = torch.arange(seq_len)[None] < torch.tensor([[seq_len], [17]])  # right-padded second row
    anchors = torch.tensor([[2, 7, 8, 15, 20], [1, 4, 9, 12, 16]])
    valid = torch.ones_like(anchors, dtype=torch.bool)
    blocks = build_blocks(input_ids, loss_mask, anchors, valid, model.block_size, model.mask_token_id)
    results = []
    for backend in ("sdpa", "fa4"):
        masks = layer_masks(blocks, ctx_valid, model.block_size, config.layer_types, config.sliding_window,
                            config.sliding_block_causal, backend, query_groups=3, head_dim=config.head_dim)
        if backend == "fa4":
            assert all(m.group_major for m in masks.values())
        model.zero_grad()
        calls = []  # the projections still run as modules (forward hooks: FLOP counters, ZeRO-3's gathering)
        hooks = [m.register_forward_hook(lambda *_: calls.append(1)) for m in model.modules() if isinstance(m, torch.nn.Linear)]
        out = model(embed(blocks.block_ids), features, blocks.positions, masks)
        for h in hooks:
            h.remove()
        assert len(calls) == 1 + 9 * len(layer_types)  # fc; per layer q, k and v (context and block), o, the MLP's three
        out.square().sum().backward()
        results.append([out.detach()] + [p.grad.clone() for p in model.parameters()])
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_window_hides_old_context() -> None:
    """In an all-sliding drafter, context older than the window cannot change the output."""
    torch.manual_seed(0)
    model = DFlashDraftModel(tiny_config(["sliding_attention", "sliding_attention"], 4)).eval()
    embed = torch.nn.Embedding(64, 32)
    input_ids = torch.randint(6, 64, (1, 20))
    loss_mask = torch.ones(1, 20, dtype=torch.bool)
    features = torch.randn(1, 20, 64)
    anchors, valid = torch.tensor([[12]]), torch.tensor([[True]])
    ctx_valid = torch.ones(1, 20, dtype=torch.bool)
    with torch.no_grad():
        base, _ = run(model, embed, features, input_ids, loss_mask, anchors, valid, ctx_valid)
        old = features.clone()
        old[:, :9] += 10 * torch.randn_like(old[:, :9])  # positions <= 12 - 4: outside every slot's window
        changed_old, _ = run(model, embed, old, input_ids, loss_mask, anchors, valid, ctx_valid)
        recent = features.clone()
        recent[:, 11] += 10  # inside the window of slot 0
        changed_recent, _ = run(model, embed, recent, input_ids, loss_mask, anchors, valid, ctx_valid)
    torch.testing.assert_close(base, changed_old)
    assert not torch.allclose(base, changed_recent)


def test_blocks_labels_and_weights() -> None:
    input_ids = torch.tensor([[10, 11, 12, 13, 14, 15, 16, 17]])
    loss_mask = torch.tensor([[0, 0, 1, 1, 1, 0, 1, 1]], dtype=torch.bool)
    anchors, valid = torch.tensor([[2, 6]]), torch.tensor([[True, True]])
    blocks = build_blocks(input_ids, loss_mask, anchors, valid, 4, mask_token_id=99)
    assert blocks.block_ids.tolist() == [[12, 99, 99, 99, 16, 99, 99, 99]]
    assert blocks.positions.tolist() == [[2, 3, 4, 5, 6, 7, 8, 9]]
    # slot 0 never labelled; position 5 has no loss; positions 8, 9 do not exist
    assert blocks.labels.tolist() == [[IGNORE, 13, 14, IGNORE, IGNORE, 17, IGNORE, IGNORE]]
    logits = torch.full((1, 8, 100), -10.0)
    logits[0, 1, 13] = 10  # slot 1 right
    logits[0, 2, 0] = 10  # slot 2 wrong
    logits[0, 5, 17] = 10  # block 2 slot 1 right
    stats = block_loss(logits, blocks.labels, valid, 4, gamma=7.0)
    assert stats.slot_correct.tolist() == [0, 2, 0, 0] and stats.slot_count.tolist() == [0, 2, 1, 0]
    assert stats.accepted_sum == 2 and stats.num_blocks == 2  # each block accepts exactly one draft
    summary = stats.summary("x")
    assert summary["x/acc_slot_1"] == 1.0 and summary["x/acc_slot_2"] == 0.0
    assert summary["x/sim_tau"] == pytest.approx(2.0) and summary["x/anchor_tau"] == pytest.approx(2.0)
    assert "x/block_tau" not in summary  # random anchors: no replayed loop (evaluate_batch has one)
    # sim_tau by hand where the chain's product differs from the accuracies' sum: per-slot accuracies 0.5, 0.5, 1 give
    # 1 + 0.5 + 0.25 + 0.25 = 2.0 (the sum would give 3.0)
    zero = torch.zeros(())
    hand = BlockStats(zero, zero, torch.tensor([0, 1, 2, 4]), torch.tensor([0, 2, 4, 4]), zero, zero, zero, zero)
    assert hand.summary("x")["x/sim_tau"] == pytest.approx(2.0)


def test_revealed_slots_hold_the_true_tokens_and_no_labels() -> None:
    input_ids = torch.tensor([[10, 11, 12, 13, 14, 15, 16, 17]])
    loss_mask = torch.ones_like(input_ids, dtype=torch.bool)
    anchors, valid = torch.tensor([[1, 5, 6]]), torch.tensor([[True, True, True]])
    blocks = build_blocks(input_ids, loss_mask, anchors, valid, 4, mask_token_id=99, reveal=torch.tensor([[2, 0, 2]]))
    # block 1: slots 1, 2 shown; block 2: none; block 3: slot 1 shown, slot 2 (position 8) past the end stays a mask
    assert blocks.block_ids.tolist() == [[11, 12, 13, 99, 15, 99, 99, 99, 16, 17, 99, 99]]
    assert blocks.labels.tolist() == [[IGNORE, IGNORE, IGNORE, 14, IGNORE, 16, 17, IGNORE, IGNORE, IGNORE, IGNORE, IGNORE]]
    plain = build_blocks(input_ids, loss_mask, anchors, valid, 4, mask_token_id=99)
    assert torch.equal(build_blocks(input_ids, loss_mask, anchors, valid, 4, 99, reveal=torch.zeros(1, 3, dtype=torch.long)).block_ids,
                       plain.block_ids)


def test_dpace_weights_against_a_loop_over_slots() -> None:
    """D-PACE slot weights, written out slot by slot: w_k = sum_{j >= k, labelled} prod_{i <= j, labelled} s_i."""
    g = torch.Generator().manual_seed(0)
    bsz, blocks, b, vocab, alpha = 2, 3, 5, 11, 0.3
    logits = torch.randn(bsz, blocks * b, vocab, generator=g)
    labels = torch.randint(0, vocab, (bsz, blocks * b), generator=g)
    labels[:, ::b] = IGNORE  # slot 0 is the anchor
    labels[0, 3] = IGNORE  # an unlabelled slot inside a block
    labels[1, 2 * b + 2:] = IGNORE  # the block runs past the end of the loss mask
    has_label = labels != IGNORE
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1), ignore_index=IGNORE,
                                           reduction="none").view(bsz, -1)
    want = torch.zeros(bsz, blocks * b)
    for r in range(bsz):
        for n in range(blocks):
            for k in range(b):
                if not has_label[r, n * b + k]:
                    continue
                for j in range(k, b):
                    if has_label[r, n * b + j]:
                        prod = 1.0
                        for i in range(j + 1):
                            if has_label[r, n * b + i]:
                                prod *= (1 - alpha) * float(torch.exp(-ce[r, n * b + i])) + alpha
                        want[r, n * b + k] += prod
    torch.testing.assert_close(dpace_weights(ce, has_label, b, alpha), want)
    # block_loss with D-PACE: the CE weighted by these, no gradient through the weights
    logits.requires_grad_(True)
    stats = block_loss(logits, labels, torch.ones(bsz, blocks, dtype=torch.bool), b, gamma=7.0, dpace_alpha=alpha)
    torch.testing.assert_close(stats.loss_sum, (ce * want).sum())
    stats.loss_sum.backward()
    ce_grad = torch.autograd.grad((torch.nn.functional.cross_entropy(
        logits.reshape(-1, vocab), labels.reshape(-1), ignore_index=IGNORE, reduction="none").view(bsz, -1) * want).sum(), logits)[0]
    torch.testing.assert_close(logits.grad, ce_grad)


def test_anchor_sampling_respects_loss_mask_and_cap() -> None:
    loss_mask = torch.zeros(2, 50, dtype=torch.bool)
    loss_mask[0, 10:20] = True
    loss_mask[1, 30:33] = True
    anchors, valid = sample_anchors(loss_mask, 5, torch.Generator().manual_seed(0))
    assert valid.sum(1).tolist() == [5, 2]  # row 1 holds only two eligible anchors (30, 31)
    assert all(10 <= a <= 18 for a in anchors[0].tolist())
    assert anchors[1, :2].tolist() == [30, 31]
    assert anchors[0].tolist() == sorted(anchors[0].tolist())


def test_save_and_reload_round_trip(tmp_path) -> None:
    torch.manual_seed(0)
    model = DFlashDraftModel(tiny_config(["sliding_attention", "full_attention"], 6))
    model.save_pretrained(tmp_path)
    reloaded = DFlashDraftModel.from_pretrained(tmp_path)
    for (name, a), (_, b) in zip(model.state_dict().items(), reloaded.state_dict().items()):
        assert torch.equal(a, b), name
    import json

    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert config["layer_types"] == ["sliding_attention", "full_attention"] and config["sliding_window"] == 6
    assert config["dflash_config"] == {"target_layer_ids": [1, 3], "block_size": 4, "mask_token_id": 5}
    from safetensors import safe_open

    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        keys = set(f.keys())
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.self_attn.q_proj.weight", "layers.1.mlp.down_proj.weight"} <= keys
    assert not any("embed" in k or "lm_head" in k for k in keys)


@pytest.mark.slow
def test_compiled_regions_equal_the_eager_forward() -> None:
    """``compile_regions`` (trainer.compile_drafter on the GPU; inductor's CPU code here): the same hidden states and
    parameter gradients as the eager layers, and the compiled LM-head loss the same loss and input gradient."""
    from train.dflash import head_and_loss

    torch.manual_seed(0)
    model = DFlashDraftModel(tiny_config(["sliding_attention", "full_attention"], 6))
    embed = torch.nn.Embedding(64, 32)
    input_ids = torch.randint(0, 60, (2, 40))
    loss_mask = torch.zeros(2, 40, dtype=torch.bool)
    loss_mask[:, 10:] = True
    features = torch.randn(2, 40, 64)
    anchors, valid = sample_anchors(loss_mask, 5, torch.Generator().manual_seed(0), pad_to_max=True)
    ctx_valid = torch.ones(2, 40, dtype=torch.bool)
    eager, blocks = run(model, embed, features, input_ids, loss_mask, anchors, valid, ctx_valid)
    eager_grads = torch.autograd.grad(eager.square().sum(), list(model.parameters()))
    model.compile_regions()
    compiled, _ = run(model, embed, features, input_ids, loss_mask, anchors, valid, ctx_valid)
    compiled_grads = torch.autograd.grad(compiled.square().sum(), list(model.parameters()))
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-5)
    for a, b in zip(eager_grads, compiled_grads):
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-5)
    head = torch.nn.Linear(32, 64, bias=False).requires_grad_(False)
    hidden = eager.detach().requires_grad_(True)
    want = head_and_loss(hidden, head, blocks.labels, valid, model.block_size, 7.0)
    got = torch.compile(head_and_loss, dynamic=False)(hidden, head, blocks.labels, valid, model.block_size, 7.0)
    torch.testing.assert_close(got.loss_sum, want.loss_sum)
    torch.testing.assert_close(torch.autograd.grad(got.loss_sum, hidden)[0], torch.autograd.grad(want.loss_sum, hidden)[0])


def test_reveals_do_not_depend_on_padding_or_micro_batches() -> None:
    from train.dflash import sample_anchors_and_reveals

    torch.manual_seed(0)
    loss_mask = torch.rand(4, 60) < 0.7
    args = dict(num_anchors=12, reveal_prob=0.5, reveal_max=3, key_width=80)
    anchors, valid, reveal = sample_anchors_and_reveals(loss_mask, generator=torch.Generator().manual_seed(3), **args)
    # the same rows split into two micro-batches drawn one after the other from the step's generator, one padded further
    generator = torch.Generator().manual_seed(3)
    first = sample_anchors_and_reveals(loss_mask[:2], generator=generator, **args)
    second = sample_anchors_and_reveals(torch.nn.functional.pad(loss_mask[2:], (0, 15)), generator=generator, **args)
    for rows, (a, v, r) in ((slice(0, 2), first), (slice(2, 4), second)):
        n = int(v.sum(1).max())
        assert torch.equal(a[:, :n], anchors[rows, :n]) and torch.equal(r[:, :n], reveal[rows, :n])
    # without reveals: sample_anchors' anchors, unchanged
    plain = sample_anchors_and_reveals(loss_mask, 12, torch.Generator().manual_seed(3), 0.0, 3, key_width=80)
    assert plain[2] is None and torch.equal(plain[0], sample_anchors(loss_mask, 12, torch.Generator().manual_seed(3), key_width=80)[0])


def test_reveal_counts_follow_reveal_prob_and_reveal_max() -> None:
    from train.dflash import sample_anchors_and_reveals

    loss_mask = torch.ones(64, 600, dtype=torch.bool)
    _, _, reveal = sample_anchors_and_reveals(loss_mask, 256, torch.Generator().manual_seed(0), 0.3, 4)
    counts = torch.bincount(reveal.flatten(), minlength=5).double() / reveal.numel()  # 16,384 anchors
    assert abs(counts[0] - 0.7) < 0.015 and all(abs(c - 0.3 / 4) < 0.01 for c in counts[1:])
