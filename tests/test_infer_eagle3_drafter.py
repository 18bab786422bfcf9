"""The cached EAGLE-3 drafter (``models/eagle3.py``) against the training forward.

Oracle: ``train/eagle3.unroll`` (the TTT forward, dense masks of ``train/eagle3.py``)
over the whole sequence. Step-0 outputs of a prefill-then-accept walk must equal unroll's step 0 at
every index, and chain step j from index t, fed the teacher-forced tokens x_{t+1+j}, unroll's step j
at index t; under trained, no, small (smaller than the chain) and W=1 windows, with sliding buffers
that compact every append, now and then, or never.
"""

from __future__ import annotations

import random

import pytest
import torch
from transformers import Qwen3Config

from models.eagle3 import Eagle3Drafter
from models.trees import DraftTree, accept_tree, merge_chain
from models.sampling import SamplingConfig
from train.eagle3 import step_masks, unroll
from models.eagle3 import Eagle3DraftModel, make_eagle3_config

VOCAB, HIDDEN, STEPS = 96, 32, 5

pytestmark = pytest.mark.usefixtures("single_cpu_thread")


def make_model(layer_types, window, seed=0, draft_vocab=64, norm_output=False) -> Eagle3DraftModel:
    torch.manual_seed(seed)
    target = Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=48, num_hidden_layers=8, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, max_position_embeddings=512)
    config = make_eagle3_config(target, num_hidden_layers=len(layer_types), target_layer_ids=[1, 3, 5], layer_types=layer_types,
                                sliding_window=window, draft_vocab_size=draft_vocab, ttt_length=STEPS, norm_output=norm_output)
    model = Eagle3DraftModel(config).eval()
    for p in model.parameters():  # larger weights than the init's 0.02, so the window matters in the logits
        p.data.normal_(0, 0.3) if p.dim() > 1 else None
    kept = torch.randperm(VOCAB)[:draft_vocab].sort().values  # a draft vocabulary that is not the first ids
    model.d2t.copy_(kept - torch.arange(draft_vocab))
    model.t2d.zero_()[kept] = True
    return model


def oracle_logits(model, features, ids, window) -> list[torch.Tensor]:
    """Per step j: [T, Vd] unroll's logits with the inference window applied to the sliding layers."""
    ctx_valid = torch.ones(1, ids.shape[0], dtype=torch.bool)
    masks = step_masks(ctx_valid, model.layer_types, window, STEPS, "sdpa")
    with torch.no_grad():
        return [model.logits(h)[0] for h in unroll(model, features[None], ids[None], ctx_valid, STEPS, masks=masks)]


@pytest.mark.parametrize("layer_types,trained,override", [
    (["sliding_attention"], 6, "trained"),
    (["sliding_attention", "full_attention"], 6, "trained"),
    (["sliding_attention", "full_attention"], 6, None),
    (["sliding_attention", "sliding_attention"], 6, 3),  # window smaller than the chain
    (["sliding_attention"], 6, 1),
    (["full_attention"], None, "trained"),
])
@pytest.mark.parametrize("keep_slack,extend_chunk", [(1, 4), (5, 512), (10_000, 512)])
def test_cached_steps_equal_the_training_unroll(layer_types, trained, override, keep_slack, extend_chunk) -> None:
    model = make_model(layer_types, trained, norm_output=override is None)
    window = trained if override == "trained" else override
    total = 48
    torch.manual_seed(1)
    features = torch.randn(total, 3 * HIDDEN)
    ids = torch.randint(0, VOCAB, (total,))
    want = oracle_logits(model, features, ids, window)
    drafter = Eagle3Drafter(model, window=override, keep_slack=keep_slack, extend_chunk=extend_chunk)
    drafter.reset(total + STEPS)
    rng = random.Random(0)
    done = set()  # indices whose step-0 logits were checked

    def check_step0(h, first):
        got = model.logits(h)
        torch.testing.assert_close(got, want[0][first:first + h.shape[0]], rtol=1e-3, atol=1e-3)
        done.update(range(first, first + h.shape[0]))

    pos = 0
    for n in [7, 6]:  # prefill in chunks
        h = drafter.append_context(features[pos:pos + n], pos, ids[pos:pos + n])
        check_step0(h, drafter.pending_start - h.shape[0])
        pos += n
    chains = 0
    while pos < total - 1:
        first = drafter.pending_start
        h = drafter.extend(ids[pos], pos)
        check_step0(h, first)
        t = pos - 1
        drafter.start_chain()
        h = h[-1:]
        for j in range(1, STEPS):
            if t + 1 + j >= total:
                break
            h = drafter.chain_step(ids[t + 1 + j].reshape(1), model.next_hidden(h), pos, j)
            torch.testing.assert_close(model.logits(h)[0], want[j][t], rtol=1e-3, atol=1e-3)
            chains += 1
        n = min(rng.randint(1, STEPS), total - pos)
        h = drafter.append_context(features[pos:pos + n], pos, ids[pos:pos + n])
        check_step0(h, drafter.pending_start - h.shape[0])
        pos += n
    assert done == set(range(drafter.pending_start)) and drafter.pending_start >= total - STEPS and chains > 20
    if window is not None and keep_slack < 100 and "sliding_attention" in layer_types:
        assert all(c.first_pos > 0 for c in drafter.caches if c.keep is not None)  # the sliding buffers did compact


def test_tree_of_width_one_is_the_chain() -> None:
    model = make_model(["sliding_attention", "full_attention"], 4)
    torch.manual_seed(2)
    features, ids = torch.randn(30, 3 * HIDDEN), torch.randint(0, VOCAB, (30,))
    chain = Eagle3Drafter(model)
    tree = Eagle3Drafter(model, tree_topk=1, tree_tokens=STEPS)
    for drafter in (chain, tree):
        drafter.reset(40)
        drafter.append_context(features[:25], 0, ids[:25])
    tokens, _ = chain.draft(ids[25], 25, SamplingConfig(), None)
    drafted = tree.draft_tree(ids[25], 25)
    assert drafted.tokens.tolist() == tokens.tolist()
    assert drafted.parents.tolist() == list(range(STEPS)) and drafted.depths.tolist() == list(range(1, STEPS + 1))


def test_tree_nodes_are_the_chain_top_k() -> None:
    """Every tree node is among the top-k of the chain that follows its path (tree masks == chain masks)."""
    model = make_model(["sliding_attention", "full_attention"], 3)
    torch.manual_seed(3)
    features, ids = torch.randn(30, 3 * HIDDEN), torch.randint(0, VOCAB, (30,))
    k, depth = 3, 4
    tree_drafter = Eagle3Drafter(model, steps=depth, tree_topk=k, tree_tokens=20)
    chain = Eagle3Drafter(model, steps=depth)
    for drafter in (chain, tree_drafter):
        drafter.reset(40)
        drafter.append_context(features[:25], 0, ids[:25])
    tree = tree_drafter.draft_tree(ids[25], 25)
    assert tree.tokens.shape == (20,) and 3 <= int(tree.depths.max()) <= depth
    h0 = chain.extend(ids[25], 25)[-1:]
    parents, tokens = tree.parents.tolist(), tree.tokens.tolist()
    for row in range(1, len(tokens) + 1):
        path = [row]
        while parents[path[-1] - 1]:
            path.append(parents[path[-1] - 1])
        path.reverse()
        chain.start_chain()
        h = h0
        for j, r in enumerate(path):
            top = model.draft_to_target(model.logits(h)[0].topk(k).indices).tolist()
            assert tokens[r - 1] in top, f"node {r} at depth {j + 1}"
            if j + 1 < len(path):
                h = chain.chain_step(torch.tensor([tokens[r - 1]]), model.next_hidden(h), 25, j + 1)
    mask = tree.mask()
    assert mask[0].tolist() == [True] + [False] * 20 and mask.sum(1).tolist() == [1] + [d + 1 for d in tree.depths.tolist()]


def test_tree_acceptance_walks_the_argmax() -> None:
    # root -> 1 (tok 5) -> 3 (tok 7); root -> 2 (tok 6) -> 4 (tok 8)
    tokens, parents = [5, 6, 7, 8], [0, 0, 1, 2]
    assert accept_tree(tokens, parents, [6, 0, 8, 0, 0]) == ([2, 4], 0)
    assert accept_tree(tokens, parents, [5, 9, 0, 0, 0]) == ([1], 9)
    assert accept_tree(tokens, parents, [4, 0, 0, 0, 0]) == ([], 4)
    tree = DraftTree(torch.tensor(tokens), torch.tensor(parents), torch.tensor([1, 1, 2, 2]))
    assert tree.mask().int().tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 0, 1, 0, 1]]


def test_merge_chain_follows_the_tree_then_branches() -> None:
    # root -> 1 (tok 5) -> 3 (tok 7); root -> 2 (tok 6) -> 4 (tok 8)
    tree = DraftTree(torch.tensor([5, 6, 7, 8]), torch.tensor([0, 0, 1, 2]), torch.tensor([1, 1, 2, 2]))
    same = merge_chain(tree, [6, 8])  # a path the tree has: nothing added
    assert (same.tokens.tolist(), same.parents.tolist(), same.depths.tolist()) == ([5, 6, 7, 8], [0, 0, 1, 2], [1, 1, 2, 2])
    assert merge_chain(tree, []) is tree
    merged = merge_chain(tree, [5, 9, 7, 7])  # follows row 1, leaves the tree at depth 2: rows 5 -> 6 -> 7
    assert merged.tokens.tolist() == [5, 6, 7, 8, 9, 7, 7]
    assert merged.parents.tolist() == [0, 0, 1, 2, 1, 5, 6]
    assert merged.depths.tolist() == [1, 1, 2, 2, 2, 3, 4]
    fresh = merge_chain(tree, [4, 4])  # a new first token: a new branch from the root
    assert fresh.parents.tolist()[4:] == [0, 5] and fresh.depths.tolist()[4:] == [1, 2]
    # the mask against ancestors walked element by element, and the walk takes the chain where the target agrees with it
    rows = merged.tokens.shape[0] + 1
    parent = [0] + merged.parents.tolist()
    want = torch.zeros(rows, rows, dtype=torch.bool)
    for row in range(rows):
        node = row
        want[row, node] = True
        while node:
            node = parent[node]
            want[row, node] = True
    assert torch.equal(merged.mask(4), want)
    assert accept_tree(merged.tokens.tolist(), merged.parents.tolist(), [5, 9, 0, 0, 0, 7, 7, 3]) == ([1, 5, 6, 7], 3)
    assert accept_tree(merged.tokens.tolist(), merged.parents.tolist(), [5, 7, 0, 2, 0, 0, 0, 0]) == ([1, 3], 2)


def test_tree_lookup_needs_a_tree() -> None:
    model = make_model(["sliding_attention"], 4)
    with pytest.raises(ValueError, match="tree_lookup=3: prompt lookup's branch joins a tree"):
        Eagle3Drafter(model, tree_lookup=3)
    hybrid = Eagle3Drafter(model, steps=4, tree_topk=2, tree_tokens=6, tree_lookup=10)
    assert (hybrid.block_size, hybrid.verify_tokens) == (11, 17)  # a 10-token copy can be accepted; 6 + 10 nodes + the root
    assert hybrid.with_window(None).tree_lookup == 10


@pytest.mark.parametrize("kwargs,message", [
    ({"window": 0}, "window=0"),
    ({"window": -3}, "window=-3"),
    ({"steps": 0}, "draft steps=0"),
    ({"tree_topk": 0}, "tree topk=0"),
    ({"tree_topk": 65}, r"tree topk=65; expected an int in 1 .. 64"),
    ({"tree_topk": 2, "tree_tokens": 0}, "tree tokens=0"),
    ({"tree_topk": 2, "tree_tokens": 100, "steps": 3}, r"tree tokens=100; expected an int in 1 .. 10"),
])
def test_bad_drafter_parameters(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        Eagle3Drafter(make_model(["sliding_attention"], 6), **kwargs)
