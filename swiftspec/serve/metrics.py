"""Prometheus metrics of one server app, in a registry of its own (no process-wide state)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from swiftspec.errors import EngineFault, UserError
from swiftspec.serve.scheduler import Job, JobEnd, Running

if TYPE_CHECKING:
    from swiftspec.cache.prompt_store import PromptStore

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_ACCEPT_BUCKETS = tuple(float(n) for n in range(1, 17))


class ServerMetrics:
    """Request, token, latency and speculation metrics; `render()` is the /metrics body."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        self.requests = Counter("swiftspec_requests", "HTTP requests by endpoint and status",
                                ("endpoint", "status"), registry=reg)
        self.tokens = Counter("swiftspec_tokens", "Tokens, by kind: prompt, completion, and cached (prompt "
                              "tokens whose KV the prompt cache held)", ("kind",), registry=reg)
        self.ttft = Histogram("swiftspec_time_to_first_token_seconds",
                              "Arrival to first token, queue wait included", buckets=_LATENCY_BUCKETS, registry=reg)
        self.tpot = Histogram("swiftspec_time_per_output_token_seconds",
                              "Mean time per token after the first, per request", buckets=_LATENCY_BUCKETS,
                              registry=reg)
        self.acceptance = Histogram("swiftspec_acceptance_length", "Tokens emitted per target forward",
                                    buckets=_ACCEPT_BUCKETS, registry=reg)
        self.draft = Counter("swiftspec_draft_seconds", "Time in draft forwards", registry=reg)
        self.verify = Counter("swiftspec_verify_seconds", "Time in target forwards and verification", registry=reg)
        self.plain = Counter("swiftspec_plain_rounds", "Target forwards of a speculative engine that drafted "
                             "nothing (auto's fallback where drafting did not pay)", registry=reg)
        self.queue = Gauge("swiftspec_queue_depth", "Requests waiting for the engine", registry=reg)
        self.restarts = Counter("swiftspec_worker_restarts", "Restarts of the engine's workers after a fault",
                                registry=reg)
        self.failed = Counter("swiftspec_failed_requests", "Requests the engine failed, by cause: "
                              "fault (a worker died or hung), invalid (bad input), error (anything else)",
                              ("cause",), registry=reg)

    def watch_engine(self, mode: Callable[[], str | None]) -> None:
        """swiftspec_engine{mode} 1 for the engine serving requests (auto's choice where it chose),
        read at every scrape: `mode()`, None (no sample) until the engine is built."""
        self.registry.register(_EngineMode(mode))

    def watch_queue(self, depth: Callable[[], int]) -> None:
        """Read the queue depth gauge from `depth()` at every scrape."""
        self.queue.set_function(depth)

    def watch_running(self, running: Callable[[], "Running | None"]) -> None:
        """The running job's age (0 when idle), read at every scrape."""
        gauge = Gauge("swiftspec_running_job_age_seconds", "Seconds the running job has held the engine",
                      registry=self.registry)
        gauge.set_function(lambda: 0.0 if running() is None else running().age_s)

    def watch_store(self, store: Callable[[], "PromptStore | None"]) -> None:
        """Gauges of the prompt cache's store (the engine's, read at every scrape; 0 without one)."""
        reads = {"bytes": ("KV bytes of the earlier texts kept", lambda s: s.nbytes),
                 "entries": ("Earlier texts kept", lambda s: len(s.entries)),
                 "lookups": ("Prefills that looked in the store", lambda s: s.stats.lookups),
                 "hits": ("Prefills that took an earlier text's KV from the store", lambda s: s.stats.hits),
                 "evictions": ("Texts dropped for room", lambda s: s.stats.evicted)}
        for name, (doc, read) in reads.items():
            gauge = Gauge(f"swiftspec_prompt_cache_{name}", doc, registry=self.registry)
            gauge.set_function(lambda read=read: 0 if store() is None else read(store()))

    def observe(self, job: Job, end: JobEnd) -> None:
        """Record one finished generation (called on the engine worker thread)."""
        if end.error is not None:
            self.failed.labels(_cause(end.error)).inc()
        self.tokens.labels("prompt").inc(len(job.prompt))
        self.tokens.labels("completion").inc(end.new_tokens)
        self.tokens.labels("cached").inc(end.stats.cached_tokens)
        if end.ttft_s is not None:
            self.ttft.observe(end.ttft_s)
        if end.new_tokens > 1:
            self.tpot.observe(end.decode_s / (end.new_tokens - 1))
        for accepted in end.stats.accept_lengths:
            self.acceptance.observe(accepted)
        self.draft.inc(end.stats.draft_s)
        self.verify.inc(end.stats.verify_s)
        self.plain.inc(end.stats.plain_rounds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineMode:
    """The collector of ServerMetrics.watch_engine."""

    def __init__(self, mode: Callable[[], str | None]) -> None:
        self.mode = mode

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("swiftspec_engine", "The engine serving requests, by mode (auto's choice "
                                   "where it chose)", labels=["mode"])
        mode = self.mode()
        if mode is not None:
            family.add_metric([mode], 1)
        yield family


def _cause(error: Exception) -> str:
    if isinstance(error, EngineFault):
        return "fault"
    return "invalid" if isinstance(error, UserError) else "error"


class RequestCounter:
    """ASGI middleware: counts every HTTP response by endpoint and status code.

    Paths outside `endpoints` are counted as "other", so random URLs cannot grow the label set.
    """

    def __init__(self, app: ASGIApp, metrics: ServerMetrics, endpoints: frozenset[str]) -> None:
        self.app = app
        self.metrics = metrics
        self.endpoints = endpoints

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        endpoint = scope["path"] if scope["path"] in self.endpoints else "other"
        started = False

        async def counting_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                self.metrics.requests.labels(endpoint, str(message["status"])).inc()
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except Exception:
            if not started:  # the server error handler answers 500 outside this middleware
                self.metrics.requests.labels(endpoint, "500").inc()
            raise
