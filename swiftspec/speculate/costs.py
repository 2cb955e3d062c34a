"""Running costs of speculative rounds, for the rules that shape them (serial tree and async).

RoundCosts keeps smoothed averages of what rounds measured; its rules read the draft's path
probabilities as acceptance chances (scaled by trust where the draft promises more than it keeps)
and weigh them against the seconds a draft forward or a verified row costs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

COST_SMOOTHING = 0.2  # weight of the latest round in the running cost averages
MIN_TRUST = 0.05  # the least RoundCosts.trust() says, so that the rules never divide by zero
# The highest break-even path probability: leaves at least this likely are always expanded.  A
# floor of 1 would end drafting for good, since rounds without expansions (and without draft nodes
# verified) never measure expand_s or trust again (seen under host load: every round 1 token).
MAX_FLOOR = 0.6
# trust() starts from this many tokens accepted of as many promised, as if one round had kept its
# promise: so one round that accepts nothing lowers trust to 0.6 or so, not to MIN_TRUST (where
# the rules verify the root alone, which never measures trust again).
TRUST_PRIOR = 1.0


@dataclass(frozen=True, slots=True)
class RoundTimes:
    """What one round measured (async: seen from the draft leader, drafting off the critical path)."""

    draft_s: float  # drafting and subtree selection
    expansions: int  # draft forwards
    nodes: int  # nodes verified
    verify_s: float  # the target forward and verification over them
    round_s: float  # the whole round
    tokens: int  # tokens emitted
    promised: float = 0.0  # accepted tokens the verified nodes' path probabilities promised (their sum)


def promised(weights: torch.Tensor, nodes: torch.Tensor) -> float:
    """Draft tokens that verified nodes promise (RoundTimes.promised, for RoundCosts.trust): the sum
    of the path probabilities of `nodes` [n] (indices into a tree whose log path probabilities are
    `weights` [N]), less the root's 1: the root is no draft."""
    return float(weights[nodes].exp().sum()) - 1


def _ema(old: float, new: float) -> float:
    return (1 - COST_SMOOTHING) * old + COST_SMOOTHING * new


def _smooth(old: float, new: float) -> float:  # the first measurement (old still 0) taken as is
    return new if not old else _ema(old, new)


@dataclass(slots=True)
class RoundCosts:
    """Running averages of a round's costs: the serial tree's adaptive rounds (TreeConfig.adaptive)
    and the verification size of serial and async trees (TreeConfig.adaptive_verify).

    Drafting: expanding a leaf whose draft path probability is P adds at most P expected tokens
    and costs an expansion; the round's tokens cost token_s each.  So below P = expand_s / token_s
    a leaf slows decoding down and is skipped: a round ends early where the draft is unsure, and
    goes up to d deep where it is sure (a chain cannot do either).
    Verification: verify_s[n - 1] is the start-up profile's time to verify n nodes, and
    verify_scale the running ratio of measured to profiled times, over every round whatever its
    size: so the host's speed is tracked at every size, and one slow round (a stall, another
    process) decays away in the rounds after it.  (Running times kept per size never recovered:
    a stalled round made every larger size look dear, no later round verified one, and the engine
    verified fewer nodes for good.)  The subtree keeps the nodes that repay their rows
    (tree.best_size), with other_s the round's time outside drafting and verification.
    Both rules read path probabilities as acceptance chances.  Where fewer tokens are accepted
    than they promise (chat, for a code draft), trust() < 1 scales them down, so the rounds get
    narrower and shallower and verify fewer rows; it never scales them up, so a workload where
    the draft keeps its promises (code) is drafted as before.
    Async: the draft leader sees a round as the time between two trees it sends (the target's
    forward and verification, the link, the re-root and selection); verify_s comes from the
    target's start-up profile, and the rest of the round is other_s (drafting overlaps it)."""

    expand_s: float = 0.0
    token_s: float = 0.0
    other_s: float = 0.0
    verify_s: list[float] = field(default_factory=list)  # [bs] the start-up profile; empty until profiled
    verify_scale: float = 1.0  # measured / profiled verification time, smoothed over every round
    accepted: float = TRUST_PRIOR  # draft tokens accepted per round (smoothed from the prior)
    promised: float = TRUST_PRIOR  # ... and what the verified nodes' path probabilities promised

    def update(self, r: RoundTimes) -> None:
        if r.expansions:
            self.expand_s = _smooth(self.expand_s, r.draft_s / r.expansions)
        self.token_s = _smooth(self.token_s, r.round_s / max(1, r.tokens))
        self.other_s = _smooth(self.other_s, max(0.0, r.round_s - r.draft_s - r.verify_s))
        if 0 < r.nodes <= len(self.verify_s):
            ratio = r.verify_s / self.verify_s[r.nodes - 1]
            self.verify_scale = _ema(self.verify_scale, ratio)
        if r.nodes > 1:
            self.accepted = _ema(self.accepted, r.tokens - 1)
            self.promised = _ema(self.promised, r.promised)

    def trust(self) -> float:
        """Accepted over promised tokens, at most 1 (1 until measured: TRUST_PRIOR)."""
        return min(1.0, max(MIN_TRUST, self.accepted / self.promised))

    def min_weight(self) -> float:
        """log of the break-even path probability, at most log(MAX_FLOOR) (-inf until both costs are known)."""
        if not self.expand_s or not self.token_s:
            return -math.inf
        return math.log(min(MAX_FLOOR, self.expand_s / (self.token_s * self.trust())))

    def verify_costs(self) -> torch.Tensor | None:
        """Seconds to verify 1..bs nodes now, [bs]: the profile made non-decreasing (more rows
        never cost less; a noisy measurement must not make a larger subtree look cheaper) times
        verify_scale; None until profiled."""
        if not self.verify_s:
            return None
        return torch.tensor(self.verify_s).cummax(0).values * self.verify_scale
