"""DFlash trees: EAGLE-2's dynamic tree over a block's per-slot marginals (``models.dflash.block_tree``), drafted by the
eager ``DFlashDrafter`` (batch 1) and the static ``StaticDFlashDrafter`` (batched), verified in one target pass; with
re-drafted depths (``tree_redraft``), the expanded nodes' children from blocks drafted again with their paths in place.

References: the tree written out in plain Python (lists, ``math``: the beam over slot marginals and the best nodes by
summed log-prob; re-drafted, each node's candidates from its own path's block); the eager drafter's trees (one block
pass per re-drafted node, ``logits_for_ids``) for the static drafter's rows (the re-drafts batched in one pass). The loop with trees against Hugging Face's
greedy tokens and batch 1: ``tests/test_infer_generate.py``.
"""

from __future__ import annotations

import math

import pytest
import torch

from infer.batch import check_batchable
from models.dflash import DFlashDrafter, StaticDFlashDrafter, block_ids, block_tree
from infer_helpers import ancestor_masks
from test_static_drafters import SHAPES, tiny

pytestmark = pytest.mark.usefixtures("single_cpu_thread")


def reference_tree(logits: list[list[float]], k: int, total: int) -> set[tuple[int, ...]]:
    """The tree as token paths from the root, written out: slot d's top-k children under each of the k best nodes of
    depth d - 1 (by summed log-prob), then the ``total`` best of every candidate."""
    logp = [[x - math.log(sum(math.exp(y) for y in row)) for x in row] for row in logits]
    top = [sorted(range(len(row)), key=lambda t: -row[t])[:k] for row in logp]
    pool = [((t,), logp[0][t]) for t in top[0]]
    frontier = list(pool)
    for d in range(1, len(logits)):
        candidates = [(path + (t,), score + logp[d][t]) for path, score in frontier for t in top[d]]
        pool += candidates
        frontier = sorted(candidates, key=lambda c: -c[1])[:k]
    return {path for path, _ in sorted(pool, key=lambda c: -c[1])[:total]}


def reference_redraft_tree(first: list[list[float]], redraft, k: int, total: int, redrafted: int) -> set[tuple[int, ...]]:
    """The re-drafted tree written out: each expanded node at depths 1 .. ``redrafted`` takes its children from
    ``redraft(path)`` (a block's logits with the path in place), deeper ones from their nearest re-drafted ancestor's."""
    def logp(rows):
        return [[x - math.log(sum(math.exp(y) for y in row)) for x in row] for row in rows]

    def top(row):
        return sorted(range(len(row)), key=lambda t: -row[t])[:k]

    pool, frontier = [], [((), 0.0, logp(first))]  # path, score, the block its children come from
    for d in range(len(first)):
        if 1 <= d <= redrafted:
            frontier = [(path, score, logp(redraft(path))) for path, score, _ in frontier]
        candidates = [(path + (t,), score + table[d][t], table) for path, score, table in frontier for t in top(table[d])]
        pool += candidates
        frontier = sorted(candidates, key=lambda c: -c[1])[:k]
    return {path for path, _, _ in sorted(pool, key=lambda c: -c[1])[:total]}


def paths_of(ids: torch.Tensor, parents: torch.Tensor) -> set[tuple[int, ...]]:
    paths = []
    for token, parent in zip(ids.tolist(), parents.tolist()):
        paths.append((paths[parent - 1] if parent else ()) + (token,))
    return set(paths)


@pytest.mark.parametrize("k,total", [(2, 5), (3, 12), (3, 3 + 3 * 9)])  # a few nodes; most; every candidate
def test_block_tree_is_the_best_paths_of_the_beam_over_marginals(k, total) -> None:
    g = torch.Generator().manual_seed(k * 100 + total)
    logits = torch.randn(3, 4, 7, generator=g) * 2  # rows, slots 1..4, vocab 7
    ids, parents, depths, mask = block_tree(logits, k, total)
    assert ids.shape == parents.shape == depths.shape == (3, total) and mask.shape == (3, total + 1, total + 1)
    for r in range(3):
        assert paths_of(ids[r], parents[r]) == reference_tree(logits[r].tolist(), k, total), r
        assert (parents[r] < torch.arange(1, total + 1)).all()  # every parent before its children
        lengths = {}
        for i, parent in enumerate(parents[r].tolist(), start=1):
            lengths[i] = lengths.get(parent, 0) + 1
        assert depths[r].tolist() == [lengths[i] for i in range(1, total + 1)]
    assert torch.equal(mask, ancestor_masks(parents))


@pytest.mark.parametrize("k,total,redrafted", [(2, 9, 1), (3, 20, 2), (2, 2 + 3 * 4, 3)])
def test_redrafted_tree_is_the_best_paths_of_the_beam_over_each_nodes_own_block(k, total, redrafted) -> None:
    g = torch.Generator().manual_seed(k * 100 + total)
    first = torch.randn(2, 4, 6, generator=g) * 2  # rows, slots 1..4, vocab 6
    blocks = {}

    def block_of(row: int, path: tuple[int, ...]) -> torch.Tensor:  # a random block per (row, path), the same on every call
        if (row, path) not in blocks:
            blocks[row, path] = torch.randn(4, 6, generator=g) * 2
        return blocks[row, path]

    calls = []

    def redraft(paths: torch.Tensor) -> torch.Tensor:  # [B, k, d] -> [B, k, D, V]
        calls.append(paths.shape[2])
        return torch.stack([torch.stack([block_of(r, tuple(p)) for p in rows.tolist()]) for r, rows in enumerate(paths)])

    ids, parents, depths, mask = block_tree(first, k, total, redraft, redrafted)
    assert calls == list(range(1, redrafted + 1))  # one batched re-draft per depth, of the frontier's paths
    for r in range(2):
        want = reference_redraft_tree(first[r].tolist(), lambda path: block_of(r, path).tolist(), k, total, redrafted)
        assert paths_of(ids[r], parents[r]) == want, r
    assert torch.equal(mask, ancestor_masks(parents))
    # re-drafted blocks equal to the first: the plain tree
    same = block_tree(first, k, total, lambda paths: first[:, None].expand(-1, paths.shape[1], -1, -1), redrafted)
    assert all(torch.equal(a, b) for a, b in zip(same, block_tree(first, k, total)))


def test_a_draft_vocabulary_tree_holds_kept_ids_only() -> None:
    """-inf outside a draft vocabulary (the eager drafter's target-space logits): no such id enters the tree."""
    logits = torch.randn(1, 3, 10, generator=torch.Generator().manual_seed(1))
    logits[..., ::2] = float("-inf")
    ids, _, _, _ = block_tree(logits, 4, 20)
    assert (ids % 2 == 1).all()


def drive(model, embed, head, window, topk: int, total: int, steps_n: int = 6, seed: int = 0, redraft: int = 0):
    """Two rows through the static drafter and an eager one per row: each step, each row's eager tree and its row of
    the batched one, then a random accepted path per row (its nodes' features appended as the loop appends them)."""
    g = torch.Generator().manual_seed(seed)
    features_size = model.fc.in_features
    b = model.block_size
    static = StaticDFlashDrafter(model, embed, head, window=window, tree_topk=topk, tree_tokens=total, tree_redraft=redraft)
    static.allocate(200, batch=2)
    eagers = [DFlashDrafter(model, embed, head, window=window, tree_topk=topk, tree_tokens=total, tree_redraft=redraft) for _ in range(2)]
    lengths = [7, 12]
    for row, n in enumerate(lengths):
        features = torch.randn(n, features_size, generator=g)
        eagers[row].reset(200)
        eagers[row].append_context(features, 0)
        static.append(features[None], torch.tensor([0]), row=row)
    pos = torch.tensor(lengths)
    for _ in range(steps_n):
        token = torch.randint(2, 64, (2,), generator=g)
        tokens, parents, depths, mask = static.draft_tree(token, pos)
        block_features = torch.zeros(2, b, features_size)
        starts = pos.clone()
        for row in range(2):
            want = eagers[row].draft_tree(token[row], int(pos[row]))
            yield want, (tokens[row].clone(), parents[row].clone(), depths[row].clone(), mask[row].clone())
            end = int(torch.randint(0, want.tokens.shape[0] + 1, (), generator=g))  # accept the path to a random node (or none)
            path = []
            while end:
                path.insert(0, end)
                end = int(want.parents[end - 1])
            node_features = torch.randn(want.tokens.shape[0] + 1, features_size, generator=g)
            kept = torch.tensor([0] + path)
            eagers[row].append_context(node_features[kept], int(pos[row]))
            block_features[row, :kept.shape[0]] = node_features[kept]  # the rest of the block: never seen before it is rewritten
            pos[row] += len(path) + 1
        static.append(block_features, starts)


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("window,redraft", [("trained", 0), (None, 0), ("trained", 2)])
def test_batched_static_trees_equal_the_eager_trees_row_by_row(shape, window, redraft) -> None:
    model, embed, head = tiny(shape)  # block 4: depth 3
    depths_seen = set()
    for want, (tokens, parents, depths, mask) in drive(model, embed, head, window, topk=3, total=16, redraft=redraft):  # 12 nodes at depths 1-2
        assert torch.equal(tokens, want.tokens)
        assert torch.equal(parents, want.parents)
        assert torch.equal(depths, want.depths)
        assert torch.equal(mask, want.mask(3))
        depths_seen.update(want.depths.tolist())
    assert depths_seen == {1, 2, 3}, depths_seen


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_batched_pass_of_several_blocks_per_row_equals_each_block_alone(shape) -> None:
    """``StaticDFlashDrafter._block_pass`` over [B, R, b] ids (the re-drafts: R blocks per row sharing the row's context)
    against the eager drafter's pass of each block alone (``logits_for_ids``), rows at their own positions."""
    model, embed, head = tiny(shape)
    g = torch.Generator().manual_seed(3)
    b, size = model.block_size, model.fc.in_features
    static = StaticDFlashDrafter(model, embed, head)
    static.allocate(100, batch=2)
    lengths = [9, 5]
    eagers = []
    for row, n in enumerate(lengths):
        features = torch.randn(n, size, generator=g)
        eager = DFlashDrafter(model, embed, head)
        eager.reset(100)
        eager.append_context(features, 0)
        eagers.append(eager)
        static.append(features[None], torch.tensor([0]), row=row)
    token, paths = torch.tensor([5, 9]), torch.randint(2, 64, (2, 3, 2), generator=g)
    ids = block_ids(token, b, model.mask_token_id, paths)  # [2, 3, b]: the token, 2 revealed slots, then mask tokens
    assert ids[:, :, 0].eq(token[:, None]).all() and ids[:, :, 1:3].eq(paths).all() and ids[:, :, 3:].eq(model.mask_token_id).all()
    got = static._block_pass(ids, torch.tensor(lengths))
    for row in range(2):
        for r in range(3):
            torch.testing.assert_close(got[row, r], eagers[row].logits_for_ids(ids[row, r], lengths[row]), atol=2e-5, rtol=1e-4)
    # one block per row through the same pass: the scratch-slot path, equal to the eager block
    one = static._block_pass(ids[:, 0], torch.tensor(lengths))
    torch.testing.assert_close(one, got[:, 0], atol=2e-5, rtol=1e-4)


def test_tree_options_are_checked_in_one_line() -> None:
    model, embed, head = tiny("full")
    with pytest.raises(ValueError, match="tree tokens=500"):
        StaticDFlashDrafter(model, embed, head, tree_topk=3, tree_tokens=500)
    with pytest.raises(ValueError, match="tree_lookup=4; a DFlash tree with block size 4 takes prompt lookup's chain of at most 3"):
        DFlashDrafter(model, embed, head, tree_topk=2, tree_lookup=4)
    with pytest.raises(ValueError, match=r"tree_redraft=3; expected an int in 0 \.\. 2"):
        StaticDFlashDrafter(model, embed, head, tree_topk=2, tree_redraft=3)
    with pytest.raises(ValueError, match="tree_redraft=1: re-drafting grows a tree"):
        DFlashDrafter(model, embed, head, tree_redraft=1)
    for cls in (StaticDFlashDrafter, DFlashDrafter):  # eval's sweep re-windows the drafter: the drafting mode stays
        other = cls(model, embed, head, tree_topk=2, tree_tokens=5, tree_lookup=2, tree_redraft=1).with_window(7)
        assert (other.tree_topk, other.tree_tokens, other.tree_lookup, other.tree_redraft, other.window_arg) == (2, 5, 2, 1, 7)
    with pytest.raises(ValueError, match="draft_tree on a chain drafter"):
        StaticDFlashDrafter(model, embed, head).draft_tree(torch.tensor([1]), torch.tensor([3]))
    with pytest.raises(ValueError, match=r"the eager DFlash drafter \(DFlashDrafter\) runs at --batch-size 1"):
        check_batchable(DFlashDrafter(model, embed, head, tree_topk=2), 4)
    check_batchable(StaticDFlashDrafter(model, embed, head, tree_topk=2, tree_lookup=3), 4)


def test_load_models_drafts_dflash_trees_on_the_static_drafter_and_eagerly_under_flashinfer(reference_target_path, tmp_path) -> None:
    """``--tree-topk/--tree-tokens`` with a DFlash export: the static drafter (every batch size, batch 1 included), the
    eager one under FlashInfer attention only; ``--draft-steps`` on a chain verifies the block's first drafts, and is
    refused in one line with a tree or the eager drafter."""
    from transformers import AutoConfig

    from infer.loading import drafting_label, load_models
    from models.dflash import DFlashDraftModel, make_dflash_config

    config = make_dflash_config(AutoConfig.from_pretrained(reference_target_path), num_hidden_layers=1, block_size=8, mask_token_id=3,
                                target_layer_ids=[1, 3], layer_types=["sliding_attention"], sliding_window=64)
    DFlashDraftModel(config).save_pretrained(tmp_path)
    _, eager, _ = load_models(str(reference_target_path), str(tmp_path), tree_topk=4, tree_tokens=16, attention_backend="flashinfer")
    _, static, _ = load_models(str(reference_target_path), str(tmp_path), tree_topk=4, tree_tokens=16, tree_lookup=7)
    assert type(eager) is DFlashDrafter and eager.tree and eager.verify_tokens == 17
    assert type(static) is StaticDFlashDrafter and static.tree and static.verify_tokens == 24 and static.tree_lookup == 7
    with pytest.raises(ValueError, match="is a DFlash drafter: --draft-steps .* is for chains; a tree's size is --tree-tokens"):
        load_models(str(reference_target_path), str(tmp_path), draft_steps=4, tree_topk=4, tree_tokens=16)
    with pytest.raises(ValueError, match="--draft-steps with a DFlash drafter runs on the static drafter: --backend flashinfer"):
        load_models(str(reference_target_path), str(tmp_path), draft_steps=4, attention_backend="flashinfer")
    _, short, _ = load_models(str(reference_target_path), str(tmp_path), draft_steps=4)
    assert type(short) is StaticDFlashDrafter and (short.block_size, short.verify_tokens, short.pass_slots) == (5, 5, 5)
    assert drafting_label(short) == "DFlash block of 8, its first 4 drafts verified"
    _, redrafting, _ = load_models(str(reference_target_path), str(tmp_path), tree_topk=4, tree_tokens=16, tree_redraft=2)
    assert type(redrafting) is StaticDFlashDrafter and redrafting.tree_redraft == 2 and redrafting.verify_tokens == 17
    assert drafting_label(eager) == "DFlash tree top-4, 16 nodes, depth 7"
    assert drafting_label(static) == "DFlash tree top-4, 16 nodes, depth 7, + prompt lookup's chain of 7"
    assert drafting_label(redrafting) == "DFlash tree top-4, 16 nodes, depth 7, depths 1-2 re-drafted"
    _, block, _ = load_models(str(reference_target_path), str(tmp_path))
    _, pld, _ = load_models(str(reference_target_path), "pld")
    assert (drafting_label(block), drafting_label(pld), drafting_label(None)) == ("DFlash block of 8", "prompt lookup, up to 15 drafts", "target alone")
    with pytest.raises(ValueError, match=r"--tree-redraft 7; expected an int in 0 \.\. 6"):  # load_models: the flag
        load_models(str(reference_target_path), str(tmp_path), tree_topk=4, tree_redraft=7)
    with pytest.raises(ValueError, match="--drafter pld drafts chains only"):
        load_models(str(reference_target_path), "pld", tree_redraft=1)


def test_another_engine_refuses_tree_options_in_one_line() -> None:
    from argparse import Namespace

    from eval.engines import check_engine_args

    args = Namespace(server=None, engine="vllm", command="mtbench", temperature=0.0, tree_topk=4, tree_tokens=None, tree_lookup=0)
    with pytest.raises(ValueError, match="--engine vllm: tree drafting .* is our loop's"):
        check_engine_args(args, ["trained"])
    import sys

    check_engine_args(Namespace(**{**vars(args), "tree_topk": None, "vllm_python": sys.executable}), ["trained"])  # an interpreter that exists


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("compile", [False, True])
@pytest.mark.parametrize("redraft", [0, 2])
def test_captured_trees_equal_the_uncaptured_ones_on_cuda(compile, redraft) -> None:
    """The block pass and the tree as one CUDA graph (compiled or not) against the same drafter run eagerly on the GPU,
    rows at their own positions (exact uncompiled; compiled, rounding may reorder a near tie: most steps equal)."""
    model, embed, head = (m.cuda() for m in tiny("sliding+full"))
    g = torch.Generator(device="cuda").manual_seed(0)
    drafters = [StaticDFlashDrafter(model, embed, head, capture=c, compile=c and compile, tree_topk=3, tree_tokens=16,
                                   tree_redraft=redraft) for c in (False, True)]
    for d in drafters:
        d.allocate(100, batch=2)
        d.append(torch.randn(2, 9, 64, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1)), torch.tensor([0, 0], device="cuda"))
    pos = torch.tensor([9, 9], device="cuda")
    same = 0
    for step in range(12):
        token = torch.randint(2, 64, (2,), device="cuda", generator=g)
        outs = [[t.clone() for t in d.draft_tree(token, pos)] for d in drafters]
        same += all(torch.equal(a, b) for a, b in zip(outs[0], outs[1]))
        features = torch.randn(2, 4, 64, device="cuda", generator=g)
        for d in drafters:
            d.append(features, pos)
        pos = pos + torch.tensor([1 + step % 4, 4 - step % 4], device="cuda")
    assert same == 12 if not compile else same >= 10, same
