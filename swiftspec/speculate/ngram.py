"""Prompt lookup's two halves: an n-gram index over the tokens so far (prompt and output), which
finds continuations of the current suffix, and the measured rates that turn a continuation's
tokens into calibrated log-probs for the tree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

MAX_SCANNED = 32  # occurrences of one n-gram looked at per lookup, most recent first
DEPTH_CELLS = 4  # rates are kept for candidate depths 1, 2, 3 and 4+
PRIOR_TRIALS = 4.0  # weight of the prior rate, in trials
RATE_RANGE = (0.01, 0.95)  # rates are clamped here: log-probs stay finite and below 0


@dataclass(frozen=True, slots=True)
class Continuation:
    """Tokens that followed an earlier occurrence of the current suffix; `n` tokens matched."""

    tokens: tuple[int, ...]
    n: int


class NgramIndex:
    """The tokens so far, with the end positions of every n-gram (n = 1..max_n) in them."""

    def __init__(self, max_n: int) -> None:
        self.max_n = max_n
        self.tokens: list[int] = []
        self.ends: dict[tuple[int, ...], list[int]] = {}  # n-gram -> positions just past it, ascending

    def reset(self, tokens: list[int]) -> None:
        self.tokens, self.ends = [], {}
        self.extend(tokens)

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            self.tokens.append(token)
            end = len(self.tokens)
            for n in range(1, min(self.max_n, end) + 1):
                self.ends.setdefault(tuple(self.tokens[end - n:]), []).append(end)

    def continuations(self, length: int, branches: int) -> list[Continuation]:
        """Up to `branches` distinct continuations (at most `length` tokens each) of the longest
        suffix that occurred before: longer matches first, then the most recent.  A continuation
        that starts another one already found adds nothing and is skipped."""
        found: list[Continuation] = []
        size = len(self.tokens)
        for n in range(min(self.max_n, size), 0, -1):
            ends = self.ends.get(tuple(self.tokens[size - n:]), [])
            for end in reversed(ends[-MAX_SCANNED - 1:]):
                tokens = tuple(self.tokens[end:end + length])
                if end >= size or any(c.tokens[: len(tokens)] == tokens for c in found):
                    continue
                found.append(Continuation(tokens, n))
                if len(found) == branches:
                    return found
        return found


@dataclass(frozen=True, slots=True)
class RateKey:
    """Which rate a candidate token gets: its match length n, its depth in the continuation
    (1 = the root's child), whether another candidate came first at its parent, and what the
    draft said once it expanded that parent (UNSEEN; AGREED: its first choice; SECONDARY: among
    its other top-k children; DISAGREED: not among them)."""

    n: int
    depth: int
    alternative: bool
    draft: int = 0


UNSEEN, AGREED, SECONDARY, DISAGREED = 0, 1, 2, 3  # RateKey.draft


def prior_rate(key: RateKey) -> float:
    """The rate before any measurement: longer matches and deeper tokens (their parent was
    accepted, so the copy is under way) are likelier; an alternative is half as likely."""
    base = {1: 0.15, 2: 0.3, 3: 0.4}.get(key.n, 0.5)
    rate = min(0.8, base + 0.15 * (key.depth - 1))
    rate = rate / 2 if key.alternative else rate
    return {UNSEEN: rate, AGREED: min(0.9, 1.5 * rate), SECONDARY: rate / 2, DISAGREED: rate / 8}[key.draft]


@dataclass(slots=True)
class AcceptRates:
    """How often the target's next token equalled a candidate's token, given that the candidate's
    parent was verified, per RateKey, smoothed towards prior_rate."""

    max_n: int
    hits: dict[RateKey, float] = field(default_factory=dict)
    trials: dict[RateKey, float] = field(default_factory=dict)

    def key(self, n: int, depth: int, alternative: bool) -> RateKey:
        return RateKey(min(n, self.max_n), min(depth, DEPTH_CELLS), alternative)

    def rate(self, key: RateKey) -> float:
        hits = self.hits.get(key, 0.0) + PRIOR_TRIALS * prior_rate(key)
        rate = hits / (self.trials.get(key, 0.0) + PRIOR_TRIALS)
        return min(RATE_RANGE[1], max(RATE_RANGE[0], rate))

    def logprob(self, key: RateKey) -> float:
        return math.log(self.rate(key))

    def record(self, key: RateKey, hit: bool) -> None:
        self.hits[key] = self.hits.get(key, 0.0) + float(hit)
        self.trials[key] = self.trials.get(key, 0.0) + 1.0
