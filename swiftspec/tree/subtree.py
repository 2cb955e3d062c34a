"""What leaves the tree: the best-bs subtree for the target (or the part of it that repays its
verification), and the draft's non-square mask."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from swiftspec.tree.tree import TokenTree, ancestor_rows, mask_from_parents, path_key


@dataclass(frozen=True, slots=True, eq=False)
class Subtree:
    """An ancestor-closed set of tree nodes containing the root, in local indexing."""

    nodes: Tensor  # [n] int64 tree indices, ascending (root first)
    tokens: Tensor  # [n] int64
    parents: Tensor  # [n] int64 local indices; -1 for the root
    depths: Tensor  # [n] int64; root 0
    mask: Tensor  # [n, n] bool; row i marks i and its ancestors


def select_subtree(tree: TokenTree, size: int, costs: Tensor | None = None, spent_s: float = 0.0,
                   trust: float = 1.0) -> Subtree:
    """The `size` best nodes by weight (root always in), as a Subtree (no host sync).

    Nodes are ranked by the smallest weight on their root path, ties to the lower index. That
    key never grows from parent to child and a parent's index is lower, so the chosen set is
    ancestor-closed even with float ties or log-probs above 0. With log-probs <= 0 the key is
    the weight, and the set has the largest total weight of any ancestor-closed set its size.

    costs [size] (seconds; costs[n - 1] verifies n nodes): keep only the first best_size() nodes
    of the ranking, the ones that repay their verification (trust: see best_size); one host
    sync (the kept count).
    """
    if size < 1:
        raise ValueError(f"a subtree holds at least the root, got size {size}")
    ranked = path_key(tree).sort(descending=True, stable=True)
    nodes = ranked.indices[:size]  # [n] best first
    if costs is not None:
        n = nodes.shape[0]
        keep = torch.arange(n, device=nodes.device) < best_size(ranked.values[:n], costs[:n], spent_s, trust)
        nodes = nodes[keep]
    nodes = nodes.sort().values
    local = torch.full_like(tree.parents, -1)
    local[nodes] = torch.arange(nodes.shape[0], device=nodes.device)
    parents = tree.parents[nodes]
    parents = torch.where(parents >= 0, local[parents.clamp_min(0)], parents)  # [n] local
    sub_mask = mask_from_parents(parents)  # [n, n]: the set is ancestor-closed
    return Subtree(
        nodes=nodes,
        tokens=tree.tokens[nodes],
        parents=parents,
        depths=sub_mask.sum(-1) - 1,
        mask=sub_mask,
    )


def best_size(ranked: Tensor, costs: Tensor, spent_s: float, trust: float = 1.0) -> Tensor:
    """How many of the ranked nodes to verify: the n that maximizes the round's expected tokens per
    second, (1 + trust * sum of the n - 1 best non-root path probabilities) / (spent_s + costs[n - 1]).

    ranked [m] float32: the ranking's keys, best first (the root's 0 first; the others are log
    path probabilities); costs [m] float: seconds to verify 1..m nodes; spent_s: the round's
    other time (drafting, bookkeeping).  Under the draft's own probabilities a node is accepted
    with its path probability, and a round emits the accepted nodes and one more token, so a
    node is worth its row only while its probability outweighs the time the row adds.  trust in
    (0, 1] scales those probabilities where they have been accepted less often than they promise
    (RoundCosts.trust).  Returns a 0-d int64 tensor in [1, m] (the smallest n on ties)."""
    gain = 1 + trust * (ranked.exp().cumsum(0) - 1)  # [m]: expected tokens of the first 1..m nodes (root: 1)
    rate = gain / (spent_s + costs.to(gain.device, gain.dtype))  # [m]
    return rate.argmax() + 1


def draft_mask(
    tree: TokenTree,
    leaves: Tensor,  # [w] int64 nodes the draft expands in this forward
    node_slot: Tensor,  # [N] int64 KV-cache slot of each node, -1 where it has none
    prefix_len: int,
    width: int,
) -> Tensor:
    """Attention mask [w, width] bool for one draft forward over `leaves`. No host sync.

    Row i sees every slot below prefix_len (the verified prefix) and the slots of leaf i and
    of its ancestors. Slots must lie below `width`; unused columns stay False (static shape).
    """
    paths = ancestor_rows(tree, leaves) & (node_slot >= 0)  # [w, N]
    columns = torch.where(paths, node_slot, width)  # `width` is a scratch column
    mask = torch.zeros(leaves.shape[0], width + 1, dtype=torch.bool, device=leaves.device)
    mask.scatter_(1, columns, True)
    mask[:, :prefix_len] = True
    return mask[:, :width]
