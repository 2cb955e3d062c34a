"""Grafted branches: merging with equal siblings, budgets, path weights, growth over grafted nodes."""

from __future__ import annotations

import math
import random

import torch

from swiftspec.tree import (
    graft,
    grow,
    new_tree,
    path_weights,
    reroot,
    select_leaves,
    select_subtree,
)


def _tensors(parents, tokens, logprobs):
    return (torch.tensor(parents, dtype=torch.int64), torch.tensor(tokens, dtype=torch.int64),
            torch.tensor(logprobs, dtype=torch.float32))


def _grown():
    """root(0) -> children 5 (-0.2), 6 (-1.0); 5 expanded -> 7 (-0.5)."""
    tree = grow(new_tree(1), torch.tensor([0]), torch.tensor([[5, 6]]), torch.tensor([[-0.2, -1.0]]), 64)
    return grow(tree, torch.tensor([1]), torch.tensor([[7]]), torch.tensor([[-0.5]]), 64)


def test_path_weights_match_a_walk() -> None:
    rng = random.Random(0)
    for _ in range(50):
        n = rng.randint(1, 40)
        parents = [-1] + [rng.randrange(i) for i in range(1, n)]
        logprobs = [0.0] + [-rng.random() for _ in range(1, n)]
        want = []
        for i in range(n):
            want.append(logprobs[i] + (want[parents[i]] if parents[i] >= 0 else 0.0))
        got = path_weights(torch.tensor(parents), torch.tensor(logprobs))
        assert torch.allclose(got, torch.tensor(want), atol=1e-5)


def test_graft_appends_a_chain_and_merges_an_equal_child() -> None:
    tree = _grown()
    n = len(tree)
    # chain 5 -> 7 -> 9 at the root: 5 and 7 exist (merge), 9 is new
    result = graft(tree, *_tensors([0, n, n + 1], [5, 7, 9], [math.log(0.9), math.log(0.5), math.log(0.4)]), 64)
    assert result.nodes.tolist() == [1, 3, n]
    grown = result.tree
    assert len(grown) == n + 1 and grown.tokens[-1] == 9 and grown.parents[-1] == 3 and not grown.expanded[-1]
    assert grown.logprobs[1] == torch.tensor(math.log(0.9))  # raised: the larger of -0.2 and log 0.9
    assert grown.logprobs[3] == torch.tensor(-0.5)  # kept: -0.5 beats log 0.5
    assert torch.allclose(grown.weights, path_weights(grown.parents, grown.logprobs))
    assert grown.expanded[:n].tolist() == tree.expanded.tolist()


def test_graft_respects_the_budget_and_drops_orphans() -> None:
    tree = new_tree(1)
    result = graft(tree, *_tensors([0, 1, 2, 0], [4, 5, 6, 7], [-0.1, -0.1, -0.1, -0.2]), budget=3)
    assert result.nodes.tolist() == [1, 2, -1, -1]
    assert len(result.tree) == 3
    orphan = graft(tree, *_tensors([0, 1], [4, 5], [-0.1, -0.1]), budget=1)
    assert orphan.nodes.tolist() == [-1, -1] and len(orphan.tree) == 1


def test_grow_merges_children_that_equal_grafted_ones() -> None:
    tree = graft(new_tree(1), *_tensors([0, 1], [5, 6], [math.log(0.3), math.log(0.8)]), 64).tree  # root: 5 -> 6
    leaves = select_leaves(tree, 8)
    assert leaves.tolist() == [0, 1, 2]  # the grafted chain from the top, in one forward
    children = torch.tensor([[5, 8], [6, 9], [3, 4]])
    logprobs = torch.tensor([[-0.1, -2.0], [-1.0, -0.3], [-0.5, -0.6]])
    grown = grow(tree, leaves, children, logprobs, 64, merge=True)
    assert len(grown) == 3 + 4  # 5 under the root and 6 under 5 merged
    assert grown.logprobs[1] == torch.tensor(-0.1) and grown.logprobs[2] == torch.tensor(math.log(0.8))
    assert grown.expanded[:3].all() and not grown.expanded[3:].any()
    pairs = list(zip(grown.parents.tolist(), grown.tokens.tolist()))
    assert len(pairs) == len(set(pairs))  # siblings distinct
    assert torch.allclose(grown.weights, path_weights(grown.parents, grown.logprobs))


def test_leaves_are_picked_ancestors_first_under_float_ties() -> None:
    """A grafted chain of log-prob 0 ties its parent; the parent still comes first."""
    tree = graft(new_tree(1), *_tensors([0, 1, 2], [5, 6, 7], [0.0, 0.0, 0.0]), 64).tree
    for width in (1, 2, 3, 4):
        assert select_leaves(tree, width).tolist() == list(range(min(width, 4)))


def test_mixed_tree_selects_and_reroots() -> None:
    tree = _grown()
    tree = graft(tree, *_tensors([0, len(tree)], [11, 12], [math.log(0.95), math.log(0.9)]), 64).tree
    assert select_subtree(tree, 3).tokens.tolist() == [1, 11, 12]  # 0.95, 0.95 * 0.9 beat the draft's e^-0.2
    assert select_subtree(tree, 4).tokens.tolist() == [1, 5, 11, 12]
    step = reroot(tree, [11, 12])
    assert step.tree is not None and step.tree.tokens.tolist() == [12]
    assert step.path.tolist() == [0, len(tree) - 2]
