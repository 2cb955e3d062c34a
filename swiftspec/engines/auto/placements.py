"""Before running async across hosts: serial tree and async tok/s for a placement, from the per-forward
costs that `--mode auto` profiles (engines/auto/predict.py does the simulation; this adds placements).

Placements: `one host` (both groups share this machine's cores and memory bus: auto's own async
prediction) and `two hosts` (the target on all of this machine, the draft on another host whose
forwards run `draft_speed` times as fast as the lone draft measured here, with `rtt_s` of round trip
per round on the critical path). The break-even is the draft speed at which two-host async first
beats the serial tree on this machine alone; pure.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from swiftspec.config import AutoConfig, EngineConfig, TreeConfig
from swiftspec.engines.auto.choose import predictions
from swiftspec.engines.auto.predict import Calibration, DraftProfile, PairProfile, Prediction, predict_async

SPEEDS = (1 / 16, 64.0)  # the range of draft speeds the break-even search covers


@dataclass(frozen=True, slots=True, kw_only=True)
class Setting:
    """Where the two groups run."""

    two_hosts: bool = False  # False: both groups share this host's cores and memory bus
    draft_speed: float = 1.0  # two hosts: draft forwards this many times as fast as the lone draft here
    rtt_s: float = 0.0  # two hosts: network round trip per round

    @property
    def label(self) -> str:
        if not self.two_hosts:
            return "one host"
        return f"two hosts (draft x{self.draft_speed:g}, rtt {1e3 * self.rtt_s:g} ms)"


@dataclass(frozen=True, slots=True, kw_only=True)
class Forecast:
    """Serial tree on this host alone against async in a setting."""

    setting: Setting
    tree: Prediction
    async_: Prediction

    @property
    def async_wins(self) -> bool:
        return self.async_.tokens_per_s > self.tree.tokens_per_s

    def line(self) -> str:
        verdict = "async wins" if self.async_wins else "serial tree wins"
        return (f"{self.setting.label}: tree {self.tree.tokens_per_s:.1f} tok/s, async "
                f"{self.async_.tokens_per_s:.1f} tok/s ({self.async_.tokens_per_round:.2f} tok/round): {verdict}")


def best_tree(profile: PairProfile, tree: TreeConfig, cal: Calibration) -> Prediction:
    """The serial tree engine on this host, with its best draft format (auto's prediction)."""
    config = EngineConfig(tree=tree, auto=AutoConfig(modes=("tree",)))
    return max(predictions(profile, config, cal), key=lambda p: p.tokens_per_s)


def predict_two_hosts(profile: PairProfile, draft: DraftProfile, tree: TreeConfig, setting: Setting,
                      cal: Calibration) -> Prediction:
    """Async with each group on its own host: auto's async round with the target on every core here
    and no shared bus, the draft's forwards scaled by its host's speed, and per round the network
    round trip plus whatever expansion the draft cannot finish while the target verifies."""
    target_profile = dataclasses.replace(profile, target_grouped=profile.target_alone, target_cores=profile.cores)
    faster = draft.alone.scaled(1.0 / setting.draft_speed)
    remote_draft = dataclasses.replace(draft, alone=faster, grouped=faster)
    verify_s, expand_s = profile.target_alone.at(tree.verify_size), faster.at(tree.width)
    stall_s = max(0.0, expand_s - verify_s - setting.rtt_s)  # the target waits for the draft's top-up
    link_cal = dataclasses.replace(cal, async_s=cal.async_s + setting.rtt_s + stall_s)
    return predict_async(target_profile, remote_draft, tree, link_cal, own_devices=True)


def forecast(profile: PairProfile, tree: TreeConfig, setting: Setting, cal: Calibration = Calibration()) -> Forecast:
    """Serial tree here against async in `setting` (each with the draft format that suits it best)."""
    if setting.two_hosts:
        runs = [predict_two_hosts(profile, d, tree, setting, cal) for d in profile.drafts]
    else:
        runs = [predict_async(profile, d, tree, cal) for d in profile.drafts]
    return Forecast(setting=setting, tree=best_tree(profile, tree, cal),
                    async_=max(runs, key=lambda p: p.tokens_per_s))


def break_even(profile: PairProfile, tree: TreeConfig, rtt_s: float, cal: Calibration = Calibration()) -> float | None:
    """The least draft-host speed (against the lone draft here) at which two-host async beats the serial
    tree here, to 2%; None when even a draft SPEEDS[1] times as fast would not (the target's own
    verification, the rendezvous and the round trip then outweigh what overlap hides)."""
    def wins(speed: float) -> bool:
        return forecast(profile, tree, Setting(two_hosts=True, draft_speed=speed, rtt_s=rtt_s), cal).async_wins

    lo, hi = SPEEDS
    if wins(lo):
        return lo
    if not wins(hi):
        return None
    while hi / lo > 1.02:  # async gains with draft speed (deeper trees): bisect on a log scale
        mid = (lo * hi) ** 0.5
        lo, hi = (lo, mid) if wins(mid) else (mid, hi)
    return hi


def max_rtt(profile: PairProfile, tree: TreeConfig, draft_speed: float, cal: Calibration = Calibration()) -> float:
    """The longest round trip (seconds) at which two-host async still beats the serial tree here (0:
    not even on a zero-latency link). Round time grows by the RTT one for one, tokens per round do not."""
    fc = forecast(profile, tree, Setting(two_hosts=True, draft_speed=draft_speed), cal)
    tree_s_per_token, async_s_per_token = 1 / fc.tree.tokens_per_s, 1 / fc.async_.tokens_per_s
    return max(0.0, (tree_s_per_token - async_s_per_token) * fc.async_.tokens_per_round)


def report(profile: PairProfile, tree: TreeConfig, rtt_s: float, cal: Calibration = Calibration()) -> list[str]:
    """The lines `swiftspec forecast` prints: one host, two equal hosts, and the break-even."""
    lines = [forecast(profile, tree, Setting(), cal).line(),
             forecast(profile, tree, Setting(two_hosts=True, rtt_s=rtt_s), cal).line()]
    speed = break_even(profile, tree, rtt_s, cal)
    if speed is None:
        lines.append(f"break-even: none; even a draft host {SPEEDS[1]:g}x as fast would not make async win at "
                     f"{1e3 * rtt_s:g} ms rtt")
    else:
        lines.append(f"break-even: async wins once the draft host runs the draft >= {speed:.2f}x as fast as this "
                     f"host does alone (rtt {1e3 * rtt_s:g} ms); with equal hosts it tolerates "
                     f"{1e3 * max_rtt(profile, tree, 1.0, cal):.1f} ms rtt")
    return lines
