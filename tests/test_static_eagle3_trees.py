"""Batched EAGLE-2 dynamic trees over static caches (``StaticEagle3Drafter`` with tree options, ``tree_masks``,
``accept_trees``, ``StaticTarget.tree_step`` / ``move_paths``) against the batch-1 pieces they batch: the eager
``Eagle3Drafter.draft_tree`` (the same tokens, parents and depths, row by row, whatever path each row accepted),
an ancestor walk written out and ``accept_tree`` (per row, on random trees), and the target's own forward over the accepted text.
The loop's batched trees against batch 1 are in ``tests/test_infer_eagle3_generate.py``."""

from __future__ import annotations

import pytest
import torch

from models.eagle3 import Eagle3Drafter, StaticEagle3Drafter
from models.trees import DraftTree, accept_tree, accept_trees, merge_chain, merge_chains, tree_masks
from infer_helpers import ancestor_masks
from test_static_eagle3 import SHAPES, VOCAB, tiny, uncaptured_and_captured

pytestmark = pytest.mark.usefixtures("single_cpu_thread")

TOPK = 3


def random_tree(g: torch.Generator, n: int, vocab: int = 6) -> tuple[list[int], list[int], list[int]]:
    """tokens, parents (rows of [root, nodes]), depths of a random tree in creation order, a node's children distinct."""
    tokens, parents, depths = [], [], []
    for row in range(1, n + 1):
        while True:
            parent = int(torch.randint(0, row, (), generator=g))
            token = int(torch.randint(0, vocab, (), generator=g))
            if (parent, token) not in zip(parents, tokens):
                break
        tokens.append(token)
        parents.append(parent)
        depths.append(1 if parent == 0 else depths[parent - 1] + 1)
    return tokens, parents, depths


def rows_of_trees(g: torch.Generator, lengths: tuple[int, ...], n: int, depth: int, vocab: int):
    """Rows with random prompts of ``lengths`` each verifying a random tree of ``n`` nodes (tokens among ``vocab``
    random ids): prompts, ids [B, n+1] (root, nodes), pos [B], depths [B, n+1] (0 for the root), mask [B, n+1, n+1]."""
    prompts = [torch.randint(3, 8000, (m,), generator=g) for m in lengths]
    trees = [random_tree(g, n, vocab=vocab) for _ in prompts]
    vocab_ids = torch.randint(3, 8000, (vocab,), generator=g)  # the trees' tokens are these ids
    tokens = vocab_ids[torch.tensor([t[0] for t in trees])]
    parents, depths = torch.tensor([t[1] for t in trees]), torch.tensor([t[2] for t in trees])
    roots = torch.randint(3, 8000, (len(lengths),), generator=g)
    ids = torch.cat([roots[:, None], tokens], dim=1)
    return prompts, ids, torch.tensor(list(lengths)), torch.cat([depths.new_zeros(len(lengths), 1), depths], dim=1), tree_masks(parents, depth)


def test_batched_masks_equal_ancestor_walks_and_acceptance_equals_accept_tree() -> None:
    g = torch.Generator().manual_seed(0)
    n, rows = 12, 64
    trees = [random_tree(g, n) for _ in range(rows)]
    tokens, parents, depths = (torch.tensor([t[i] for t in trees]) for i in range(3))
    depth = int(depths.max())
    masks = tree_masks(parents, depth)
    # target argmax per row of [root, nodes]: mostly a child's token, so paths of every length occur
    target_tokens = torch.randint(0, 6, (rows, n + 1), generator=g)
    for r, (tok, par, _) in enumerate(trees):
        for row in range(n + 1):
            children = [t for t, p in zip(tok, par) if p == row]
            if children and torch.rand((), generator=g) < 0.8:
                target_tokens[r, row] = children[int(torch.randint(0, len(children), (), generator=g))]
    accepted, path, bonus = accept_trees(tokens, parents, depths, masks, target_tokens, depth)
    lengths = set()
    for r, (tok, par, dep) in enumerate(trees):
        for i in range(n + 1):  # row i sees itself and every ancestor up to the root, walked in plain Python
            seen, a = {i, 0}, i
            while a:
                a = par[a - 1]
                seen.add(a)
            assert masks[r, i].tolist() == [j in seen for j in range(n + 1)], (r, i)
        want_path, want_bonus = accept_tree(tok, par, target_tokens[r].tolist())
        assert int(accepted[r]) == len(want_path) and int(bonus[r]) == want_bonus, r
        assert path[r].tolist() == want_path + list(range(len(want_path) + 1, depth + 1)), r
        lengths.add(len(want_path))
    assert {0, 1, 2} <= lengths and max(lengths) >= 3, lengths


@pytest.mark.parametrize("n", [8, 2])  # 2 nodes: trees shallower than the chains, whose depth then bounds the masks
def test_prompt_lookup_chains_join_a_batch_of_trees_as_merge_chain_joins_one(n) -> None:
    """``merge_chains`` (padded to N + width with depth-0 nodes) against ``merge_chain`` row by row and its masks against a
    walk up the parents; on the padded trees ``accept_trees`` accepts what ``accept_tree`` accepts on the merged tree
    alone. (A mask bound by the trees' depth alone passed while every batch held a tree deeper than its chains.)"""
    g = torch.Generator().manual_seed(1)
    rows, width = 48, 5
    trees = [random_tree(g, n, vocab=4) for _ in range(rows)]
    tokens, parents, depths = (torch.tensor([t[i] for t in trees]) for i in range(3))
    chains = [torch.randint(0, 4, (int(torch.randint(0, width + 1, (), generator=g)),), generator=g).tolist() for _ in range(rows)]
    merged_tokens, merged_parents, merged_depths, masks = merge_chains(tokens, parents, depths, chains, width)
    assert merged_tokens.shape == (rows, n + width) and masks.shape == (rows, n + width + 1, n + width + 1)
    bound = max(int(depths.max()), width)
    target_tokens = torch.randint(0, 4, (rows, n + width + 1), generator=g)
    accepted, path, bonus = accept_trees(merged_tokens, merged_parents, merged_depths, masks, target_tokens, bound)
    grown = 0
    for r, (tok, par, dep) in enumerate(trees):
        want = merge_chain(DraftTree(torch.tensor(tok), torch.tensor(par), torch.tensor(dep)), chains[r])
        m = want.tokens.shape[0]
        grown += m > n
        assert torch.equal(merged_tokens[r, :m], want.tokens) and torch.equal(merged_parents[r, :m], want.parents), r
        assert torch.equal(merged_depths[r, :m], want.depths) and not merged_depths[r, m:].any(), r
        assert torch.equal(masks[r, :m + 1, :m + 1], ancestor_masks(want.parents[None])[0]), r
        assert not masks[r, :m + 1, m + 1:].any(), r  # no real node sees the padding
        want_path, want_bonus = accept_tree(want.tokens.tolist(), want.parents.tolist(), target_tokens[r, :m + 1].tolist())
        assert int(accepted[r]) == len(want_path) and int(bonus[r]) == want_bonus and path[r, :len(want_path)].tolist() == want_path, r
    assert grown > rows // 2


def drive(model, window, tree_tokens: int, accept_seed: int = 0, steps_n: int = 8):
    """Two rows (prompts of 7 and 12 positions) through both drafters: each step, each row's eager tree and its row of
    the batched one, then a random accepted path per row (its nodes' features and tokens appended as the loop does)."""
    g = torch.Generator().manual_seed(accept_seed)
    features_size = model.fc.in_features
    static = StaticEagle3Drafter(model, window=window, tree_topk=TOPK, tree_tokens=tree_tokens)
    static.allocate(200, batch=2)
    eagers = [Eagle3Drafter(model, window=window, tree_topk=TOPK, tree_tokens=tree_tokens) for _ in range(2)]
    lengths = [7, 12]
    for row, n in enumerate(lengths):
        features, ids = torch.randn(n, features_size, generator=g), torch.randint(0, VOCAB, (n,), generator=g)
        eagers[row].reset(200)
        eagers[row].append_context(features, 0, ids)
        static.prefill(features, 0, ids, row=row)
    pos = torch.tensor(lengths)
    p = static.block_size
    for _ in range(steps_n):
        token = torch.randint(0, VOCAB, (2,), generator=g)
        tokens, parents, depths, mask = static.draft_tree(token, pos)
        pending_features = torch.zeros(2, p, features_size)
        pending_ids = torch.zeros(2, p, dtype=torch.long)
        starts = pos.clone()
        for row in range(2):
            want = eagers[row].draft_tree(token[row], int(pos[row]))
            yield want, (tokens[row], parents[row], depths[row], mask[row])
            # accept the path to a random node (or none); features for [root, nodes] as a verify pass gives them
            end = int(torch.randint(0, want.tokens.shape[0] + 1, (), generator=g))
            path = []
            while end:
                path.insert(0, end)
                end = int(want.parents[end - 1])
            ids = torch.cat([token[row:row + 1], want.tokens])
            node_features = torch.randn(ids.shape[0], features_size, generator=g)
            kept = torch.tensor([0] + path)
            eagers[row].append_context(node_features[kept], int(pos[row]), ids[kept])
            pending_features[row, :kept.shape[0]] = node_features[kept]  # the rest of the block: zeros (never seen)
            pending_ids[row, :kept.shape[0]] = ids[kept]
            pos[row] += len(path) + 1
        static.append(pending_features, starts, pending_ids)


QUICK = {("sliding+full", "trained", 16), ("sliding", 2, 30)}  # the quick tier's cases (README: under 3 minutes); all in the full suite


@pytest.mark.parametrize("shape,window,tree_tokens", [  # tree_tokens: chosen by score; every candidate (depth 4's from depth 3's pass)
    pytest.param(s, w, t, marks=() if (s, w, t) in QUICK else pytest.mark.slow)
    for s in sorted(SHAPES) for w in ["trained", None, 2] for t in [16, 30]])
def test_batched_static_trees_equal_the_eager_trees_row_by_row(shape, window, tree_tokens) -> None:
    model = tiny(shape, steps=4)
    depths_seen = set()
    for want, (tokens, parents, depths, mask) in drive(model, window, tree_tokens):
        assert torch.equal(tokens, want.tokens)
        assert torch.equal(parents, want.parents)
        assert torch.equal(depths, want.depths)
        assert torch.equal(mask, want.mask(4))
        depths_seen.update(want.depths.tolist())
    assert {1, 2, 3} <= depths_seen, depths_seen  # trees past the first expansion


def test_tree_options_are_checked_in_one_line() -> None:
    with pytest.raises(ValueError, match="tree tokens=500"):
        StaticEagle3Drafter(tiny("sliding"), tree_topk=3, tree_tokens=500)
    with pytest.raises(ValueError, match="draft_tree on a chain drafter"):
        StaticEagle3Drafter(tiny("sliding")).draft_tree(torch.tensor([1]), torch.tensor([3]))


def test_tree_verify_and_path_moves_equal_the_model_on_each_rows_text(reference_target_path) -> None:
    """Three rows at their own positions verify a random tree each in one ``tree_step``: every node's logits and
    features are HF's forward over the row's prompt and the node's branch; after ``move_paths`` the accepted path's
    keys are where a plain step expects them: the next step's logits are HF's over prompt + path + the next token."""
    from transformers import AutoModelForCausalLM

    from models.static_target import StaticTarget

    model = AutoModelForCausalLM.from_pretrained(reference_target_path, dtype=torch.float32, attn_implementation="sdpa").eval()
    g = torch.Generator().manual_seed(4)
    n, depth = 9, 9
    target = StaticTarget(model, feature_layer_ids=[2])
    target.allocate(100, batch=3)
    prompts, ids, pos, depths, mask = rows_of_trees(g, (31, 18, 44), n, depth, vocab=3)
    for row, prompt in enumerate(prompts):
        target.prefill(prompt, row, 0)
    logits, features = target.tree_step(ids, pos, depths, mask)
    # the loop's greedy verify (the argmax inside its graph, no logits kept): the same tokens and features
    tokens, greedy_features = target.tree_greedy(ids, pos, depths, mask)
    assert torch.equal(tokens, logits.argmax(-1)) and torch.equal(greedy_features, features)

    def branch(row: int, node: int) -> list[int]:  # rows of [root, nodes] from the root to ``node``
        return [0] + [j for j in range(1, n + 1) if mask[row, node, j]]

    for row, prompt in enumerate(prompts):
        for node in range(n + 1):
            text = torch.cat([prompt, ids[row, branch(row, node)]])
            with torch.no_grad():
                ref = model(text[None], output_hidden_states=True)
            torch.testing.assert_close(logits[row, node], ref.logits[0, -1], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(features[row, node], ref.hidden_states[3][0, -1], rtol=1e-4, atol=1e-4)
    ends = [n, 1, 0]  # accept a deep path, one node, nothing
    path = torch.stack([torch.tensor(branch(row, end)[1:] + list(range(len(branch(row, end)), depth + 1))) for row, end in enumerate(ends)])
    target.move_paths(path, pos)
    after = torch.randint(3, 8000, (3, 1), generator=g)
    accepted = torch.tensor([len(branch(row, end)) - 1 for row, end in enumerate(ends)])
    step_logits, _ = target.step(after, pos + accepted + 1)
    for row, prompt in enumerate(prompts):
        text = torch.cat([prompt, ids[row, branch(row, ends[row])], after[row]])
        with torch.no_grad():
            ref = model(text[None]).logits[0, -1]
        torch.testing.assert_close(step_logits[row, 0], ref, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("compile", [False, True])
def test_captured_trees_equal_the_uncaptured_ones_on_cuda(compile) -> None:
    """The tree draft as a CUDA graph (compiled or not) against the same drafter run eagerly on the GPU, rows at their
    own positions and acceptances (exact uncompiled; compiled, the logits' rounding may reorder a near tie: scores close)."""
    model = tiny("sliding+full", steps=4).cuda()
    drafters, g, pos = uncaptured_and_captured(model, compile, tree_topk=TOPK, tree_tokens=16)
    same = 0
    for step in range(10):
        token = torch.randint(0, VOCAB, (2,), device="cuda", generator=g)
        outs = [[t.clone() for t in d.draft_tree(token, pos)] for d in drafters]
        same += all(torch.equal(a, b) for a, b in zip(outs[0], outs[1]))
        features = torch.randn(2, 5, model.fc.in_features, device="cuda", generator=g)
        block_ids = torch.randint(0, VOCAB, (2, 5), device="cuda", generator=g)
        for d in drafters:
            d.append(features, pos, block_ids)
        pos = pos + torch.tensor([1 + step % 4, 4 - step % 4], device="cuda")
    assert same == 10 if not compile else same >= 8, same


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_tree_verify_over_a_key_bucket_equals_the_capacity_on_cuda() -> None:
    """A captured ``tree_step`` given the host's bound on its keys (the products over a 256-slot bucket) gives what the
    same step over the whole capacity gives, fp32; a bound below the tree's own length is refused in one line."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from models.static_target import StaticTarget

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=8000, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, max_position_embeddings=2048)
    model = Qwen3ForCausalLM(config).eval().cuda()
    g = torch.Generator().manual_seed(5)
    n, depth = 9, 9
    prompts, ids, pos, all_depths, mask = (t.cuda() if isinstance(t, torch.Tensor) else [p.cuda() for p in t]
                                           for t in rows_of_trees(g, (31, 18, 44), n, depth, vocab=4))
    outs = []
    for keys in (None, 44 + n + 1):
        target = StaticTarget(model, feature_layer_ids=[2], capture=True)
        target.allocate(1000, batch=3)
        for row, prompt in enumerate(prompts):
            target.prefill(prompt, row, 0)
        for _ in range(2):  # capture, then replay
            logits, features = target.tree_step(ids, pos, all_depths, mask, keys)
        outs.append((logits.clone(), features.clone()))
        for _ in range(2):  # the loop's greedy verify: its own graph per bucket, the argmax inside it
            tokens, greedy_features = target.tree_greedy(ids, pos, all_depths, mask, keys)
        assert torch.equal(tokens, outs[-1][0].argmax(-1))
        torch.testing.assert_close(greedy_features, outs[-1][1], rtol=0, atol=0)
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(outs[1][1], outs[0][1], rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="tree_step keys=5: expected 10"):
        target.tree_step(ids, pos, all_depths, mask, 5)
