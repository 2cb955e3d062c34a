"""async across hosts, the target host's side: RemoteEngine (the handshake both hosts send, hello, is
in distributed/protocol.py).

Each host runs one command and holds only its own model (the draft host's loop: distributed/draft_host.py).
The target host listens (parallel/rendezvous.py); while no draft host is linked it serves without
speculation (ar) and reports itself degraded. A draft host that passes the handshake forms the
two-rank world with it, and requests run async (engines/async_engine.py, unchanged). A message that
fails or takes longer than --link-timeout drops the link: the request under way finishes in ar from
the tokens already emitted, and the next draft host to connect is taken between requests. The draft
host, on losing the target, leaves the world and connects again until a target host answers.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from swiftspec.cache.prompt_store import PromptStore
from swiftspec.config import EngineConfig
from swiftspec.distributed.protocol import BEAT_KEY, hello
from swiftspec.engines.ar import AutoregressiveEngine
from swiftspec.engines.async_engine import AsyncEngine
from swiftspec.engines.base import Generation, GenerationStats, Rounds, token_budget
from swiftspec.errors import EngineFault, LinkError
from swiftspec.parallel.rendezvous import Listener, read_secret
from swiftspec.runner.load import load_target, prompt_store
from swiftspec.sampling import SamplingParams
from swiftspec.weights.loaded_model import LoadedModel

log = logging.getLogger(__name__)
def add_tail(stats: GenerationStats, tail: GenerationStats, offset_s: float) -> None:
    """Add to a request's stats those of its ar tail (the rest of it after the link failed), which
    began offset_s into the request."""
    if tail.new_tokens and not stats.new_tokens:
        stats.ttft_s = offset_s + tail.ttft_s
    if tail.new_tokens:
        stats.total_s = offset_s + tail.total_s
    stats.new_tokens += tail.new_tokens
    stats.rounds += tail.rounds
    stats.verify_s += tail.verify_s
    stats.accept_lengths += tail.accept_lengths


class RemoteEngine:
    """Target host: async with a linked draft host, else ar (degraded) until one joins."""

    def __init__(self, config: EngineConfig, target: LoadedModel | None = None) -> None:
        """target: the target model, when the caller has loaded it already."""
        self.config, self.remote = config, config.remote
        secret = read_secret(self.remote.secret_file)
        self.target = target or load_target(config.target, config.target_load)
        self.tokenizer = self.target.tokenizer
        self.max_seq_len = config.target_load.max_seq_len
        self.store = prompt_store(config)  # one bound for both engines' texts: they run the same target
        self.ar = AutoregressiveEngine(self.target, self.max_seq_len, self.store)
        self.trace = None
        self.mode = "async"
        self.session = None  # AsyncEngine while a draft host is linked
        self._beat, self._seen = 0, 0.0  # the draft's idle heartbeat, and when it last moved
        self.listener = Listener(self.remote.rendezvous, secret, hello("target", self.tokenizer, config),
                                 self.remote.link_timeout)
        log.info("target host: waiting for a draft host at %s:%d", self.listener.host, self.listener.port)
        deadline = time.monotonic() + self.remote.wait_draft
        while self.session is None and time.monotonic() < deadline:
            self._join(deadline - time.monotonic())

    fault: str | None = None  # a lost draft host is no fault: the engine serves on without it

    @property
    def degraded(self) -> str | None:
        """Why this host serves without speculation, or None while a draft host is linked."""
        return None if self.session is not None else "no draft host linked: serving without speculation (ar)"

    def _join(self, wait_s: float = 0.0) -> bool:
        """Link the next draft host waiting at the listener; True once linked."""
        if not self.listener.pending(wait_s):
            return False
        joined = self.listener.accept()
        if joined is None:
            return False

        try:
            self.session = AsyncEngine(self.config, joined=joined, target=self.target, store=self.store)
        except (EngineFault, LinkError) as exc:
            log.warning("a draft host passed the handshake but did not link: %s", exc)
            return False
        self._joined = joined
        self._beat, self._seen = 0, time.monotonic()
        log.warning("draft host linked: async (d = %d)", self.session.depth)
        return True

    def _drop(self, why: str) -> None:
        log.warning("lost the draft host (%s): serving without speculation until one rejoins", why)
        session, self.session = self.session, None
        session.close()  # leaves the groups; sends nothing to a peer in fault

    def recover(self) -> bool:
        """Between requests: drop a draft host that stopped beating, link one that is waiting.
        True when a draft host was linked."""
        if self.session is not None and self._beat_stale():
            self._drop(f"no heartbeat for {self.remote.link_timeout:.0f} s")
        return self.session is None and self._join()

    def _beat_stale(self) -> bool:
        beat = self._joined.store.add(BEAT_KEY, 0)  # the store lives in this process: never blocks
        now = time.monotonic()
        if beat != self._beat:
            self._beat, self._seen = beat, now
        return now - self._seen > self.remote.link_timeout

    @property
    def prompt_store(self) -> PromptStore | None:
        """The store both engines share."""
        return self.store

    def cached_prefix(self, prompt: list[int]) -> int:
        return (self.session or self.ar).cached_prefix(prompt)

    def generate(self, prompt: list[int], params: SamplingParams, max_new_tokens: int,
                 should_stop: Callable[[], bool] | None = None, reuse: bool = True) -> Generation:
        """async while a draft host is linked, else ar; bad input raises UserError here, before
        anything runs (a linked draft host stays linked)."""
        if self.session is None:
            self._join()
        if self.session is None:
            self.ar.trace = self.trace
            return self.ar.generate(prompt, params, max_new_tokens, should_stop, reuse)
        start = time.perf_counter()
        self.session.trace = self.trace
        linked = self.session.generate(prompt, params, max_new_tokens, should_stop, reuse)
        budget = token_budget(len(prompt), max_new_tokens, self.max_seq_len)
        return Generation(self._linked(linked, start, prompt, params, budget, should_stop), linked.stats)

    def _linked(self, linked: Generation, start: float, prompt: list[int], params: SamplingParams, budget: int,
                should_stop: Callable[[], bool] | None) -> Rounds:
        """The rounds of an async request (begun at perf_counter() `start`, `budget` new tokens at
        most); if the link fails, the rest of them in ar, added to the request's stats."""
        emitted: list[int] = []
        try:
            for out in linked:
                emitted += out
                yield out
            self._seen = time.monotonic()
            return
        except EngineFault as exc:  # the link failed: finish this request without the draft
            self._drop(str(exc))
        except BaseException:
            self._drop("a request failed with the groups out of step")
            raise
        if budget > len(emitted):
            self.ar.trace = self.trace
            offset_s = time.perf_counter() - start
            tail = self.ar.generate(prompt + emitted, params, budget - len(emitted), should_stop)
            try:
                yield from tail
            finally:
                add_tail(linked.stats, tail.stats, offset_s)

    def close(self) -> None:
        if self.session is not None:
            self.session.close()  # Shutdown: the draft host goes back to waiting for a target
            self.session = None
        self.listener.close()
