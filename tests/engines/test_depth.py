"""How d is chosen when --depth is 0: the serial rule, the paper's async rule, and the start-up
profile of the serial engine."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from swiftspec.config import TreeConfig
from swiftspec.engines.serial import SerialEngine
from swiftspec.engines.startup import MAX_PROFILED_DEPTH, choose_depth, serial_depth
from swiftspec.speculate import TreeDrafter
from swiftspec.speculate.costs import MAX_FLOOR, MIN_TRUST, RoundCosts, RoundTimes
from swiftspec.tree import best_size


def test_serial_rule_matches_the_measured_best_depths() -> None:
    assert serial_depth(0.099, 0.0167, 8) == 7  # bf16 target, int8 draft, 2 cores
    assert serial_depth(0.044, 0.0145, 8) == 5  # int4 target and draft
    assert serial_depth(1.0, 0.001, 8) == 7  # no deeper than a bs-node subtree reaches
    assert serial_depth(1.0, 0.001, 32) == MAX_PROFILED_DEPTH
    assert serial_depth(0.01, 1.0, 8) == 2


def test_async_rule_tries_d0_and_one_more(caplog: pytest.LogCaptureFixture) -> None:
    tried = []

    def speed(d: int) -> float:
        tried.append(d)
        return {3: 10.0, 4: 12.0}[d]

    with caplog.at_level(logging.WARNING, logger="swiftspec"):
        assert choose_depth(0.35, 0.1, speed, "async") == 4
    assert tried == [3, 4] and "using d=4" in caplog.text


def test_serial_engine_profiles_its_depth(tiny_target, tiny_draft, caplog: pytest.LogCaptureFixture) -> None:
    cfg = TreeConfig(depth=0, adaptive=False)
    with caplog.at_level(logging.WARNING, logger="swiftspec"):
        engine = SerialEngine(tiny_target, TreeDrafter(tiny_draft.model, cfg, 256), cfg, 256)
    assert 2 <= engine.depth <= MAX_PROFILED_DEPTH
    assert f"using d={engine.depth}" in caplog.text


def test_adaptive_engine_caps_rounds_at_the_subtree_depth(tiny_target, tiny_draft) -> None:
    for bs, want in ((8, 7), (4, 3), (32, MAX_PROFILED_DEPTH)):
        cfg = TreeConfig(depth=0, verify_size=bs)
        assert SerialEngine(tiny_target, TreeDrafter(tiny_draft.model, cfg, 256), cfg, 256).depth == want


def test_round_costs_give_the_break_even_path_probability() -> None:
    costs = RoundCosts()
    assert costs.min_weight() == -math.inf  # nothing measured yet: expand everything
    costs.update(RoundTimes(draft_s=0.10, expansions=5, nodes=8, verify_s=0.15, round_s=0.30, tokens=6))
    assert costs.min_weight() == pytest.approx(math.log(0.4))  # 20 ms per expansion, 50 ms per token
    costs.update(RoundTimes(0.0, 0, 8, 0.05, 0.10, 1))  # no expansion: only the token cost moves
    assert costs.expand_s == pytest.approx(0.02)
    assert costs.token_s == pytest.approx(0.8 * 0.05 + 0.2 * 0.10)
    assert costs.other_s == pytest.approx(0.8 * 0.05 + 0.2 * 0.05)  # outside drafting and verification
    costs.update(RoundTimes(1.0, 1, 8, 0.0, 1.0, 10))  # a draft dearer than a token
    assert costs.min_weight() == pytest.approx(math.log(MAX_FLOOR))  # the likeliest leaves still expand


def test_round_costs_distrust_promises_that_fail() -> None:
    """Low acceptance against what the path probabilities promised: a higher floor (narrower,
    shallower rounds) and fewer rows verified; kept promises change nothing."""
    kept, broken = RoundCosts(), RoundCosts()
    for costs, accepted in ((kept, 5), (broken, 1)):
        for _ in range(40):  # the prior (TRUST_PRIOR) fades
            costs.update(RoundTimes(0.10, 5, 8, 0.15, 0.30, accepted + 1, promised=4.0))
    assert kept.trust() == 1.0 and broken.trust() == pytest.approx(0.25, rel=1e-3)
    assert kept.min_weight() == pytest.approx(math.log(0.02 / 0.05))  # as without the promise
    assert broken.min_weight() == pytest.approx(math.log(0.02 / (0.15 * broken.trust())))
    ranked = torch.tensor([0.0, math.log(0.6), math.log(0.5), math.log(0.4)])
    costs = torch.tensor([1.0, 1.2, 1.4, 1.6])
    assert best_size(ranked, costs, 0.0, kept.trust()) == 4
    assert best_size(ranked, costs, 0.0, broken.trust()) == 1
    assert RoundCosts().trust() == 1.0
    zero = RoundCosts()
    for _ in range(40):
        zero.update(RoundTimes(0.1, 1, 8, 0.1, 0.2, 1, promised=3.0))
    assert zero.trust() == MIN_TRUST


def test_one_round_that_accepts_nothing_keeps_drafting() -> None:
    """The real pair's int4 tree once accepted none of its first round's 2 promised tokens: trust
    fell to MIN_TRUST at once, every later round verified the root alone (which never measures
    trust again), and the request ran at 1 token per round.  From the prior it falls to ~0.6."""
    costs = RoundCosts(verify_s=[0.043, 0.048, 0.059, 0.073])
    costs.update(RoundTimes(0.03, 3, 4, 0.06, 0.1, 1, promised=2.0))
    assert 0.5 < costs.trust() < 0.7
    ranked = torch.tensor([0.0, math.log(0.74), math.log(0.25), math.log(0.15)])
    assert best_size(ranked, costs.verify_costs(), 0.001, costs.trust()) > 1


def test_round_costs_scale_the_profile_by_every_round() -> None:
    costs = RoundCosts()
    assert costs.verify_costs() is None  # not profiled: verify the whole subtree
    costs.verify_s = [0.02, 0.03, 0.04]
    costs.update(RoundTimes(0.01, 1, 2, 0.06, 0.07, 2))  # two rows took twice their profiled time
    assert costs.verify_costs().tolist() == pytest.approx([1.2 * t for t in (0.02, 0.03, 0.04)])
    costs.verify_s = [0.02, 0.05, 0.04]  # noise: three rows measured cheaper than two
    assert costs.verify_costs().tolist() == pytest.approx([1.2 * t for t in (0.02, 0.05, 0.05)])


def test_one_stalled_round_does_not_stop_larger_subtrees_for_good() -> None:
    """A round of 3 nodes stalls 0.5 s; the rounds after it verify 1 node only (the dear sizes
    are never measured again): the costs still return to the profile, and so does the size
    best_size picks.  (Per-size running times kept 3+ nodes at 133 ms here: the real pair's tree
    then verified at most 2 nodes per round for the rest of the engine's life.)"""
    profile = [0.027, 0.028, 0.033, 0.039]
    costs = RoundCosts(verify_s=list(profile))
    ranked = torch.tensor([0.0, math.log(0.9), math.log(0.8), math.log(0.7)])
    assert best_size(ranked, costs.verify_costs(), 0.01) == 4
    costs.update(RoundTimes(0.01, 1, 3, 0.5, 0.52, 1))
    assert costs.verify_costs()[0] > 0.1  # the stall slows every size alike
    for _ in range(20):
        costs.update(RoundTimes(0.01, 1, 1, 0.027, 0.04, 1))
    assert costs.verify_costs().tolist() == pytest.approx(profile, rel=0.05)
    assert best_size(ranked, costs.verify_costs(), 0.01) == 4


def test_adaptive_engine_profiles_every_verification_size(tiny_target, tiny_draft, caplog) -> None:
    cfg = TreeConfig(depth=0, verify_size=5)
    with caplog.at_level(logging.WARNING, logger="swiftspec"):
        engine = SerialEngine(tiny_target, TreeDrafter(tiny_draft.model, cfg, 256), cfg, 256)
    assert len(engine.costs.verify_s) == 5 and all(0 < s < 10 for s in engine.costs.verify_s)
    assert "verifying 1..5 nodes takes" in caplog.text
    for off in (TreeConfig(depth=0, adaptive=False), TreeConfig(depth=0, adaptive_verify=False)):  # verify all bs
        assert SerialEngine(tiny_target, TreeDrafter(tiny_draft.model, off, 256), off, 256).costs.verify_s == []


def test_a_known_profile_is_not_measured_again() -> None:
    """With a start-up profile already known (auto's), the serial profile measures nothing and the
    async one only its warm request, for the seconds per round and per prompt token."""
    from types import SimpleNamespace

    from swiftspec.engines.startup import StartupProfile, Warmup, async_profile, serial_profile

    calls = []

    class Probe:
        tokenizer = SimpleNamespace(encode=lambda text: [1, 2, 3, 4])

        def warmup(self, prompt, plan):
            calls.append(("warmup", plan.depth))
            stats = SimpleNamespace(total_s=1.0, ttft_s=0.2, rounds=4, prompt_tokens=4)
            return Warmup(stats=stats, t_target_s=0.1, t_draft_s=0.01)

        def verify_times(self, prompt):
            calls.append("verify_times")
            return [0.1, 0.2]

    known = StartupProfile(depth=5, verify_s=(0.1, 0.11))
    assert serial_profile(TreeConfig(depth=0), Probe(), known) is known and calls == []
    got = async_profile(TreeConfig(depth=0), Probe(), known)
    assert calls == [("warmup", 5), ("warmup", 5)]
    assert got.depth == 5 and got.verify_s == known.verify_s
    assert got.round_s == pytest.approx(0.2) and got.prefill_token_s == pytest.approx(0.05)
