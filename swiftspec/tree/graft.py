"""Grafting branches that no draft forward proposed (prompt-lookup candidates) onto a token tree.

A grafted node is an ordinary unexpanded node: its log-prob is a calibrated estimate of the chance
that the target's next token after its parent is its token, so it competes with the draft's nodes
for the verified subtree by weight.  Siblings stay distinct: a candidate equal to an existing
child of its parent merges with it, which keeps the larger of the two log-probs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from swiftspec.tree.tree import TokenTree, path_weights


@dataclass(frozen=True, slots=True, eq=False)
class Graft:
    """The grown tree and where each candidate went."""

    tree: TokenTree
    nodes: Tensor  # [m] int64 tree index of each candidate (appended or merged), -1 where it did not fit


def reweight(tree: TokenTree, nodes: list[int], logprobs: list[float]) -> TokenTree:
    """The tree with new log-probs at `nodes` (the weights recomputed as path sums)."""
    index = torch.tensor(nodes, dtype=torch.int64, device=tree.tokens.device)
    values = torch.tensor(logprobs, dtype=torch.float32, device=tree.tokens.device)
    new = tree.logprobs.index_put((index,), values)
    return TokenTree(tokens=tree.tokens, parents=tree.parents, logprobs=new,
                     weights=path_weights(tree.parents, new), expanded=tree.expanded)


def graft(
    tree: TokenTree,
    parents: Tensor,  # [m] int64: a tree index (< N), or N + j for candidate j < i
    tokens: Tensor,  # [m] int64
    logprobs: Tensor,  # [m] float32 <= 0: log-prob of each token given its parent
    budget: int,
) -> Graft:
    """Add the candidates in order, merging each with an equal child of its parent, appending the
    others while the tree holds fewer than `budget` nodes (a candidate whose parent did not fit is
    dropped too).  Appended nodes are unexpanded; weights are recomputed as path sums.  One host
    sync (the tree's structure is read on the host)."""
    n = len(tree)
    child_of = {(p, t): i for i, (p, t) in enumerate(zip(tree.parents.tolist(), tree.tokens.tolist()))}
    node_lp = tree.logprobs.tolist()
    placed: list[int] = []
    new_parents: list[int] = []
    new_tokens: list[int] = []
    for p, t, lp in zip(parents.tolist(), tokens.tolist(), logprobs.tolist()):
        parent = p if p < n else placed[p - n]
        node = child_of.get((parent, t), -1) if parent >= 0 else -1
        if node < 0 and parent >= 0 and n + len(new_tokens) < budget:
            node = n + len(new_tokens)
            child_of[(parent, t)] = node
            new_parents.append(parent)
            new_tokens.append(t)
            node_lp.append(lp)
        elif node >= 0:
            node_lp[node] = max(node_lp[node], lp)
        placed.append(node)
    device = tree.tokens.device
    added = len(new_tokens)
    all_parents = torch.cat([tree.parents, torch.tensor(new_parents, dtype=torch.int64, device=device)])
    all_logprobs = torch.tensor(node_lp, dtype=torch.float32, device=device)  # [N + added]
    grown = TokenTree(
        tokens=torch.cat([tree.tokens, torch.tensor(new_tokens, dtype=torch.int64, device=device)]),
        parents=all_parents,
        logprobs=all_logprobs,
        weights=path_weights(all_parents, all_logprobs),
        expanded=torch.cat([tree.expanded, torch.zeros(added, dtype=torch.bool, device=device)]),
    )
    return Graft(tree=grown, nodes=torch.tensor(placed, dtype=torch.int64, device=device))
