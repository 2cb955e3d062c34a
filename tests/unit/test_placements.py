"""The cost model of placements (engines/auto/placements.py) on a synthetic profile: async across hosts
gains with the draft host's speed and loses with the round trip; the break-even and the longest
round trip it reports are where the verdict flips."""

from __future__ import annotations

import dataclasses

import pytest

from swiftspec.config import TreeConfig
from swiftspec.engines.auto.placements import Setting, break_even, forecast, max_rtt, report
from swiftspec.engines.auto.predict import Costs, DraftProfile, PairProfile, Position

TREE = TreeConfig()


def profile(draft_s: float = 0.004, target_s: float = 0.020) -> PairProfile:
    rows = (1, 4, 8)
    good = Position(on_path=True, rank=1, logprobs=(-0.2, -2.0, -3.0))
    miss = Position(on_path=True, rank=0, logprobs=(-0.5, -1.5, -2.5))
    text = tuple(miss if i % 5 == 4 else good for i in range(200))
    draft = DraftProfile(weights="int8", alone=Costs(rows=rows, seconds=(draft_s, 1.2 * draft_s, 1.5 * draft_s)),
                         grouped=Costs(rows=rows, seconds=(2 * draft_s, 2.4 * draft_s, 3 * draft_s)), texts=(text,))
    return PairProfile(device="cpu", cores=2, target_cores=1, devices=0, target_bytes=10**9,
                       draft_bytes={"int8": 10**8},
                       target_alone=Costs(rows=rows, seconds=(target_s, 1.1 * target_s, 1.2 * target_s)),
                       target_grouped=Costs(rows=rows, seconds=(2 * target_s, 2.2 * target_s, 2.4 * target_s)),
                       drafts=(draft,), seconds=1.0)


def tps(p: PairProfile, **setting) -> float:
    return forecast(p, TREE, Setting(two_hosts=True, **setting)).async_.tokens_per_s


def test_two_hosts_gain_with_draft_speed_and_lose_with_round_trip() -> None:
    p = profile()
    assert tps(p, draft_speed=4.0) >= tps(p, draft_speed=1.0) >= tps(p, draft_speed=0.25)
    assert tps(p, rtt_s=0.0) > tps(p, rtt_s=0.005) > tps(p, rtt_s=0.050)
    one = forecast(p, TREE, Setting())
    assert one.async_.tokens_per_s < tps(p)  # sharing cores and the bus costs async here


def test_break_even_is_where_the_verdict_flips() -> None:
    p = profile(draft_s=0.012)
    speed = break_even(p, TREE, rtt_s=0.002)
    assert speed is not None
    assert forecast(p, TREE, Setting(two_hosts=True, draft_speed=speed, rtt_s=0.002)).async_wins
    assert not forecast(p, TREE, Setting(two_hosts=True, draft_speed=speed / 1.1, rtt_s=0.002)).async_wins


def test_no_break_even_when_the_round_trip_outweighs_drafting() -> None:
    assert break_even(profile(), TREE, rtt_s=1.0) is None
    assert "break-even: none" in report(profile(), TREE, rtt_s=1.0)[-1]


def test_max_rtt_is_where_async_stops_winning() -> None:
    p = profile(draft_s=0.02, target_s=0.1)
    rtt = max_rtt(p, TREE, draft_speed=1.0)
    assert rtt > 0
    assert forecast(p, TREE, Setting(two_hosts=True, rtt_s=0.9 * rtt)).async_wins
    assert not forecast(p, TREE, Setting(two_hosts=True, rtt_s=1.1 * rtt)).async_wins


def test_report_has_three_lines() -> None:
    lines = report(profile(), TREE, rtt_s=0.001)
    assert len(lines) == 3 and lines[0].startswith("one host:") and lines[1].startswith("two hosts")
    assert dataclasses.is_dataclass(Setting())


@pytest.mark.parametrize("speed", [0.5, 2.0])
def test_setting_labels(speed: float) -> None:
    assert f"x{speed:g}" in Setting(two_hosts=True, draft_speed=speed, rtt_s=0.005).label
