"""The FIFO request queue and the one worker thread that owns the engine.

The engine decodes one stream at a time and is not thread-safe, so every request becomes a Job
that waits in a bounded FIFO; the worker runs jobs in arrival order and hands each round's
tokens back to the request's event loop. Setting a job's `stop` event ends it within one round.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

from swiftspec.errors import UserError
from swiftspec.runtime.base import Engine, GenerationStats
from swiftspec.sampling import SamplingParams

log = logging.getLogger(__name__)


class QueueFull(Exception):
    """The FIFO already holds max_queue waiting requests."""


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
    max_new_tokens: int
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)  # list[int] per round, then JobEnd
    stop: threading.Event = field(default_factory=threading.Event)
    arrived: float = field(default_factory=time.perf_counter)
    end: JobEnd | None = None  # set once `rounds` is exhausted

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


class Scheduler:
    """Bounded FIFO + one worker thread. `on_end(job, end)` runs on the worker after every job."""

    def __init__(self, engine: Engine, max_queue: int, on_end: Callable[[Job, JobEnd], None]) -> None:
        self._engine = engine
        self._max_queue = max_queue
        self._on_end = on_end
        self._waiting: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self._running: Job | None = None
        self._thread = threading.Thread(target=self._work, name="swiftspec-engine", daemon=True)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop the running job within a round, drop the waiting ones, and join the worker."""
        with self._cond:
            self._closed = True
            self._waiting.clear()
            if self._running is not None:
                self._running.stop.set()
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()

    def submit(self, request_id: str, prompt: list[int], params: SamplingParams, max_new_tokens: int) -> Job:
        """Queue a job at the back of the FIFO; raises QueueFull when max_queue jobs already wait."""
        job = Job(request_id, prompt, params, max_new_tokens, asyncio.get_running_loop())
        with self._cond:
            if self._closed or len(self._waiting) >= self._max_queue:
                raise QueueFull
            self._waiting.append(job)
            log.debug("queued %s (%d waiting)", request_id, len(self._waiting))
            self._cond.notify()
        return job

    def cancel(self, job: Job) -> None:
        """The client is gone: leave the queue at once, or end within one round if running."""
        job.stop.set()
        with self._cond:
            if job in self._waiting:
                self._waiting.remove(job)
                log.debug("cancelled %s while waiting", job.request_id)

    def _next(self) -> Job | None:
        with self._cond:
            self._running = None
            while not self._waiting and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            self._running = self._waiting.popleft()
            return self._running

    def _work(self) -> None:
        while (job := self._next()) is not None:
            if job.stop.is_set():  # cancelled between its stop flag and its removal from the queue
                continue
            end = self._run(job)
            job.deliver(end)
            self._on_end(job, end)

    def _run(self, job: Job) -> JobEnd:
        """Drive the engine for one job; any engine error is handed to the request, not raised."""
        log.debug("started %s", job.request_id)
        error: Exception | None = None
        count, first, last = 0, None, 0.0
        try:
            for ids in self._engine.generate(job.prompt, job.params, job.max_new_tokens, job.stop.is_set):
                last = time.perf_counter()
                first = last if first is None else first
                count += len(ids)
                job.deliver(list(ids))
        except UserError as exc:
            error = exc
        except Exception as exc:  # noqa: BLE001 - the worker must outlive any one request
            log.exception("request %s failed in the engine", job.request_id)
            error = exc
        stats = self._engine.stats  # only this job's when it ran without error; copied before the next
        stats = GenerationStats() if error else dataclasses.replace(stats, accept_lengths=list(stats.accept_lengths))
        ttft = None if first is None else first - job.arrived
        return JobEnd(error, stats, count, ttft, 0.0 if first is None else last - first)
