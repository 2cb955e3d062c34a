"""TokenTree, the one tree type, plus the structure derived from it (depth, masks, sibling links).

Invariant: node 0 is the root (parent -1) and every parent index is smaller than its child's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True, slots=True, eq=False)
class TokenTree:
    """Draft proposals hanging off the last verified token (the root, index 0)."""

    tokens: Tensor  # [N] int64
    parents: Tensor  # [N] int64; parents[0] == -1, parents[i] < i
    logprobs: Tensor  # [N] float32; draft log-prob of the token given its parent (root: 0)
    weights: Tensor  # [N] float32; sum of logprobs from the root (root: 0)
    expanded: Tensor  # [N] bool; the draft already computed this node's next-token distribution

    def __post_init__(self) -> None:
        n = self.tokens.shape
        fields = (self.tokens, self.parents, self.logprobs, self.weights, self.expanded)
        if len(n) != 1 or n[0] < 1 or any(f.shape != n for f in fields):
            raise ValueError("TokenTree fields must be 1-D tensors of one length >= 1")
        dtypes = (torch.int64, torch.int64, torch.float32, torch.float32, torch.bool)
        if any(f.dtype != d for f, d in zip(fields, dtypes)):
            raise ValueError("TokenTree dtypes are int64, int64, float32, float32, bool")

    def __len__(self) -> int:
        return self.tokens.shape[0]


def new_tree(root_token: int, device: torch.device | str = "cpu") -> TokenTree:
    """A tree holding only its root: one unexpanded node."""
    return TokenTree(
        tokens=torch.tensor([root_token], dtype=torch.int64, device=device),
        parents=torch.tensor([-1], dtype=torch.int64, device=device),
        logprobs=torch.zeros(1, dtype=torch.float32, device=device),
        weights=torch.zeros(1, dtype=torch.float32, device=device),
        expanded=torch.zeros(1, dtype=torch.bool, device=device),
    )


def _jumps(num_nodes: int) -> int:
    """Pointer-jumping rounds needed to cover paths of num_nodes - 1 edges (a static count)."""
    return max(num_nodes - 2, 0).bit_length()


def _full_jumps(num_nodes: int) -> int:
    """Pointer-jumping rounds from a node alone (0 edges) to its whole root path (num_nodes - 1 edges)."""
    return max(num_nodes - 1, 0).bit_length()


def depths_from_parents(parents: Tensor) -> Tensor:
    """Depth of every node (root 0): parents [..., N] -> [..., N] int64, no host sync."""
    depth = (parents >= 0).long()  # distance from each node to `up`
    up = parents.clamp_min(0)  # the root points at itself
    for _ in range(_jumps(parents.shape[-1])):
        depth = depth + depth.gather(-1, up)
        up = up.gather(-1, up)
    return depth


def _along_paths(parents: Tensor, values: Tensor, combine, rounds: int) -> Tensor:
    """values [N] folded along root paths by pointer jumping: each round, node i combines its value
    with that of its 2^j-th ancestor, so after `rounds` rounds it covers itself and its ancestors
    up to 2^rounds - 1 edges up (combine must treat those segments as disjoint, or be idempotent).
    No host sync."""
    up = parents.clone()  # each node's 2^j-th ancestor, -1 past the root
    for _ in range(rounds):
        above = up >= 0
        values = torch.where(above, combine(values, values.gather(-1, up.clamp_min(0))), values)
        up = torch.where(above, up.gather(-1, up.clamp_min(0)), -1)
    return values


def path_weights(parents: Tensor, logprobs: Tensor) -> Tensor:
    """Sum of logprobs [N] from the root to every node (root included): [N] float32, no host sync.
    (_jumps rounds leave out at most the root, whose log-prob is 0.)"""
    return _along_paths(parents, logprobs.float(), torch.add, _jumps(parents.shape[-1]))


def mask_from_parents(parents: Tensor) -> Tensor:
    """Ancestor-or-self relation: parents [..., N] -> [..., N, N] bool, row i marks i's path."""
    n = parents.shape[-1]
    up = parents.clamp_min(0)
    mask = torch.eye(n, dtype=torch.bool, device=parents.device).expand(*parents.shape, n)
    mask = mask | torch.nn.functional.one_hot(up, n).bool()  # rows cover paths of 1 edge
    for _ in range(_jumps(n)):
        # Row i gains the row of its 2^j-th ancestor: coverage doubles each round.
        mask = mask | mask.gather(-2, up.unsqueeze(-1).expand(*up.shape, n))
        up = up.gather(-1, up)
    return mask


def sibling_links(parents: Tensor) -> tuple[Tensor, Tensor]:
    """First child and next sibling (by index) of every node, -1 where none.

    parents [..., N] -> (first_child [..., N], next_sibling [..., N]), both int64.
    """
    n = parents.shape[-1]
    index = torch.arange(n, device=parents.device)
    none = torch.full_like(parents, n)
    is_child = parents.unsqueeze(-2) == index.unsqueeze(-1)  # [..., parent, child]
    first = torch.where(is_child, index, none.unsqueeze(-1)).amin(-1)
    later = (index.unsqueeze(-1) < index) & (parents.unsqueeze(-1) == parents.unsqueeze(-2))
    nxt = torch.where(later, index, none.unsqueeze(-1)).amin(-1)
    return first.masked_fill(first == n, -1), nxt.masked_fill(nxt == n, -1)


def depths(tree: TokenTree) -> Tensor:
    """[N] int64 depth of each node; the root has depth 0."""
    return depths_from_parents(tree.parents)


def positions(tree: TokenTree, prefix_len: int) -> Tensor:
    """[N] int64 sequence position of each node: the root sits at prefix_len."""
    return depths(tree) + prefix_len


def path_to(tree: TokenTree, node: int) -> Tensor:
    """Indices root .. node (inclusive), int64. Walks on the host."""
    parents = tree.parents.tolist()
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return torch.tensor(path[::-1], dtype=torch.int64, device=tree.parents.device)


def path_key(tree: TokenTree) -> Tensor:
    """[N] float32: the smallest weight on each node's root path.  It never grows from parent to
    child (even with float ties or log-probs above 0), so ranking by it, ties to the lower index,
    lists every node after its ancestors.  Pointer jumping over [N] vectors (no [N, N] mask)."""
    return _along_paths(tree.parents, tree.weights, torch.minimum, _full_jumps(len(tree)))


def descendants(tree: TokenTree, node: int) -> Tensor:
    """[N] bool: True at `node` and at every node below it.  Pointer jumping, no host sync."""
    node_alone = torch.arange(len(tree), device=tree.parents.device) == node
    return _along_paths(tree.parents, node_alone, torch.logical_or, _full_jumps(len(tree)))


def ancestor_rows(tree: TokenTree, nodes: Tensor) -> Tensor:
    """mask_from_parents(tree.parents)[nodes] without the [N, N] mask: [w, N] bool, row i True at nodes[i]
    and its ancestors.  Node j is one iff it lies depth(nodes[i]) - depth(j) >= 0 steps up from
    nodes[i]; that many steps are taken by binary lifting (no host sync)."""
    n = len(tree)
    depth = depths(tree)  # [N]
    steps = depth[nodes].unsqueeze(-1) - depth  # [w, N]
    at = nodes.unsqueeze(-1).expand(steps.shape)  # [w, N]: where the walk up from nodes[i] is
    lift = tree.parents.clamp_min(0)  # each node's 2^k-th ancestor (the root stays put)
    for k in range(_full_jumps(n)):
        at = torch.where((steps >> k) & 1 == 1, lift[at], at)
        lift = lift.gather(-1, lift)
    return (steps >= 0) & (at == torch.arange(n, device=nodes.device))
