"""Per request: whether the next serial round drafts or decodes plainly (TreeConfig.fallback, which
auto sets), so that speculation never makes a request much slower than the target alone.

A plain round verifies the root alone: one target forward, one token, as `ar` decodes (the draft
only queues the token, read at its next forward).  Drafting rounds are judged in windows of
WINDOW rounds: when a window emitted fewer tokens per second than plain rounds do (measured, or
until one ran the profiled one-row verification), the request decodes plainly for a while, then
drafts again for one window (the probe); each failed probe doubles the plain stretch.  Output is
what the target decodes either way: only the speed changes.
"""

from __future__ import annotations

from dataclasses import dataclass

WINDOW = 8  # drafting rounds per comparison
PLAIN_ROUNDS = 16  # plain rounds after the first losing window ...
MAX_PLAIN_ROUNDS = 128  # ... doubled after each losing probe, up to this
PLAIN_SMOOTHING = 0.2  # weight of the latest plain round in the running plain round time


@dataclass(slots=True)
class Fallback:
    """One request's rule.  record() each round; drafts() says whether the next one drafts."""

    plain_s: float = 0.0  # running seconds of a plain round (0 until one ran)
    plain_left: int = 0  # plain rounds still to run before the next probe
    stretch: int = PLAIN_ROUNDS  # plain rounds after the next losing window
    window_s: float = 0.0  # the current window's drafting rounds: seconds ...
    window_tokens: int = 0  # ... tokens emitted ...
    window_rounds: int = 0  # ... and rounds
    plain_rounds: int = 0  # plain rounds run so far

    def drafts(self) -> bool:
        return self.plain_left == 0

    def record(self, drafted: bool, seconds: float, tokens: int, plain_estimate_s: float) -> None:
        """A finished round: whether it drafted, its seconds and tokens emitted.  plain_estimate_s:
        what a plain round would cost, for the comparison before any plain round ran (0: unknown,
        no comparison)."""
        if not drafted:
            self.plain_s = seconds if not self.plain_s else (
                (1 - PLAIN_SMOOTHING) * self.plain_s + PLAIN_SMOOTHING * seconds)
            self.plain_left -= 1
            self.plain_rounds += 1
            return
        self.window_s += seconds
        self.window_tokens += tokens
        self.window_rounds += 1
        if self.window_rounds < WINDOW:
            return
        plain_s = self.plain_s or plain_estimate_s
        if plain_s > 0 and self.window_tokens * plain_s < self.window_s:  # fewer tokens per second than plain
            self.plain_left = self.stretch
            self.stretch = min(MAX_PLAIN_ROUNDS, 2 * self.stretch)
        else:
            self.stretch = PLAIN_ROUNDS
        self.window_s, self.window_tokens, self.window_rounds = 0.0, 0, 0
