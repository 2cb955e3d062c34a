"""Re-rooting after a verification: walk the emitted tokens and keep the new root's subtree."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from swiftspec.tree.tree import TokenTree, descendants


@dataclass(frozen=True, slots=True, eq=False)
class Reroot:
    """How the old tree maps onto the verified prefix and the next tree."""

    path: Tensor  # [m] int64 old indices that became verified prefix: old root, then matches
    tree: TokenTree | None  # subtree at the last emitted token; None when the walk left the tree
    index_map: Tensor  # [N_old] int64 old -> new index, -1 for dropped nodes


def reroot(tree: TokenTree, emitted: list[int] | Tensor) -> Reroot:
    """Follow `emitted` (accepted tokens, then the bonus/recovered one) down from the root.

    `path` holds the old root and the nodes of emitted[:-1] that the walk matched (all of
    them unless the walk left the tree early). When the last emitted token is a node, its
    subtree becomes the new tree: relative order kept, weights shifted so the root has 0.
    Syncs once (host walk).
    """
    tokens = emitted.tolist() if isinstance(emitted, Tensor) else list(emitted)
    if not tokens:
        raise ValueError("reroot needs at least one emitted token")
    child_of = {(p, t): i for i, (p, t) in enumerate(zip(tree.parents.tolist(), tree.tokens.tolist()))}
    walk = [0]
    for token in tokens:
        node = child_of.get((walk[-1], token))
        if node is None:
            break
        walk.append(node)
    device = tree.tokens.device
    dropped = torch.full((len(tree),), -1, dtype=torch.int64, device=device)
    if len(walk) <= len(tokens):  # some emitted token has no node
        return Reroot(path=torch.tensor(walk, device=device), tree=None, index_map=dropped)
    root = walk[-1]
    nodes = descendants(tree, root).nonzero().squeeze(-1)  # root's descendants, ascending
    index_map = dropped.index_put((nodes,), torch.arange(nodes.shape[0], device=device))
    parents = tree.parents[nodes]
    is_root = nodes == root
    new = TokenTree(
        tokens=tree.tokens[nodes],
        parents=torch.where(is_root, -1, index_map[parents.clamp_min(0)]),
        logprobs=tree.logprobs[nodes].masked_fill(is_root, 0.0),
        weights=tree.weights[nodes] - tree.weights[root],
        expanded=tree.expanded[nodes],
    )
    return Reroot(path=torch.tensor(walk[:-1], device=device), tree=new, index_map=index_map)
