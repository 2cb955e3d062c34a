"""How fast the engine goes on this machine, measured: seconds per prompt token computed and per
token decoded (a probe prefill at start-up, then every request).  From them, how long a prompt's
prefill would take (admission: --max-prefill-s) and how long a request should hold the engine
(/health says `busy` once the running one holds it far longer).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from swiftspec.engines.base import Engine, GenerationStats
from swiftspec.sampling import SamplingParams

PROBE_TOKENS = 256  # the start-up probe's prompt (or half the context, if shorter)
MIN_SAMPLE_TOKENS = 64  # a request that computed fewer prompt tokens does not time the prefill
BUSY_FACTOR = 4.0  # a job holding the engine this many times its expected time, plus the slack, is late
BUSY_SLACK_S = 10.0
SMOOTHING = 0.5  # weight of the newest measurement


@dataclass(slots=True)
class Pace:
    """Seconds per computed prompt token and per decoded token (0: not measured yet)."""

    prefill_token_s: float = 0.0
    decode_token_s: float = 0.0

    def observe(self, stats: GenerationStats) -> None:
        """Learn from a finished request's stats (its prefill from its time to first token)."""
        computed = stats.prompt_tokens - stats.cached_tokens
        if computed >= MIN_SAMPLE_TOKENS and stats.ttft_s > 0:
            self.prefill_token_s = _blend(self.prefill_token_s, stats.ttft_s / computed)
        if stats.new_tokens > 1 and stats.total_s > stats.ttft_s:
            self.decode_token_s = _blend(self.decode_token_s, (stats.total_s - stats.ttft_s) / (stats.new_tokens - 1))

    def prefill_s(self, tokens: int) -> float:
        """Expected seconds to compute `tokens` prompt tokens (0 while unmeasured)."""
        return tokens * self.prefill_token_s

    def late_after_s(self, prompt_tokens: int, new_tokens: int) -> float:
        """Seconds after which a request of this size holds the engine for longer than it should."""
        expected = self.prefill_s(prompt_tokens) + new_tokens * self.decode_token_s
        return BUSY_FACTOR * expected + BUSY_SLACK_S


def probe_prefill(engine: Engine) -> float:
    """Seconds per prompt token of one prefill of PROBE_TOKENS tokens (nothing decoded, nothing
    reused): what admission goes by until requests have measured more."""
    n = max(1, min(PROBE_TOKENS, engine.max_seq_len // 2))
    vocab = engine.tokenizer.vocab_size
    prompt = [(7919 * i + 13) % vocab for i in range(n)]
    start = time.perf_counter()
    for _ in engine.generate(prompt, SamplingParams(), 0, reuse=False):
        pass
    return (time.perf_counter() - start) / n


def _blend(old: float, new: float) -> float:
    return new if old == 0 else (1 - SMOOTHING) * old + SMOOTHING * new
