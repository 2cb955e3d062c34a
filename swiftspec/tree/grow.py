"""Parallel tree growth: pick the w best unexpanded leaves, then append their children.

Growth does not care how the child distributions were computed (draft model, test table).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from swiftspec.tree.tree import TokenTree, path_key, path_weights


def select_leaves(tree: TokenTree, width: int, focus: int = 0, min_weight: float = -math.inf) -> Tensor:
    """Indices [<= width] of the best unexpanded nodes, ties to the lower index.

    Nodes rank by the smallest weight on their root path (select_subtree's key: the weight itself
    while log-probs are <= 0), which never grows from parent to child, so an unexpanded node is
    always picked no later than its descendants: a grafted chain is expanded from the top, and a
    leaf's ancestors all have KV by the end of its forward.
    Best first. Syncs once to drop expanded nodes when fewer than `width` are unexpanded.
    focus > 0 also drops the leaves ranked below the focus-th node: nothing below such a leaf
    can join select_subtree(tree, focus), whatever is grown later (log-probs <= 0).  The serial
    engine, which verifies that subtree right after drafting, spends no draft rows on them; it
    gets no leaf at all once the subtree is final.  Leaves whose key is below min_weight (a
    log-probability) are dropped too.
    """
    key = path_key(tree)  # [N]
    ranked = key.sort(descending=True, stable=True)  # index order on ties
    by_weight = ranked.indices
    unexpanded_first = tree.expanded[by_weight].to(torch.uint8).sort(stable=True).indices
    best = by_weight[unexpanded_first][:width]
    weights = key[best]  # [<= width]
    keep = ~tree.expanded[best] & (weights >= min_weight)
    if 0 < focus <= by_weight.numel():
        keep &= weights >= ranked.values[focus - 1]
    return best[keep]


def topk_children(logprobs: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Deterministic drafting: the k most likely tokens of each row.

    logprobs [w, V] -> (tokens [w, k] int64, logprobs [w, k] float32); distinct per row.
    """
    top = logprobs.float().topk(k, dim=-1)
    return top.indices, top.values


def coupled_children(logprobs: Tensor, k: int, drawn: Tensor, chance: float) -> tuple[Tensor, Tensor]:
    """topk_children with each row's own draw in first place: drawn [w] int64 is the token the
    draft draws at the uniform the target will draw its token with (sampling.Draws), so where the
    draft's distribution is close to the target's it is the target's token, likely or not.  Its
    log-prob is the larger of the row's largest and log(chance) (how often such a draw is the
    target's), and the others' are scaled by 1 - chance (a sibling is the target's token only where
    the draw is not); where the draw is not among the k most likely it replaces the k-th.

    logprobs [w, V] -> (tokens [w, k] int64, logprobs [w, k] float32); distinct per row."""
    top = logprobs.float().topk(k, dim=-1)  # [w, k], descending
    others = top.indices != drawn[:, None]  # [w, k]
    # the k - 1 most likely tokens other than the draw, in top-k order
    order = others.to(torch.int8).sort(dim=-1, descending=True, stable=True).indices[:, : k - 1]  # [w, k - 1]
    tokens = torch.cat([drawn[:, None], top.indices.gather(-1, order)], dim=-1)  # [w, k]
    first = top.values[:, :1].clamp_min(math.log(chance) if chance > 0 else -math.inf)  # [w, 1]
    # a sibling is the target's token only where the draw is not: weigh it by that chance too
    others = top.values.gather(-1, order) + math.log1p(-chance)  # [w, k - 1]
    return tokens, torch.cat([first, others], dim=-1)


def sample_children(probs: Tensor, k: int, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """Sampled drafting: k distinct tokens per row drawn without replacement from probs [w, V].

    Returns (tokens [w, k] int64, logprobs [w, k] float32) in draw order (exponential race,
    i.e. Gumbel-top-k): child j was drawn from probs with children 0..j-1 removed, which is
    what verify_stochastic(deterministic=False) assumes. Rows need k tokens of nonzero mass.
    """
    race = torch.empty(probs.shape, dtype=torch.float32, device=probs.device)
    race.exponential_(generator=generator).clamp_min_(torch.finfo(torch.float32).tiny)
    tokens = (probs.float() / race).topk(k, dim=-1).indices
    return tokens, probs.float().gather(-1, tokens).log()


def grow(
    tree: TokenTree,
    leaves: Tensor,  # [w] int64, unexpanded nodes of `tree`
    child_tokens: Tensor,  # [w, k] int64, distinct within a row
    child_logprobs: Tensor,  # [w, k] float32, log-prob of each child given its leaf
    budget: int,
    merge: bool = False,
) -> TokenTree:
    """Mark `leaves` expanded and append their children, never exceeding `budget` nodes.

    A child's weight is its leaf's weight plus its log-prob. When not all children fit, the
    best by weight are kept (ties to the lower leaf-major position), appended leaf-major.
    merge: a leaf may already have children (grafted candidates); a child equal to one of them
    is not appended but raises that node's log-prob to the larger of the two (weights are then
    recomputed as path sums), so siblings stay distinct.  One host sync.
    """
    n = len(tree)
    if budget < n:
        raise ValueError(f"tree already holds {n} nodes, more than the budget {budget}")
    expanded = tree.expanded.clone()
    expanded[leaves] = True
    logprobs = child_logprobs.float().reshape(-1)  # [w * k], leaf-major
    parents = leaves.unsqueeze(-1).expand(child_tokens.shape).reshape(-1)
    tokens = child_tokens.reshape(-1)
    old_logprobs = tree.logprobs
    if merge:
        same = (parents.unsqueeze(-1) == tree.parents) & (tokens.unsqueeze(-1) == tree.tokens)  # [w * k, N]
        found = same.any(-1)
        old_logprobs = old_logprobs.scatter_reduce(0, same.int().argmax(-1)[found], logprobs[found], "amax")
        tokens, parents, logprobs = tokens[~found], parents[~found], logprobs[~found]
    weights = tree.weights[parents] + logprobs
    room = budget - n
    if tokens.shape[0] > room:
        keep = weights.sort(descending=True, stable=True).indices[:room].sort().values
        tokens, parents, logprobs, weights = tokens[keep], parents[keep], logprobs[keep], weights[keep]
    # Every new parent is an old node, so appending keeps parent < child.
    all_parents = torch.cat([tree.parents, parents])
    all_logprobs = torch.cat([old_logprobs, logprobs])
    return TokenTree(
        tokens=torch.cat([tree.tokens, tokens]),
        parents=all_parents,
        logprobs=all_logprobs,
        weights=path_weights(all_parents, all_logprobs) if merge else torch.cat([tree.weights, weights]),
        expanded=torch.cat([expanded, torch.zeros_like(tokens, dtype=torch.bool)]),
    )
