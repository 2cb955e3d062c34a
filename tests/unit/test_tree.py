"""TokenTree invariants, growth, subtree selection, draft masks and re-rooting on random trees."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from swiftspec.tree import (
    TokenTree,
    ancestor_rows,
    best_size,
    coupled_children,
    depths,
    descendants,
    draft_mask,
    grow,
    mask_from_parents,
    new_tree,
    path_key,
    path_to,
    positions,
    reroot,
    sample_children,
    select_leaves,
    select_subtree,
    sibling_links,
    topk_children,
)

FAST = settings(max_examples=50, deadline=None)
VOCAB = 16
LOGPROB = st.sampled_from([0.0, -0.5, -1.0, -2.0]) | st.floats(-6.0, 0.0, width=32)


pytestmark = pytest.mark.usefixtures("one_thread")


@st.composite
def trees(draw, max_nodes: int = 10, monotone: bool = True) -> TokenTree:
    """Random trees; sibling tokens distinct; weights are float32 sums of log-probs <= 0
    (monotone) or arbitrary floats (to check robustness)."""
    n = draw(st.integers(1, max_nodes))
    parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    tokens, taken = [draw(st.integers(0, VOCAB - 1))], {}
    for i in range(1, n):
        token, used = draw(st.integers(0, VOCAB - 1)), taken.setdefault(parents[i], set())
        while token in used:
            token = (token + 1) % VOCAB
        used.add(token)
        tokens.append(token)
    logprobs = torch.tensor([0.0] + [draw(LOGPROB if monotone else st.floats(-3, 3, width=32)) for _ in range(1, n)])
    weights = torch.zeros(n)
    for i in range(1, n):
        weights[i] = weights[parents[i]] + logprobs[i]
    return TokenTree(tokens=torch.tensor(tokens), parents=torch.tensor(parents), logprobs=logprobs,
                     weights=weights, expanded=torch.tensor(draw(st.lists(st.booleans(), min_size=n, max_size=n))))


def _ancestors(parents: list[int], i: int) -> set[int]:
    """i and its ancestors, walking parents one by one."""
    found = {i}
    while parents[i] >= 0:
        i = parents[i]
        found.add(i)
    return found


def _assert_well_formed(tree: TokenTree) -> None:
    parents, tokens = tree.parents.tolist(), tree.tokens.tolist()
    assert parents[0] == -1 and all(0 <= p < i for i, p in enumerate(parents) if i)
    pairs = list(zip(parents, tokens))
    assert len(set(pairs)) == len(pairs), "children of one parent must have distinct tokens"


@FAST
@given(tree=trees(), prefix_len=st.integers(0, 50))
def test_derived_structure_matches_naive(tree, prefix_len):
    _assert_well_formed(tree)
    parents, n = tree.parents.tolist(), len(tree)
    naive = torch.tensor([[j in _ancestors(parents, i) for j in range(n)] for i in range(n)])
    assert torch.equal(mask_from_parents(tree.parents), naive)
    naive_depths = torch.tensor([len(_ancestors(parents, i)) - 1 for i in range(n)])
    assert torch.equal(depths(tree), naive_depths)
    assert torch.equal(positions(tree, prefix_len), naive_depths + prefix_len)
    for i in range(n):
        assert path_to(tree, i).tolist() == sorted(_ancestors(parents, i))
    first, following = sibling_links(tree.parents)
    for i in range(n):
        kids = [j for j in range(n) if parents[j] == i]
        later = [j for j in range(i + 1, n) if parents[j] == parents[i] and i > 0]
        assert first[i] == (kids[0] if kids else -1) and following[i] == (later[0] if later else -1)


@FAST
@given(tree=trees(max_nodes=17, monotone=False), data=st.data())  # <= VOCAB children per node
def test_pointer_jumping_equals_the_ancestor_mask(tree, data):
    """path_key, descendants and ancestor_rows (vectors, no [N, N] mask) give what the mask gives."""
    mask, n = mask_from_parents(tree.parents), len(tree)
    assert torch.equal(path_key(tree), torch.where(mask, tree.weights, torch.tensor(float("inf"))).amin(-1))
    node = data.draw(st.integers(0, n - 1))
    assert torch.equal(descendants(tree, node), mask[:, node])
    nodes = torch.tensor(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=8)))
    assert torch.equal(ancestor_rows(tree, nodes), mask[nodes])


def test_pointer_jumping_covers_a_chain():
    """A chain of 2^k + 1 nodes needs every jump: the deepest node sees the root."""
    for n in (2, 3, 5, 9, 17, 33):
        parents = torch.arange(-1, n - 1)
        weights = torch.cat([torch.tensor([-5.0]), torch.zeros(n - 1)])  # the root holds the minimum
        tree = TokenTree(tokens=torch.zeros(n, dtype=torch.int64), parents=parents, logprobs=weights.clone(),
                         weights=weights, expanded=torch.zeros(n, dtype=torch.bool))
        assert path_key(tree).eq(-5.0).all()
        assert descendants(tree, 0).all()
        assert ancestor_rows(tree, torch.tensor([n - 1])).all()


@FAST
@given(data=st.data(), n=st.integers(1, 9))
def test_batched_mask_equals_per_tree(data, n):
    batch = [[-1] + [data.draw(st.integers(0, i - 1)) for i in range(1, n)] for _ in range(3)]
    masks = mask_from_parents(torch.tensor(batch))
    for b, parents in enumerate(batch):
        assert torch.equal(masks[b], mask_from_parents(torch.tensor(parents)))


def test_new_tree_and_validation():
    tree = new_tree(7)
    assert tree.tokens.tolist() == [7] and tree.parents.tolist() == [-1] and len(tree) == 1
    assert tree.weights.tolist() == [0.0] and tree.expanded.tolist() == [False]
    assert select_leaves(tree, 4).tolist() == [0]
    with pytest.raises(ValueError):
        TokenTree(tokens=tree.tokens, parents=tree.parents.int(), logprobs=tree.logprobs,
                  weights=tree.weights, expanded=tree.expanded)
    with pytest.raises(ValueError):
        TokenTree(tokens=tree.tokens.repeat(2), parents=tree.parents, logprobs=tree.logprobs,
                  weights=tree.weights, expanded=tree.expanded)


@FAST
@given(tree=trees(), width=st.integers(1, 5))
def test_select_leaves_takes_best_unexpanded(tree, width):
    weights, expanded = tree.weights.tolist(), tree.expanded.tolist()
    naive = sorted((i for i in range(len(tree)) if not expanded[i]), key=lambda i: (-weights[i], i))
    assert select_leaves(tree, width).tolist() == naive[:width]


def _check_growth_step(old: TokenTree, new: TokenTree, leaves: list[int], tokens, logprobs, budget: int):
    """One grow() step against its contract."""
    n, proposed = len(old), {(leaf, int(t)): float(lp) for leaf, row_t, row_lp in zip(leaves, tokens, logprobs)
                             for t, lp in zip(row_t, row_lp)}
    assert len(new) == min(budget, n + len(proposed))
    for field in ("tokens", "parents", "logprobs", "weights"):
        assert torch.equal(getattr(new, field)[:n], getattr(old, field))
    assert new.expanded[:n].tolist() == [e or i in leaves for i, e in enumerate(old.expanded.tolist())]
    assert not new.expanded[n:].any()
    kept = set()
    for i in range(n, len(new)):
        parent, token = int(new.parents[i]), int(new.tokens[i])
        assert new.logprobs[i] == proposed[(parent, token)]
        assert new.weights[i] == new.weights[parent] + new.logprobs[i]
        kept.add((parent, token))
    dropped = [old.weights[p] + lp for (p, t), lp in proposed.items() if (p, t) not in kept]
    if dropped and len(new) > n:
        assert float(new.weights[n:].min()) >= max(float(w) for w in dropped)


@FAST
@given(seed=st.integers(0, 2**16), width=st.integers(1, 4), k=st.integers(1, 4),
       budget=st.integers(1, 30), steps=st.integers(1, 5))
def test_growth_is_budget_bounded_and_consistent(seed, width, k, budget, steps):
    generator, tree = torch.Generator().manual_seed(seed), new_tree(3)
    for _ in range(steps):
        leaves = select_leaves(tree, width)
        if leaves.numel() == 0:
            break
        # Log-probs on a coarse grid, so weights tie often.
        raw = (torch.randn(leaves.numel(), 8, generator=generator) * 2).round() / 2
        tokens, logprobs = topk_children(raw.log_softmax(-1).mul(2).round().div(2).clamp_max(0.0), k)
        new = grow(tree, leaves, tokens, logprobs, budget)
        _check_growth_step(tree, new, leaves.tolist(), tokens.tolist(), logprobs.tolist(), budget)
        _assert_well_formed(new)
        tree = new
    assert len(tree) <= budget


def test_topk_and_sampled_children_are_distinct():
    probs = torch.softmax(torch.randn(6, 10, generator=torch.Generator().manual_seed(0)), -1)
    tokens, logprobs = topk_children(probs.log(), 4)
    assert torch.equal(logprobs, probs.log().sort(-1, descending=True).values[:, :4])
    probs[:, :3] = 0.0  # 7 tokens keep mass
    drawn, drawn_logprobs = sample_children(probs / probs.sum(-1, keepdim=True), 7, torch.Generator().manual_seed(1))
    assert all(len(set(row)) == 7 and min(row) >= 3 for row in drawn.tolist())
    torch.testing.assert_close(drawn_logprobs, (probs / probs.sum(-1, keepdim=True)).gather(1, drawn).log())
    assert torch.equal(drawn, sample_children(probs, 7, torch.Generator().manual_seed(1))[0])


def _ancestor_closed(parents: list[int], nodes: set[int]) -> bool:
    return all(parents[i] in nodes for i in nodes if i)


@settings(max_examples=60, deadline=None)
@given(tree=trees(max_nodes=9), size=st.integers(1, 10))
def test_subtree_is_best_ancestor_closed_set(tree, size):
    parents, weights, n = tree.parents.tolist(), tree.weights.tolist(), len(tree)
    sub = select_subtree(tree, size)
    nodes = sub.nodes.tolist()
    assert nodes == sorted(nodes) and nodes[0] == 0 and len(nodes) == min(size, n)
    assert _ancestor_closed(parents, set(nodes))
    best = max(sum(weights[i] for i in (0,) + rest)
               for rest in itertools.combinations(range(1, n), len(nodes) - 1)
               if _ancestor_closed(parents, {0, *rest}))
    assert sum(weights[i] for i in nodes) >= best - 1e-4
    assert sub.tokens.tolist() == [tree.tokens[i] for i in nodes]
    assert sub.parents.tolist() == [-1] + [nodes.index(parents[i]) for i in nodes[1:]]
    assert torch.equal(sub.depths, depths(tree)[sub.nodes])
    assert torch.equal(sub.mask, mask_from_parents(tree.parents)[sub.nodes][:, sub.nodes])


@FAST
@given(tree=trees(monotone=False), size=st.integers(1, 10))
def test_subtree_stays_ancestor_closed_for_any_weights(tree, size):
    nodes = select_subtree(tree, size).nodes.tolist()
    assert nodes[0] == 0 and _ancestor_closed(tree.parents.tolist(), set(nodes))


def test_best_size_maximizes_expected_tokens_per_second():
    ranked = torch.tensor([1.0, 0.9, 0.5, 0.1]).log()  # the root, then path probabilities
    # expected tokens 1, 1.9, 2.4, 2.5 over 1.0, 1.1, 1.2, 1.3 s: 2.4 / 1.2 is the best rate
    assert best_size(ranked, torch.tensor([1.0, 1.1, 1.2, 1.3]), 0.0) == 3
    assert best_size(ranked, torch.tensor([1.0, 1.0, 1.0, 1.0]), 0.0) == 4  # free rows: verify all
    assert best_size(ranked, torch.tensor([0.1, 1.0, 2.0, 3.0]), 0.0) == 1  # dear rows: the root alone
    assert best_size(ranked, torch.tensor([0.1, 0.2, 0.3, 0.4]), 5.0) == 4  # a costly draft repays every row


@FAST
@given(tree=trees(max_nodes=9), size=st.integers(1, 10), data=st.data())
def test_subtree_with_costs_is_the_best_prefix_of_the_ranking(tree, size, data):
    m = min(size, len(tree))
    costs = torch.tensor(sorted(data.draw(st.lists(st.floats(0.01, 1.0), min_size=m, max_size=m))))
    spent = data.draw(st.floats(0.0, 1.0))
    sub = select_subtree(tree, size, costs, spent)
    full = select_subtree(tree, size)
    n = sub.nodes.numel()
    assert 1 <= n <= m and torch.equal(sub.nodes, select_subtree(tree, n).nodes)
    ranked = full.nodes[tree.weights[full.nodes].argsort(descending=True, stable=True)]
    gain = tree.weights[ranked].exp().cumsum(0)
    rates = gain / (spent + costs)
    assert rates[n - 1] >= rates.max() - 1e-6


@FAST
@given(tree=trees(), data=st.data(), prefix_len=st.integers(0, 6), extra=st.integers(0, 5))
def test_draft_mask_matches_naive(tree, data, prefix_len, extra):
    n, parents = len(tree), tree.parents.tolist()
    leaves = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))
    order = data.draw(st.permutations(range(n)))
    slots = [prefix_len + order[i] if i in leaves or data.draw(st.booleans()) else -1 for i in range(n)]
    width = prefix_len + n + extra
    mask = draft_mask(tree, torch.tensor(leaves), torch.tensor(slots), prefix_len, width)
    for row, leaf in enumerate(leaves):
        seen = {slots[j] for j in _ancestors(parents, leaf) if slots[j] >= 0}
        assert mask[row].tolist() == [c < prefix_len or c in seen for c in range(width)]


@FAST
@given(tree=trees(), data=st.data())
def test_reroot_keeps_exactly_the_new_roots_subtree(tree, data):
    n, parents, tokens = len(tree), tree.parents.tolist(), tree.tokens.tolist()
    assume(n >= 2)
    root = data.draw(st.integers(1, n - 1))
    walk = sorted(_ancestors(parents, root))
    result = reroot(tree, torch.tensor([tokens[i] for i in walk[1:]]))
    assert result.path.tolist() == walk[:-1]
    kept = [i for i in range(n) if root in _ancestors(parents, i)]
    assert result.index_map.tolist() == [kept.index(i) if i in kept else -1 for i in range(n)]
    new = result.tree
    _assert_well_formed(new)
    assert new.tokens.tolist() == [tokens[i] for i in kept]
    assert new.parents.tolist() == [-1] + [kept.index(parents[i]) for i in kept[1:]]
    assert torch.equal(new.weights, tree.weights[kept] - tree.weights[root])
    assert torch.equal(new.expanded, tree.expanded[kept])
    assert new.logprobs[0] == 0 and torch.equal(new.logprobs[1:], tree.logprobs[kept[1:]])


@FAST
@given(tree=trees(), data=st.data())
def test_reroot_outside_the_tree_asks_for_a_rebuild(tree, data):
    parents, tokens = tree.parents.tolist(), tree.tokens.tolist()
    end = data.draw(st.integers(0, len(tree) - 1))
    walk = sorted(_ancestors(parents, end))
    result = reroot(tree, [tokens[i] for i in walk[1:]] + [VOCAB])  # VOCAB is no node's token
    assert result.tree is None and result.path.tolist() == walk
    assert result.index_map.tolist() == [-1] * len(tree)


def test_tree_functions_need_no_host_sync():
    # Meta tensors carry no data, so any host sync would raise.
    meta = {"device": "meta"}
    ids = torch.zeros(6, dtype=torch.int64, **meta)
    tree = TokenTree(tokens=ids, parents=ids, logprobs=torch.zeros(6, **meta),
                     weights=torch.zeros(6, **meta), expanded=torch.zeros(6, dtype=torch.bool, **meta))
    assert positions(tree, 4).shape == (6,) and mask_from_parents(tree.parents).shape == (6, 6)
    assert select_subtree(tree, 4).mask.shape == (4, 4)
    assert draft_mask(tree, ids[:2], ids, 3, 16).shape == (2, 16)
    assert path_key(tree).shape == (6,) and descendants(tree, 2).shape == (6,)
    children = topk_children(torch.zeros(2, 9, **meta), 3)
    assert len(grow(tree, ids[:2], *children, budget=9)) == 9


def _paths(tree: TokenTree, nodes: list[int]) -> set[tuple[int, ...]]:
    """Nodes as their root-to-node token paths (comparable across differently grown trees)."""
    return {tuple(tree.tokens[path_to(tree, n)].tolist()) for n in nodes}


def _children_of(tree: TokenTree, leaves: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed 'draft' table: a leaf's children depend only on its token path."""
    rows = []
    for leaf in leaves.tolist():
        seed = hash(tuple(tree.tokens[path_to(tree, leaf)].tolist())) % 2**31
        rows.append((torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed)) * 2).log_softmax(-1))
    return topk_children(torch.stack(rows), k)


@FAST
@given(root=st.integers(0, VOCAB - 1), width=st.integers(1, 8), k=st.integers(1, 6),
       size=st.integers(2, 10), steps=st.integers(1, 7))
def test_focus_spends_no_rows_on_leaves_that_cannot_be_verified(root, width, k, size, steps):
    """Growing with focus = size verifies the same subtree as growing without it, from fewer rows."""
    grown, rows = {}, {}
    for focus in (0, size):
        tree, used = new_tree(root), 0
        for _ in range(steps):
            leaves = select_leaves(tree, width, focus)
            if leaves.numel() == 0:
                break
            tokens, logprobs = _children_of(tree, leaves, k)
            tree, used = grow(tree, leaves, tokens, logprobs, 10_000), used + leaves.numel()
        grown[focus], rows[focus] = tree, used
    plain, focused = grown[0], grown[size]
    assert _paths(plain, select_subtree(plain, size).nodes.tolist()) == \
        _paths(focused, select_subtree(focused, size).nodes.tolist())
    assert rows[size] <= rows[0]


def test_select_leaves_skips_leaves_below_min_weight():
    tree = grow(new_tree(1), torch.tensor([0]), torch.tensor([[4, 5, 6]]),
                torch.tensor([[-0.1, -1.0, -3.0]]), 100)
    assert select_leaves(tree, 8).tolist() == [1, 2, 3]
    assert select_leaves(tree, 8, min_weight=-1.0).tolist() == [1, 2]
    assert select_leaves(tree, 8, min_weight=-0.05).tolist() == []


def test_coupled_children_put_the_draw_first_with_the_top_log_prob():
    logprobs = torch.log_softmax(torch.tensor([[0.0, 3.0, 2.0, 1.0, -1.0], [0.0, 3.0, 2.0, 1.0, -1.0]]), -1)
    tokens, values = coupled_children(logprobs, 3, torch.tensor([2, 4]), 0.5)
    assert tokens.tolist() == [[2, 1, 3], [4, 1, 2]]  # in the top 3: moved first; else it replaces the 3rd
    top = logprobs[0].max()  # log 0.64
    assert values[:, 0].tolist() == [float(top)] * 2
    assert values[0, 1:].tolist() == pytest.approx([float(logprobs[0, 1]) + math.log(0.5), float(logprobs[0, 3]) + math.log(0.5)])
    assert coupled_children(logprobs, 1, torch.tensor([4, 0]), 0.5)[0].tolist() == [[4], [0]]
    assert coupled_children(logprobs, 2, torch.tensor([4, 0]), 0.9)[1][:, 0].tolist() == pytest.approx([math.log(0.9)] * 2)
