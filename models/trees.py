"""Draft trees for verification in one target pass, shared by the drafters that grow them (``models/eagle3.py``'s
EAGLE-2 dynamic trees, ``models/dflash.py``'s trees over a block's marginals) and by the loops that verify them
(``infer/generate.py`` at batch 1, ``infer/batch.py`` batched).

A tree is its nodes in creation order (every parent before its children) after a root, the last verified token: row 0
of [root, nodes]. Node i holds a draft token (target id), its parent row and its depth (1 .. the deepest draft). The
verify pass runs [root, nodes] at positions root + depth under ``tree_masks`` (a row sees its ancestors and itself);
greedy acceptance follows, from the root, the child holding the target's argmax (``accept_tree``; batched on the
device: ``accept_trees``). A node's children hold distinct tokens, so at most one child can match.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DraftTree:
    """Draft nodes in creation order (every parent before its children); row 0 is the root (the last verified token)."""

    tokens: torch.Tensor  # [N] target ids
    parents: torch.Tensor  # [N] parent row in [root, nodes...] (0 = root)
    depths: torch.Tensor  # [N] 1 .. depth

    def mask(self, depth: int | None = None) -> torch.Tensor:
        """[N+1, N+1] bool: row i sees its ancestors and itself (tree attention for verification).

        depth: an upper bound on the node depths (the drafter's steps: no host sync); default their max."""
        bound = (depth if depth is not None else int(self.depths.max())) if self.tokens.shape[0] else 0
        return tree_masks(self.parents[None], bound)[0]


def merge_chain(tree: DraftTree, chain: list[int]) -> DraftTree:
    """``tree`` with the draft ``chain`` (target ids for depths 1 .. len(chain) after the root) as one more branch.

    The chain follows the tree's nodes while it agrees with them and continues as new nodes (appended after the
    tree's, each after its parent) from where it leaves them, so no two children of a node hold the same token and
    ``accept_tree`` walks whichever of the two the target agrees with further. Host-side (one sync for the tree)."""
    if not chain:
        return tree
    tokens, parents, depths = merge_chain_lists(tree.tokens.tolist(), tree.parents.tolist(), tree.depths.tolist(), chain)
    device = tree.tokens.device
    return DraftTree(tokens=torch.tensor(tokens, dtype=tree.tokens.dtype, device=device),
                     parents=torch.tensor(parents, dtype=tree.parents.dtype, device=device),
                     depths=torch.tensor(depths, dtype=tree.depths.dtype, device=device))


def merge_chain_lists(tokens: list[int], parents: list[int], depths: list[int], chain: list[int]) -> tuple[list[int], list[int], list[int]]:
    """``merge_chain`` on host lists (new lists; the tree's nodes first, then the chain's new ones)."""
    tokens, parents, depths = list(tokens), list(parents), list(depths)
    children = {(parent, token): row for row, (token, parent) in enumerate(zip(tokens, parents), start=1)}
    row = 0
    for depth, token in enumerate(chain, start=1):
        nxt = children.get((row, token))
        if nxt is None:
            tokens.append(token)
            parents.append(row)
            depths.append(depth)
            nxt = children[(row, token)] = len(tokens)
        row = nxt
    return tokens, parents, depths


def merge_chains(tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, chains: list[list[int]],
                 width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``merge_chain`` for a batch of trees (tokens/parents/depths [B, N]; ``chains[b]`` at most ``width`` long): every
    row padded to N + width nodes with depth-0 nodes under the root (token 0; ``accept_trees`` never takes a depth-0
    node, and no other node sees them). Returns tokens, parents, depths [B, N + width] and ``tree_masks`` [B, N+1+width,
    N+1+width]. Host-side: one sync for the trees."""
    rows = []
    for t, p, d, chain in zip(tokens.tolist(), parents.tolist(), depths.tolist(), chains):
        t, p, d = merge_chain_lists(t, p, d, chain[:width])
        pad = tokens.shape[1] + width - len(t)
        rows.append((t + [0] * pad, p + [0] * pad, d + [0] * pad))
    device = tokens.device
    merged = [torch.tensor([r[i] for r in rows], dtype=x.dtype, device=device) for i, x in enumerate((tokens, parents, depths))]
    bound = max(int(depths.max()) if depths.numel() else 0, max((len(c[:width]) for c in chains), default=0))
    return (*merged, tree_masks(merged[1], bound))


def accept_tree(tokens: list[int], parents: list[int], target_tokens: list[int]) -> tuple[list[int], int]:
    """Greedy tree acceptance: from the root follow the child whose token is the target's argmax there.

    Args: host lists; tokens/parents [N] as in ``DraftTree``, target_tokens [N+1] argmax per row.
    Returns: the accepted rows (1-based, root excluded, in path order) and the bonus token.
    """
    children: dict[int, dict[int, int]] = {}
    for row, (token, parent) in enumerate(zip(tokens, parents), start=1):
        children.setdefault(parent, {})[token] = row
    row, path = 0, []
    while (nxt := children.get(row, {}).get(target_tokens[row])) is not None:
        path.append(nxt)
        row = nxt
    return path, target_tokens[row]


def tree_masks(parents: torch.Tensor, depth: int) -> torch.Tensor:
    """``DraftTree.mask`` for a batch of trees: parents [B, N] (rows of [root, nodes]) -> [B, N+1, N+1] bool, row i
    sees its ancestors and itself; ``depth`` bounds the node depths (no host sync)."""
    bsz, n = parents.shape[0], parents.shape[1] + 1
    parent = torch.cat([parents.new_zeros(bsz, 1), parents], dim=1)  # the root is its own parent
    visible = torch.eye(n, dtype=torch.bool, device=parents.device).expand(bsz, n, n).clone()
    cur = torch.arange(n, device=parents.device).expand(bsz, n)
    for _ in range(depth):
        cur = parent.gather(1, cur)
        visible.scatter_(2, cur[:, :, None], True)
    return visible


def accept_trees(tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, mask: torch.Tensor,
                 target_tokens: torch.Tensor, depth: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``accept_tree`` for a batch of trees on the device (no host sync): a node is accepted when it and each of its
    ancestors hold the target's argmax at their parent; a node's children hold distinct tokens, so the accepted nodes
    form one path from the root and the deepest one ends it.

    Args: tokens/parents/depths [B, N], mask [B, N+1, N+1] (``tree_masks``), target_tokens [B, N+1] (argmax per row of
    [root, nodes]), depth: the bound on node depths.
    Returns: accepted [B], path [B, depth] (the accepted rows in depth order; past the accepted count, entry j holds
    j + 1, so moving slot ``pos + path[j]`` to ``pos + 1 + j`` leaves it in place) and the bonus token [B].
    """
    bsz, n = tokens.shape
    correct = tokens == target_tokens.gather(1, parents)  # [B, N]
    on_good_path = ~(mask[:, 1:, 1:] & ~correct[:, None, :]).any(-1)  # itself and every ancestor below the root correct
    accepted, deepest = torch.where(on_good_path, depths, 0).max(1)
    end = torch.where(accepted > 0, deepest + 1, 0)  # [B] the path's last row in [root, nodes]
    on_path = mask.gather(1, end[:, None, None].expand(bsz, 1, n + 1))[:, 0, 1:]  # [B, N] the path's nodes (root excluded)
    path = torch.arange(1, depth + 2, device=tokens.device).expand(bsz, depth + 1).clone()  # column `depth`: a dump
    path.scatter_(1, torch.where(on_path, depths - 1, depth), torch.arange(1, n + 1, device=tokens.device).expand(bsz, n))
    return accepted, path[:, :depth], target_tokens.gather(1, end[:, None])[:, 0]


def select_trees(ids: torch.Tensor, scores: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor,
                 total: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's ``total`` best pool nodes (draft ids, scores, parent pool index or -1 [B, P]; depths [P]), in creation
    order (parents first): draft ids, parent rows in [root, nodes] (0 = the root) and depths, [B, total]."""
    # stable: a child whose log-prob rounds to 0 ties its parent and still comes after it
    chosen = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :total].sort(dim=1).values
    bsz, n = chosen.shape
    row_of = torch.full_like(parents, -1).scatter_(1, chosen, torch.arange(1, n + 1, device=chosen.device).expand(bsz, n))
    parent = parents.gather(1, chosen)
    parent_rows = torch.where(parent < 0, 0, row_of.gather(1, parent.clamp(min=0)))
    return ids.gather(1, chosen), parent_rows, depths[chosen]


def tree_options(tree_topk, tree_tokens, tree_lookup, depth: int, draft_vocab: int) -> tuple[bool, int, int]:
    """(trees on, top-k, nodes) for both drafters, with one-line ValueErrors for options that cannot make a tree. Either
    tree option turns trees on; the other defaults to top-8 / 64 nodes (or every candidate when the tree is smaller).
    ``tree_lookup`` (prompt lookup's branch, an int >= 0) needs a tree."""
    tree = tree_topk is not None or tree_tokens is not None
    topk = tree_topk if tree_topk is not None else min(8, draft_vocab)
    pool = topk + (depth - 1) * topk * topk if isinstance(topk, int) else 0
    tokens = tree_tokens if tree_tokens is not None else min(64, pool)
    if tree and (not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= draft_vocab):
        raise ValueError(f"tree topk={topk!r}; expected an int in 1 .. {draft_vocab} (the draft vocabulary)")
    if tree and (not isinstance(tokens, int) or isinstance(tokens, bool) or not 1 <= tokens <= pool):
        raise ValueError(f"tree tokens={tokens!r}; expected an int in 1 .. {pool} (topk {topk} at depth {depth} drafts {pool} candidates)")
    if tree_lookup and not tree:
        raise ValueError(f"tree_lookup={tree_lookup}: prompt lookup's branch joins a tree; give --tree-topk/--tree-tokens too")
    if not isinstance(tree_lookup, int) or isinstance(tree_lookup, bool) or tree_lookup < 0:
        raise ValueError(f"tree_lookup={tree_lookup!r}; expected an int >= 0 (0: no prompt-lookup branch)")
    return tree, topk, tokens
