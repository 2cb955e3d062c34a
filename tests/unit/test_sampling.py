"""process_logits against a naive per-row reference; sync-free sampling and its generator."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from swiftspec.config import ConfigError
from swiftspec.sampling import (
    Draws,
    SamplingParams,
    draft_nucleus,
    pick_tokens,
    process_logits,
    sample,
    sample_at,
    with_seed,
)

FAST = settings(max_examples=60, deadline=None)


pytestmark = pytest.mark.usefixtures("one_thread")


def _reference(row: list[float], params: SamplingParams) -> list[float]:
    """Naive float64 processing of one row of logits."""
    if params.greedy:
        best = max(range(len(row)), key=lambda i: (row[i], -i))
        return [float(i == best) for i in range(len(row))]
    scaled = [x / params.temperature for x in row]
    if 0 < params.top_k < len(row):
        kth = sorted(scaled, reverse=True)[params.top_k - 1]
        scaled = [x if x >= kth else -math.inf for x in scaled]
    top = max(scaled)
    probs = [math.exp(x - top) for x in scaled]
    probs = [p / sum(probs) for p in probs]
    mass = 0.0
    for i in sorted(range(len(row)), key=lambda i: (-probs[i], i)):
        assume(abs(mass - params.top_p) > 1e-4)  # float32 and float64 may cut differently
        if mass >= params.top_p:
            probs[i] = 0.0
        else:
            mass += probs[i]
    floor = params.min_p * max(probs)
    assume(all(abs(p - floor) > 1e-6 for p in probs if p > 0))
    probs = [p if p >= floor else 0.0 for p in probs]
    return [p / sum(probs) for p in probs]


params_strategy = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.0, 0.3, 0.7, 1.0, 1.6]),
    top_p=st.sampled_from([1.0, 0.95, 0.9, 0.5, 0.1]),
    top_k=st.integers(0, 12),
    min_p=st.sampled_from([0.0, 0.05, 0.3]),
)
# Logits on a grid of quarters: ties are then exact in float32 and float64 alike.
logit = st.integers(-32, 32).map(lambda x: x / 4)
rows_strategy = st.integers(2, 12).flatmap(
    lambda v: st.lists(st.lists(logit, min_size=v, max_size=v), min_size=1, max_size=4)
)


@FAST
@given(rows=rows_strategy, params=params_strategy)
def test_process_logits_matches_reference(rows, params):
    probs = process_logits(torch.tensor(rows), params)
    assert probs.dtype == torch.float32 and probs.shape == (len(rows), len(rows[0]))
    expected = torch.tensor([_reference(r, params) for r in rows])
    torch.testing.assert_close(probs, expected, atol=1e-5, rtol=1e-4)


def test_process_logits_keeps_leading_dims_and_sums_to_one():
    logits = torch.randn(3, 5, 11, generator=torch.Generator().manual_seed(0), dtype=torch.bfloat16)
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=6, min_p=0.02)
    probs = process_logits(logits, params)
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs.sum(-1), torch.ones(3, 5))
    torch.testing.assert_close(probs.reshape(15, 11), process_logits(logits.reshape(15, 11), params))


def test_greedy_is_one_hot_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0], [5.0, 5.0, 1.0]])
    probs = process_logits(logits, SamplingParams(temperature=0.0))
    assert torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))


PROBS = torch.tensor([0.1, 0.0, 0.4, 0.2, 0.25, 0.05])


def assert_follows_probs(draws: torch.Tensor) -> None:
    """Chi-square of draws [50,000] against PROBS at significance 1e-6 (5 df: threshold 39.7);
    the draws are seeded, so the test is deterministic.  No draw of the token without mass."""
    assert draws.dtype == torch.int64 and draws.shape == (50_000,)
    counts = torch.bincount(draws, minlength=6).double()
    assert counts[1] == 0
    expected = PROBS.double() * draws.numel()
    keep = expected > 0
    assert float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum()) < 39.7


def test_sample_follows_probs():
    assert_follows_probs(sample(PROBS.expand(50_000, -1), torch.Generator().manual_seed(3)))


def test_sample_is_reproducible_per_seed():
    probs = torch.softmax(torch.randn(64, 30, generator=torch.Generator().manual_seed(1)), -1)
    first = sample(probs, torch.Generator().manual_seed(5))
    assert torch.equal(first, sample(probs, torch.Generator().manual_seed(5)))
    assert not torch.equal(first, sample(probs, torch.Generator().manual_seed(6)))
    assert sample(probs, torch.Generator()).shape == (64,)


def test_draws_depend_on_the_seed_and_the_position_alone():
    draws = Draws(5)
    u = draws.uniforms(10, 6)
    assert u.dtype == torch.float64 and ((u >= 0) & (u < 1)).all() and u.unique().numel() == 6
    assert torch.equal(u, torch.cat([draws.uniforms(10, 2), Draws(5).uniforms(12, 4)]))
    assert not torch.equal(u, Draws(6).uniforms(10, 6))
    assert Draws.for_request(SamplingParams(seed=-1)).seed == 2**64 - 1  # any Python int is a seed
    unseeded = {with_seed(SamplingParams(temperature=1.0)).seed for _ in range(4)}
    assert len(unseeded) == 4 and with_seed(SamplingParams(seed=3)).seed == 3
    assert with_seed(SamplingParams()).seed is None  # greedy draws nothing


def test_sample_at_follows_probs():
    """Over 50,000 positions' uniforms."""
    assert_follows_probs(sample_at(PROBS.expand(50_000, -1), Draws(3).uniforms(0, 50_000)))


def test_sample_at_never_picks_a_token_without_mass():
    probs = torch.tensor([[0.0, 0.3, 0.0, 0.7, 0.0, 0.0]] * 3)
    extremes = torch.tensor([0.0, 1 - 2.0**-53, 0.5], dtype=torch.float64)
    assert sample_at(probs, extremes).tolist() == [1, 3, 3]


def test_pick_tokens_is_argmax_when_greedy_and_keyed_by_position_when_sampled():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    assert torch.equal(pick_tokens(logits, SamplingParams(), Draws(0), 7), logits.argmax(-1))
    params = SamplingParams(temperature=1.0)
    rows = pick_tokens(logits, params, Draws(1), 7)  # row i: position 7 + i
    one = [int(pick_tokens(logits[i : i + 1], params, Draws(1), 7 + i)) for i in range(3)]
    assert rows.tolist() == one


def test_process_and_sample_need_no_host_sync():
    # Meta tensors have no data: any .item(), .tolist() or data-dependent shape would raise.
    logits = torch.zeros(4, 9, device="meta")
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=5, min_p=0.05)
    assert sample(process_logits(logits, params), None).shape == (4,)


@pytest.mark.parametrize("bad", [dict(temperature=-1.0), dict(top_p=0.0), dict(top_k=-1), dict(min_p=1.0)])
def test_sampling_params_validation(bad):
    with pytest.raises(ConfigError):
        SamplingParams(**bad)


@pytest.mark.parametrize("vocab", [1025, 4000, 40000])
def test_top_p_from_candidates_equals_a_stable_sort(vocab) -> None:
    """The CPU finds the nucleus among the tokens of probability >= TOP_P_FLOOR: the same kept set
    as a stable sort, ties at the cut included, whether or not the candidates decide it."""
    from swiftspec.sampling import _top_p, _top_p_candidates

    decided = 0
    gen = torch.Generator().manual_seed(vocab)
    for trial in range(40):
        ranks = torch.randperm(vocab, generator=gen).float() + 1
        logits = torch.randn(3, vocab, generator=gen) * (1 + trial % 4) - (trial % 3) * ranks.log()
        if trial % 4 == 0:
            logits = (logits * 2).round() / 2  # ties
        if trial % 5 == 0:
            logits[:, : vocab // 2] = 6.0  # a tie group at the top: half the vocabulary (below the floor at 40000)
        probs = logits.softmax(-1)
        for top_p in (0.1, 0.5, 0.9, 0.99):
            sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
            drop = torch.zeros_like(probs, dtype=torch.bool).scatter(
                -1, order, sorted_probs.cumsum(-1) - sorted_probs >= top_p)
            assert torch.equal(_top_p(probs, top_p), probs.masked_fill(drop, 0.0)), (trial, top_p)
            decided += _top_p_candidates(probs, top_p) is not None
    assert 0 < decided < 160  # the candidates decide most cases, the sort the others


def test_draft_nucleus_is_process_logits_where_the_nucleus_lies_among_the_candidates():
    logits = torch.randn(4, 5000, generator=torch.Generator().manual_seed(2)) * 12  # nuclei of a few dozen tokens
    for params in (SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(temperature=1.0, top_p=0.8, top_k=20),
                   SamplingParams(temperature=0.5, top_p=0.95, min_p=0.05)):
        nucleus = draft_nucleus(logits, params)
        assert (nucleus.ids.diff(dim=-1) > 0).all()  # token-id order
        full = process_logits(logits, params)
        torch.testing.assert_close(nucleus.probs, full.gather(-1, nucleus.ids), atol=1e-6, rtol=1e-5)
        assert torch.allclose(full.gather(-1, nucleus.ids).sum(-1), torch.ones(4))  # the whole nucleus
