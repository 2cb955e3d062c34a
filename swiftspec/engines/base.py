"""The interface every engine mode (ar, chain, tree, async) offers to the CLI, server and bench."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Generator, Iterator, Protocol

from swiftspec.errors import UserError
from swiftspec.sampling import SamplingParams

if TYPE_CHECKING:
    import torch

    from swiftspec.cache.prompt_store import PromptStore
    from swiftspec.runner.model_runner import Prefill
    from swiftspec.tokenizer import Tokenizer
    from swiftspec.trace import TraceFile

Rounds = Generator[list[int], None, None]  # one request run lazily: the new token ids of each round


@dataclass(slots=True)
class GenerationStats:
    """One request's, filled in while it runs (Generation.stats); complete once its rounds are exhausted."""

    prompt_tokens: int = 0
    cached_tokens: int = 0  # leading prompt tokens whose target KV the prompt cache held (not recomputed)
    new_tokens: int = 0
    rounds: int = 0  # target forwards after prefill
    ttft_s: float = 0.0  # time to first token
    total_s: float = 0.0
    draft_s: float = 0.0  # time spent in draft forwards (serial modes)
    verify_s: float = 0.0  # time spent in target forwards + verification
    accept_lengths: list[int] = field(default_factory=list)  # tokens emitted per target forward
    plain_rounds: int = 0  # rounds that drafted nothing and verified the root alone (TreeConfig.fallback)
    spans: dict = field(default_factory=dict)  # async: both groups' busy time per span (trace.summarize)

    @property
    def acceptance_length(self) -> float:
        return sum(self.accept_lengths) / len(self.accept_lengths) if self.accept_lengths else 1.0

    @property
    def tokens_per_s(self) -> float:
        decode_s = self.total_s - self.ttft_s
        return (self.new_tokens - 1) / decode_s if self.new_tokens > 1 and decode_s > 0 else 0.0


@dataclass(frozen=True, slots=True, eq=False)
class Generation:
    """What Engine.generate returns: one request's rounds and its stats.

    Iterating it runs the request lazily, round by round: each item is the list of new token ids of
    one round.  `stats` is this request's own, filled in as the rounds run and complete once they
    are exhausted; nothing about the request is left on the engine.  close() abandons the request
    the way a consumer that stops reading does (the engine ends it cleanly)."""

    rounds: Rounds = field(repr=False)
    stats: GenerationStats

    def __iter__(self) -> Iterator[list[int]]:
        return self

    def __next__(self) -> list[int]:
        return next(self.rounds)

    def close(self) -> None:
        self.rounds.close()


class Engine(Protocol):
    """Decodes one stream at a time. `generate` returns a Generation that yields the tokens of
    each round as they are final and carries the request's stats."""

    tokenizer: "Tokenizer"  # swiftspec.tokenizer.Tokenizer of the target
    max_seq_len: int  # prompt + new tokens must fit in this
    trace: "TraceFile | None"  # while set, every request's timeline is added to it
    mode: str  # the mode it runs (ar, chain, tree, async): what auto chose, where it chose
    fault: str | None  # why the engine cannot serve until recover() (a worker died or hung); None when it can

    def generate(
        self,
        prompt: list[int],
        params: SamplingParams,
        max_new_tokens: int,
        should_stop: Callable[[], bool] | None = None,
        reuse: bool = True,
    ) -> Generation:
        """One request. Raises UserError at once on bad input (an empty or too long prompt, a
        negative token count); no round runs until the Generation is iterated.  max_new_tokens 0
        only prefills the prompt (it fills the prompt cache).  reuse=False: the prefill keeps
        no cached KV (the prompt cache's `cache_prompt: false`).  Iterating it yields
        lists of new token ids (one list per round); it stops at EOS (not yielded), at
        max_new_tokens, or once should_stop() returns True (checked once per round), and raises
        EngineFault when a worker fails (the request is lost; recover() before the next).
        Read the request's stats from the Generation, never from the engine."""
        ...

    def recover(self) -> bool:
        """Restart what a fault stopped (the async engine's workers); True if it restarted.
        Raises EngineFault if the restart fails. Engines that run in one process have no workers
        to lose and return False."""
        ...

    def close(self) -> None:
        """Release worker processes and memory."""
        ...

    @property
    def prompt_store(self) -> "PromptStore | None":
        """The target's store of earlier texts' KV (the prompt cache beyond the live text), if any."""
        ...

    def cached_prefix(self, prompt: list[int]) -> int:
        """Leading prompt tokens whose target KV the prompt cache holds now (safe to ask from another
        thread while a request runs: then an estimate)."""
        ...


def token_budget(prompt_len: int, max_new_tokens: int, max_seq_len: int) -> int:
    """The most tokens a request may emit: what it asks for, within what the context leaves."""
    return min(max_new_tokens, max_seq_len - prompt_len)


class RequestState:
    """Tracks one request: clips each round's tokens at EOS and the token budget, and times it."""

    def __init__(
        self,
        prompt: list[int],
        max_new_tokens: int,
        max_seq_len: int,
        eos_ids: frozenset[int],
        should_stop: Callable[[], bool] | None = None,
        reuse: bool = True,
    ) -> None:
        if not prompt:
            raise UserError("the prompt is empty")
        if len(prompt) >= max_seq_len:
            raise UserError(f"the prompt has {len(prompt)} tokens; the context holds {max_seq_len}")
        if max_new_tokens < 0:
            raise UserError(f"max tokens must be >= 0, got {max_new_tokens}")
        self.prefill_only = max_new_tokens == 0  # the prompt's KV goes into the prompt cache; no token
        self.remaining = token_budget(len(prompt), max_new_tokens, max_seq_len)
        self.eos_ids = eos_ids
        self.should_stop = should_stop
        self.reuse = reuse  # the prefill may keep the prompt cache's KV
        self.stats = GenerationStats(prompt_tokens=len(prompt))
        self.done = False
        self._start = time.perf_counter()

    def prefilled(self, done: "Prefill | None") -> "torch.Tensor | None":
        """The logits after the prompt [1, V] from its prefill, or None when the request ends there
        (stopped during the prefill, or asked for no token); notes what the prompt cache held."""
        if done is None:
            return None
        self.stats.cached_tokens = done.cached
        return None if self.prefill_only else done.logits

    def emit(self, tokens: list[int]) -> list[int]:
        """The tokens of one round that reach the user; sets `done` at EOS, budget or cancellation."""
        out = []
        for t in tokens[: self.remaining]:
            if t in self.eos_ids:
                self.done = True
                break
            out.append(t)
        self.remaining -= len(out)
        stats = self.stats
        now = time.perf_counter() - self._start
        if stats.new_tokens == 0:
            stats.ttft_s = now
        stats.new_tokens += len(out)
        stats.total_s = now
        if self.remaining <= 0 or (self.should_stop is not None and self.should_stop()):
            self.done = True
        return out
