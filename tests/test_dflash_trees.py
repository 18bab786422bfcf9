"""DFlash trees: EAGLE-2's dynamic tree over a block's per-slot marginals (``models.dflash.block_tree``), drafted by the
eager ``DFlashDrafter`` (batch 1) and the static ``StaticDFlashDrafter`` (batched), verified in one target pass.

References: the tree written out in plain Python (lists, ``math``: the beam over slot marginals and the best nodes by
summed log-prob); the eager drafter's trees for the static drafter's rows. The loop with trees against Hugging Face's
greedy tokens and batch 1: ``tests/test_infer_generate.py``.
"""

from __future__ import annotations

import math

import pytest
import torch

from infer.batch import check_batchable
from models.dflash import DFlashDrafter, StaticDFlashDrafter, block_tree
from models.trees import tree_masks
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
    assert torch.equal(mask, tree_masks(parents, 4))


def test_a_draft_vocabulary_tree_holds_kept_ids_only() -> None:
    """-inf outside a draft vocabulary (the eager drafter's target-space logits): no such id enters the tree."""
    logits = torch.randn(1, 3, 10, generator=torch.Generator().manual_seed(1))
    logits[..., ::2] = float("-inf")
    ids, _, _, _ = block_tree(logits, 4, 20)
    assert (ids % 2 == 1).all()


def drive(model, embed, head, window, topk: int, total: int, steps_n: int = 6, seed: int = 0):
    """Two rows through the static drafter and an eager one per row: each step, each row's eager tree and its row of
    the batched one, then a random accepted path per row (its nodes' features appended as the loop appends them)."""
    g = torch.Generator().manual_seed(seed)
    features_size = model.fc.in_features
    b = model.block_size
    static = StaticDFlashDrafter(model, embed, head, window=window, tree_topk=topk, tree_tokens=total)
    static.allocate(200, batch=2)
    eagers = [DFlashDrafter(model, embed, head, window=window, tree_topk=topk, tree_tokens=total) for _ in range(2)]
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
@pytest.mark.parametrize("window", ["trained", None])
def test_batched_static_trees_equal_the_eager_trees_row_by_row(shape, window) -> None:
    model, embed, head = tiny(shape)  # block 4: depth 3
    depths_seen = set()
    for want, (tokens, parents, depths, mask) in drive(model, embed, head, window, topk=3, total=16):  # 12 nodes at depths 1-2
        assert torch.equal(tokens, want.tokens)
        assert torch.equal(parents, want.parents)
        assert torch.equal(depths, want.depths)
        assert torch.equal(mask, want.mask(3))
        depths_seen.update(want.depths.tolist())
    assert depths_seen == {1, 2, 3}, depths_seen


def test_tree_options_are_checked_in_one_line() -> None:
    model, embed, head = tiny("full")
    with pytest.raises(ValueError, match="tree tokens=500"):
        StaticDFlashDrafter(model, embed, head, tree_topk=3, tree_tokens=500)
    with pytest.raises(ValueError, match="tree_lookup=4; a DFlash tree with block size 4 takes prompt lookup's chain of at most 3"):
        DFlashDrafter(model, embed, head, tree_topk=2, tree_lookup=4)
    with pytest.raises(ValueError, match="draft_tree on a chain drafter"):
        StaticDFlashDrafter(model, embed, head).draft_tree(torch.tensor([1]), torch.tensor([3]))
    with pytest.raises(ValueError, match=r"the eager DFlash drafter \(DFlashDrafter\) runs at --batch-size 1"):
        check_batchable(DFlashDrafter(model, embed, head, tree_topk=2), 4)
    check_batchable(StaticDFlashDrafter(model, embed, head, tree_topk=2, tree_lookup=3), 4)


def test_load_models_drafts_dflash_trees_eagerly_at_batch_one_and_static_when_batched(reference_target_path, tmp_path) -> None:
    """``--tree-topk/--tree-tokens`` with a DFlash export: the eager drafter at batch 1 (as EAGLE-3's trees), the static one
    batched; ``--draft-steps`` stays refused in one line (a block's drafts are fixed by training)."""
    from transformers import AutoConfig

    from infer.loading import load_models
    from models.dflash import DFlashDraftModel, make_dflash_config

    config = make_dflash_config(AutoConfig.from_pretrained(reference_target_path), num_hidden_layers=1, block_size=8, mask_token_id=3,
                                target_layer_ids=[1, 3], layer_types=["sliding_attention"], sliding_window=64)
    DFlashDraftModel(config).save_pretrained(tmp_path)
    _, eager, _ = load_models(str(reference_target_path), str(tmp_path), tree_topk=4, tree_tokens=16, batch_size=1)
    _, static, _ = load_models(str(reference_target_path), str(tmp_path), tree_topk=4, tree_tokens=16, tree_lookup=7, batch_size=4)
    assert type(eager) is DFlashDrafter and eager.tree and eager.verify_tokens == 17
    assert type(static) is StaticDFlashDrafter and static.tree and static.verify_tokens == 24 and static.tree_lookup == 7
    with pytest.raises(ValueError, match="is a DFlash drafter: --draft-steps is an EAGLE-3 option .*block_size 8"):
        load_models(str(reference_target_path), str(tmp_path), draft_steps=4)


def test_another_engine_refuses_tree_options_in_one_line() -> None:
    from argparse import Namespace

    from eval.engines import check_engine_args

    args = Namespace(server=None, engine="vllm", command="mtbench", temperature=0.0, tree_topk=4, tree_tokens=None, tree_lookup=0)
    with pytest.raises(ValueError, match="--engine vllm: tree drafting .* is our loop's"):
        check_engine_args(args, ["trained"])
    check_engine_args(Namespace(**{**vars(args), "tree_topk": None}), ["trained"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("compile", [False, True])
def test_captured_trees_equal_the_uncaptured_ones_on_cuda(compile) -> None:
    """The block pass and the tree as one CUDA graph (compiled or not) against the same drafter run eagerly on the GPU,
    rows at their own positions (exact uncompiled; compiled, rounding may reorder a near tie: most steps equal)."""
    model, embed, head = (m.cuda() for m in tiny("sliding+full"))
    g = torch.Generator(device="cuda").manual_seed(0)
    drafters = [StaticDFlashDrafter(model, embed, head, capture=c, compile=c and compile, tree_topk=3, tree_tokens=16) for c in (False, True)]
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
