"""Prompt lookup: the n-gram index, the rates, and the grafting and scoring done per round."""

from __future__ import annotations

import math

import pytest
import torch

from swiftspec.config import TreeConfig
from swiftspec.sampling import SamplingParams
from swiftspec.speculate import LookupDrafter, PromptLookup
from swiftspec.speculate.ngram import PRIOR_TRIALS, AcceptRates, NgramIndex, prior_rate
from swiftspec.tree import new_tree


def test_index_finds_the_longest_most_recent_match() -> None:
    index = NgramIndex(max_n=3)
    index.reset([1, 2, 3, 4, 9, 2, 3, 5, 1, 2, 3])
    found = index.continuations(length=2, branches=3)
    assert [(c.tokens, c.n) for c in found] == [((4, 9), 3), ((5, 1), 2)]  # (1 2 3) -> 4 9, then (2 3) -> 5 1
    assert index.continuations(length=2, branches=1) == found[:1]
    index.extend([5])
    assert index.continuations(length=3, branches=1)[0].tokens == (1, 2, 3)  # (2 3 5) -> 1 2 3


def test_index_prefers_longer_matches() -> None:
    index = NgramIndex(max_n=4)
    index.reset([7, 8, 9, 1, 0, 5, 9, 2, 7, 8, 9])
    assert index.continuations(length=3, branches=1)[0].tokens == (1, 0, 5)  # 7 8 9 beats the later 9
    index.extend([1])
    assert index.continuations(length=2, branches=1)[0].tokens == (0, 5)


def test_index_skips_continuations_already_covered() -> None:
    index = NgramIndex(max_n=2)
    index.reset([1, 2, 1, 2, 1])
    found = index.continuations(length=4, branches=4)
    assert [c.tokens for c in found] == [(2, 1), (2, 1, 2, 1)]  # the later (2, 1) starts the first one
    assert NgramIndex(max_n=2).continuations(length=4, branches=4) == []


def test_rates_start_at_the_prior_and_learn() -> None:
    rates = AcceptRates(max_n=4)
    key = rates.key(n=9, depth=9, alternative=False)
    assert key.n == 4 and key.depth == 4
    assert rates.rate(key) == pytest.approx(prior_rate(key))
    for _ in range(96):
        rates.record(key, True)
    assert rates.rate(key) == pytest.approx(0.95)  # clamped below 1: log-probs stay < 0
    other = rates.key(1, 1, True)
    rates.record(other, False)
    assert rates.rate(other) == pytest.approx(PRIOR_TRIALS * prior_rate(other) / (PRIOR_TRIALS + 1))
    assert math.log(rates.rate(key)) == rates.logprob(key)


def test_lookup_grafts_scores_and_carries_nodes_over() -> None:
    cfg = TreeConfig(lookup_tokens=3, lookup_branches=2)
    lookup = PromptLookup(cfg)
    lookup.start([4, 5, 6, 7, 4, 5])  # ... 4 5 -> 6 7 4
    tree = lookup.graft(new_tree(5), cfg.budget)
    assert tree.tokens.tolist()[:4] == [5, 6, 7, 4]
    assert lookup.grafted >= 3
    from swiftspec.tree import reroot

    step = reroot(tree, [6, 8])  # 6 accepted, then the target said 8 (not 7)
    lookup.observe(step, [6, 8])
    key1, key2 = lookup.rates.key(2, 1, False), lookup.rates.key(2, 2, False)
    assert lookup.rates.hits[key1] == 1 and lookup.rates.trials[key1] == 1
    assert lookup.rates.hits.get(key2, 0) == 0 and lookup.rates.trials[key2] == 1
    assert lookup.records == {}  # the tree left the walk: nothing to carry over
    assert lookup.index.tokens[-2:] == [6, 8]


def test_earlier_text_is_indexed_before_the_prompt() -> None:
    """The last request's answer, which the new prompt does not repeat, proposes its continuation."""
    cfg = TreeConfig(lookup_tokens=3, lookup_branches=1)
    lookup = PromptLookup(cfg)
    lookup.start([9, 3, 1], earlier=[3, 1, 7, 8, 2])  # the earlier answer went on "7 8 2" after "3 1"
    assert lookup.graft(new_tree(1), cfg.budget).tokens.tolist()[:4] == [1, 7, 8, 2]
    lookup.start([9, 3, 1])
    assert lookup.graft(new_tree(1), cfg.budget).tokens.tolist() == [1]


def test_the_rates_carry_over_between_requests() -> None:
    """Sampled requests too: no token depends on the tree's shape (sampling.Draws)."""
    lookup = PromptLookup(TreeConfig())
    key = lookup.rates.key(2, 1, False)
    lookup.rates.record(key, True)
    lookup.start([1, 2])
    assert lookup.rates.trials


def test_lookup_drafter_drafts_by_lookup_alone() -> None:
    drafter = LookupDrafter(TreeConfig(lookup_tokens=4))
    drafter.start([1, 2, 3, 1, 2], 3, SamplingParams())
    assert drafter.draft(5) == 0 and not drafter.expand()
    sub = drafter.subtree(8)
    assert sub.tokens.tolist() == [3, 1, 2, 3]  # ... 1 2 3 -> 1 2 3, the whole text after the match
    drafter.advance([1, 2, 9])
    assert drafter.tree.tokens[0] == 9


def test_expansion_tells_which_candidates_the_draft_agrees_with() -> None:
    from swiftspec.speculate.ngram import AGREED, DISAGREED, SECONDARY

    cfg = TreeConfig(lookup_tokens=1, lookup_branches=3)
    lookup = PromptLookup(cfg)
    lookup.start([5, 6, 5, 7, 5, 8, 5])  # after 5: 8, 7 or 6
    tree = lookup.graft(new_tree(5), cfg.budget)
    assert sorted(tree.tokens.tolist()[1:]) == [6, 7, 8]
    tree = lookup.expanding(tree, [0], [[8, 6, 1]])  # the draft ranks 8 first, 6 lower, 7 not at all
    states = {rec.token: rec.key.draft for rec in lookup.records.values()}
    assert states == {8: AGREED, 6: SECONDARY, 7: DISAGREED}
    by_token = dict(zip(tree.tokens.tolist(), tree.logprobs.tolist()))
    assert by_token[8] > by_token[6] > by_token[7]
    assert torch.allclose(tree.weights, tree.logprobs)  # depth 1: weights are the log-probs
