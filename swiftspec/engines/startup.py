"""Start-up profiling, shared by the engines: the rules that choose d (draft expansions per round),
the warm-ups that time a round, and the StartupProfile they return, which the engine keeps.

An engine lends its warm-up request and its verification timing (a Probe); what to measure, in
which order, and how each rule reads the times live here once.  The measurements behind the serial
rules: docs/bench/depth-rules.md.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

from swiftspec.config import TreeConfig
from swiftspec.engines.base import GenerationStats

if TYPE_CHECKING:
    from swiftspec.tokenizer import Tokenizer

log = logging.getLogger("swiftspec")
WARMUP_PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
MAX_PROFILED_DEPTH = 8  # deeper trees outgrow what the draft can keep accurate
SERIAL_PROFILE_DEPTH = 2  # d of the serial warm-up that times one expansion and one verification


@dataclass(frozen=True, slots=True)
class StartupProfile:
    """What an engine measured at start-up, returned by its profiling and kept by the engine (the
    bench and the logs read it): the d it runs with, the times that chose it, and how a warm
    request runs.  A request's rounds run as a profile says (its d, and its verify costs)."""

    depth: int  # d: draft expansions per round (the given --depth, or the profiled one)
    t_target_s: float = 0.0  # one target forward over a subtree; 0 when not measured
    t_draft_s: float = 0.0  # one draft expansion; 0 when not measured
    verify_s: tuple[float, ...] = ()  # adaptive verification (tree, async): seconds to verify 1..bs nodes
    round_s: float = 0.0  # async: seconds per decode round of a warm request at d; 0 when not measured
    prefill_token_s: float = 0.0  # async: that request's time to first token, per prompt token


@dataclass(frozen=True, slots=True)
class Warmup:
    """One warm-up request, as the engine that ran it reads it."""

    stats: GenerationStats
    t_target_s: float  # per round: the target's forward (serial: and its verification)
    t_draft_s: float  # per draft expansion


class Probe(Protocol):
    """What an engine lends its start-up profile."""

    tokenizer: "Tokenizer"

    def warmup(self, prompt: list[int], plan: StartupProfile) -> Warmup:
        """Run a short greedy request whose rounds go as `plan` says (its d and verify costs)."""
        ...

    def verify_times(self, prompt: list[int]) -> list[float]:
        """Seconds to verify 1..bs nodes after the prompt; [] where they cannot be timed alone."""
        ...


def serial_depth(t_verify: float, t_expand: float, verify_size: int) -> int:
    """d for the serial tree when --depth is 0: two expansions plus as many as fit in one
    verification, and no deeper than a verify_size-node subtree reaches (verify_size - 1).

    Serial rounds draft with focus (TreeDrafter.draft): past the first two expansions only the few
    leaves that can still be verified are expanded, so a deeper expansion costs about a one-row
    forward and stops early once the subtree is final.  The paper's floor(t_target / t_draft)
    (choose_depth) assumes drafting overlaps verification.  The measurements behind the rule:
    docs/bench/depth-rules.md."""
    return min(deepest_depth(verify_size), 2 + round(t_verify / max(t_expand, 1e-6)))


def deepest_depth(verify_size: int) -> int:
    """The deepest a verify_size-node subtree reaches (verify_size - 1), within [2, MAX_PROFILED_DEPTH]:
    the serial tree's d when its rounds end by the cost rule (TreeConfig.adaptive)."""
    return min(MAX_PROFILED_DEPTH, max(2, verify_size - 1))


def paper_depth(t_target: float, t_draft: float) -> int:
    """The paper's d0 = floor(t_target / t_draft), the expansions that fit in one verification,
    within [1, MAX_PROFILED_DEPTH - 1]."""
    return min(MAX_PROFILED_DEPTH - 1, max(1, math.floor(t_target / max(t_draft, 1e-6))))


def async_depth(t_target: float, t_draft: float) -> int:
    """d0 + 1 of the paper's rule (paper_depth): the deeper of the two depths choose_depth tries,
    with which `auto` predicts async and starts the async engine it chooses."""
    return paper_depth(t_target, t_draft) + 1


def choose_depth(t_target: float, t_draft: float, speed_at: Callable[[int], float], label: str) -> int:
    """d by profiling (the paper's rule): d0 = paper_depth, then keep whichever of d0 and d0 + 1
    decodes faster in a short warm-up (speed_at(d) -> tok/s).  Logs the choice."""
    d0 = paper_depth(t_target, t_draft)
    speed = {d: speed_at(d) for d in (d0, d0 + 1)}
    best = max(speed, key=speed.get)
    log.warning("%s: t_target %.1f ms, t_draft %.1f ms; d=%d: %.1f tok/s, d=%d: %.1f tok/s; using d=%d",
                label, 1e3 * t_target, 1e3 * t_draft, d0, speed[d0], d0 + 1, speed[d0 + 1], best)
    return best


def serial_profile(tree: TreeConfig, probe: Probe, known: StartupProfile | None = None) -> StartupProfile:
    """The serial engines' (chain, tree): d given, the adaptive rounds' cap (deepest_depth), or
    profiled (serial_depth); with adaptive verification, the verify times too.  known: the same,
    read from `auto`'s pair profile (engines/auto/choose.py): nothing is measured again."""
    if known is not None:
        return known
    prompt = probe.tokenizer.encode(WARMUP_PROMPT)
    if tree.depth:
        profile = StartupProfile(depth=tree.depth)
    elif tree.adaptive:  # the cost rule (speculate/costs.py) ends rounds; d only caps them
        profile = StartupProfile(depth=deepest_depth(tree.verify_size))
        log.warning("tree: adaptive rounds of up to d=%d expansions", profile.depth)
    else:
        profile = _serial_timed_depth(tree, probe, prompt)
    if tree.adaptive and tree.adaptive_verify:
        profile = dataclasses.replace(profile, verify_s=_verify_times(probe, prompt, "tree", logging.WARNING))
    return profile


def _serial_timed_depth(tree: TreeConfig, probe: Probe, prompt: list[int]) -> StartupProfile:
    """Time a short warm-up at d = SERIAL_PROFILE_DEPTH (the second of two: the first pays one-time
    costs), then serial_depth (logged)."""
    warm = [probe.warmup(prompt, StartupProfile(depth=SERIAL_PROFILE_DEPTH)) for _ in range(2)][-1]
    depth = serial_depth(warm.t_target_s, warm.t_draft_s, tree.verify_size)
    log.warning("tree: t_target %.1f ms, t_draft %.1f ms per expansion; using d=%d",
                1e3 * warm.t_target_s, 1e3 * warm.t_draft_s, depth)
    return StartupProfile(depth=depth, t_target_s=warm.t_target_s, t_draft_s=warm.t_draft_s)


def async_profile(tree: TreeConfig, probe: Probe, known: StartupProfile | None = None) -> StartupProfile:
    """The async engine's: d given or by the paper's rule (choose_depth, warm-ups without verify
    costs), the verify times (adaptive verification), then a warm request at that d (the second of
    two: the first pays one-time costs) for the seconds per round and per prompt token.
    known: d and the verify times read from `auto`'s pair profile (engines/auto/choose.py); only the
    warm request runs."""
    prompt = probe.tokenizer.encode(WARMUP_PROMPT)
    profile = known
    if profile is None:
        profile = StartupProfile(depth=tree.depth) if tree.depth else _paper_depth(probe, prompt)
        if tree.adaptive_verify:
            profile = dataclasses.replace(profile, verify_s=_verify_times(probe, prompt, "async", logging.INFO))
    stats = [probe.warmup(prompt, profile) for _ in range(2)][-1].stats
    return dataclasses.replace(profile, round_s=(stats.total_s - stats.ttft_s) / max(1, stats.rounds),
                               prefill_token_s=stats.ttft_s / stats.prompt_tokens)


def _paper_depth(probe: Probe, prompt: list[int]) -> StartupProfile:
    """d by profiling: time both sides at d = 1, then keep the faster of floor(t_t/t_d) and +1."""
    warm = probe.warmup(prompt, StartupProfile(depth=1))
    depth = choose_depth(warm.t_target_s, warm.t_draft_s,
                         lambda d: probe.warmup(prompt, StartupProfile(depth=d)).stats.tokens_per_s, "async")
    return StartupProfile(depth=depth, t_target_s=warm.t_target_s, t_draft_s=warm.t_draft_s)


def _verify_times(probe: Probe, prompt: list[int], label: str, level: int) -> tuple[float, ...]:
    """Seconds to verify 1..bs nodes, which the rounds weigh against each node's chance
    (TreeConfig.adaptive_verify; speculate/costs.py); logged at `level` when measured."""
    best = probe.verify_times(prompt)
    if best:
        log.log(level, "%s: verifying 1..%d nodes takes %s ms", label, len(best),
                " ".join(f"{1e3 * s:.1f}" for s in best))
    return tuple(best)
