"""The FIFO request queue and the one worker thread that owns the engine.

The engine decodes one stream at a time and is not thread-safe, so every request becomes a Job
that waits in a bounded FIFO; the worker runs jobs in arrival order and hands each round's
tokens back to the request's event loop. Setting a job's `stop` event ends it within one round.
The worker thread also builds the engine (the server answers meanwhile, `health` STARTING), times
one probe prefill (serve/pace.py) and keeps it healthy: after a worker fault (EngineFault) it
restarts the engine before the next job, so waiting jobs are served by fresh workers.  At shutdown,
drain() stops admitting, lets the jobs run for a grace, then ends them with an error.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

from swiftspec.engines.base import Engine, GenerationStats
from swiftspec.errors import EngineFault, UserError
from swiftspec.sampling import SamplingParams
from swiftspec.serve.pace import Pace, probe_prefill

log = logging.getLogger(__name__)
IDLE_CHECK_S = 1.0  # an idle worker thread asks the engine this often whether a worker failed
STARTING, OK, DEGRADED, STOPPING = "starting", "ok", "degraded", "stopping"  # Scheduler.health
PREFILL, DECODE = "prefill", "decode"  # the running job's phase


class QueueFull(Exception):
    """The FIFO already holds max_queue waiting requests."""


class ShuttingDown(EngineFault):
    """The server is stopping: it takes no new request, and ends those still running after its grace."""


@dataclass(frozen=True, slots=True)
class Running:
    """The job holding the engine, as /health and /metrics report it."""

    age_s: float  # since it started running
    phase: str  # PREFILL (no token yet) | DECODE
    late: bool  # it has held the engine far longer than its size should take (Pace.late_after_s)


@dataclass(frozen=True, slots=True)
class JobEnd:
    """Sent after a job's last round: the engine's error (if any), its stats and server-side timings."""

    error: Exception | None
    stats: GenerationStats
    new_tokens: int  # tokens the worker handed out
    ttft_s: float | None  # arrival -> first token, queue wait included; None without tokens
    decode_s: float  # first token -> last token


@dataclass(eq=False)
class Job:
    """One request's generation; created and consumed on the event loop, run on the worker thread."""

    request_id: str
    prompt: list[int]
    params: SamplingParams
    max_new_tokens: int  # 0: only prefill (the prompt's KV goes into the prompt cache)
    loop: asyncio.AbstractEventLoop
    reuse: bool = True  # the prefill may keep the prompt cache's KV (a request's cache_prompt)
    events: asyncio.Queue = field(default_factory=asyncio.Queue)  # list[int] per round, then JobEnd
    stop: threading.Event = field(default_factory=threading.Event)
    arrived: float = field(default_factory=time.perf_counter)
    end: JobEnd | None = None  # set once `rounds` is exhausted
    stats: GenerationStats = field(default_factory=GenerationStats)  # the engine's, filled in as it runs (set by the worker)
    started: float | None = None  # perf_counter() when the worker took it, and at its first round
    first_round: float | None = None

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens whose KV the prompt cache held (known from the prefill on)."""
        return self.stats.cached_tokens

    async def rounds(self) -> AsyncIterator[list[int]]:
        """Each round's tokens as they come; re-raises the engine's error at the end."""
        while True:
            event = await self.events.get()
            if isinstance(event, JobEnd):
                self.end = event
                if event.error is not None:
                    raise event.error
                return
            yield event

    def deliver(self, event: list[int] | JobEnd) -> None:
        """Called from the worker thread. If the loop has closed nobody listens, so stop the job."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:
            self.stop.set()


@dataclass(frozen=True, slots=True)
class Hooks:
    """Called on the worker thread: after every job, after every restart of the engine, and once if
    the engine cannot be built (the thread then ends)."""

    on_end: Callable[[Job, JobEnd], None]
    on_restart: Callable[[], None]
    on_start_error: Callable[[Exception], None]


class Scheduler:
    """Bounded FIFO + one worker thread that builds the engine with `load()`, runs the jobs, and
    restarts the engine after a fault."""

    def __init__(self, load: Callable[[], Engine], max_queue: int, hooks: Hooks) -> None:
        self._load = load
        self.engine: Engine | None = None  # set once built
        self._max_queue = max_queue
        self._hooks = hooks
        self._waiting: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self._running: Job | None = None
        self._thread = threading.Thread(target=self._work, name="swiftspec-engine", daemon=True)
        self.health = STARTING  # until the engine is built; then OK, or DEGRADED from a fault until it recovers
        self._restart_failed = False
        self.pace = Pace()  # measured seconds per prompt token and per decoded token
        self._draining = False  # drain(): no new jobs
        self._cut_off = False  # ... and past its grace: the jobs still running end with ShuttingDown

    def running(self) -> Running | None:
        """The job holding the engine now, if any (read from any thread)."""
        job = self._running
        if job is None or job.started is None:
            return None
        age = time.perf_counter() - job.started
        late = age > self.pace.late_after_s(len(job.prompt) - job.cached_tokens, job.max_new_tokens)
        return Running(age_s=age, phase=PREFILL if job.first_round is None else DECODE, late=late)

    def drain(self, grace_s: float) -> None:
        """Shutdown begins: refuse new jobs; after grace_s seconds stop the running job (it ends with
        ShuttingDown, so its stream gets an error event) and fail the waiting ones."""
        self._draining, self.health = True, STOPPING
        timer = threading.Timer(grace_s, self._cut)
        timer.daemon = True
        timer.start()

    def _cut(self) -> None:
        with self._cond:
            self._cut_off = True
            if self._running is not None:
                self._running.stop.set()
        self._fail_waiting(ShuttingDown("the server is shutting down"))

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop the running job within a round, fail the waiting ones, and join the worker (unless it
        is still building the engine: the process is ending, and the workers end with it)."""
        with self._cond:
            self._closed = True
            if self._running is not None:
                self._running.stop.set()
            self._cond.notify_all()
        if self.engine is not None and self._thread.is_alive():
            self._thread.join()
        self._fail_waiting(EngineFault("the server is shutting down"))

    def submit(self, request_id: str, prompt: list[int], params: SamplingParams, max_new_tokens: int,
               reuse: bool = True) -> Job:
        """Queue a job at the back of the FIFO; raises QueueFull when max_queue jobs already wait."""
        job = Job(request_id, prompt, params, max_new_tokens, asyncio.get_running_loop(), reuse=reuse)
        with self._cond:
            if self._draining or self._closed:
                raise ShuttingDown("the server is shutting down")
            if len(self._waiting) >= self._max_queue:
                raise QueueFull
            self._waiting.append(job)
            log.debug("queued %s (%d waiting)", request_id, len(self._waiting))
            self._cond.notify()
        return job

    def cancel(self, job: Job) -> None:
        """The client is gone: leave the queue at once, or end within one round if running."""
        job.stop.set()
        with self._cond:
            waiting = job in self._waiting
            if waiting:
                self._waiting.remove(job)
        if waiting:  # it never runs: its end comes from here, so that whoever awaits its rounds returns
            log.debug("cancelled %s while waiting", job.request_id)
            job.deliver(JobEnd(None, GenerationStats(), 0, None, 0.0))

    def _next(self) -> Job | None:
        """The next job, once the engine is fit to run it (None once closed). Idle, the engine is
        checked every IDLE_CHECK_S, so that a worker lost between requests is replaced at once;
        after a failed restart, only a waiting job makes it try again."""
        while True:
            with self._cond:
                self._running = None
                if not self._waiting and not self._closed:
                    self._cond.wait(IDLE_CHECK_S)
                if self._closed:
                    return None
                if self._waiting and self.health in (OK, STOPPING) and self.engine.fault is None:
                    self._running = self._waiting.popleft()
                    return self._running
                retry = bool(self._waiting) or not self._restart_failed
            if retry:
                self._recover()

    def _recover(self) -> None:
        """Restart the engine after a fault; if that fails, every waiting job gets the error."""
        if self.engine.fault is not None:
            self.health = DEGRADED
        try:
            restarted = self.engine.recover()
        except Exception as exc:  # noqa: BLE001 - the worker thread must outlive a failed restart
            self.health, self._restart_failed = DEGRADED, True
            log.error("the engine could not recover: %s", exc)
            self._fail_waiting(exc)
            return
        if restarted:
            self._hooks.on_restart()
        self.health, self._restart_failed = STOPPING if self._draining else OK, False

    def _fail_waiting(self, error: Exception) -> None:
        with self._cond:
            failed, self._waiting = list(self._waiting), collections.deque()
        for job in failed:
            end = JobEnd(error, GenerationStats(), 0, None, 0.0)
            job.deliver(end)
            self._hooks.on_end(job, end)

    def _work(self) -> None:
        try:
            self.engine = self._load()
        except Exception as exc:  # noqa: BLE001 - reported through the hook: the server stops
            self.health = DEGRADED
            log.error("the engine did not start: %s", exc)
            self._hooks.on_start_error(exc)
            return
        try:  # before health turns ok: admission has a rate from the first request on
            self.pace.prefill_token_s = probe_prefill(self.engine)
        except Exception as exc:  # noqa: BLE001 - admission then waits for measured requests
            log.warning("the start-up prefill probe failed: %s", exc)
        self._recover()
        while (job := self._next()) is not None:
            if job.stop.is_set():  # cancelled between its stop flag and its removal from the queue
                continue
            end = self._run(job)
            job.deliver(end)
            self._hooks.on_end(job, end)

    def _run(self, job: Job) -> JobEnd:
        """Drive the engine for one job; any engine error is handed to the request, not raised."""
        log.debug("started %s", job.request_id)
        error: Exception | None = None
        stats, count, first, last = GenerationStats(), 0, None, 0.0
        job.started = time.perf_counter()
        try:
            generation = self.engine.generate(job.prompt, job.params, job.max_new_tokens, job.stop.is_set, job.reuse)
            job.stats = generation.stats
            for ids in generation:
                last = time.perf_counter()
                first = job.first_round = last if first is None else first
                count += len(ids)
                job.deliver(list(ids))
            stats = generation.stats
            self.pace.observe(stats)
            if self._cut_off:
                error = ShuttingDown("the server is shutting down: this request was cut off after its grace")  # this job's own; an error leaves the empty stats
        except (UserError, EngineFault) as exc:  # one line says it all
            error = exc
            if isinstance(exc, EngineFault):
                self.health = DEGRADED
                log.error("request %s failed: %s", job.request_id, exc)
        except Exception as exc:  # noqa: BLE001 - the worker must outlive any one request
            log.exception("request %s failed in the engine", job.request_id)
            error = exc
        ttft = None if first is None else first - job.arrived
        return JobEnd(error, stats, count, ttft, 0.0 if first is None else last - first)
