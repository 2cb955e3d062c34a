"""Supervision of the async engine's worker processes: they are started so that none outlives the
front end, and a watchdog turns a dead worker, or a phase that makes no progress in time, into a fault.

A fault stops every worker: a gloo call that the front end is blocked in then fails at once (its
peer's connection closes), so the running request ends with an error instead of a hang.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch.multiprocessing as mp

POLL_S = 0.1  # how often the watchdog looks
LOAD_S = 600.0  # start-up (spawn, join the groups, load the weights): a busy machine can take minutes
ROUND_SLACK_S = 5.0  # auto limit of a decode round: this much past ROUND_FACTOR profiled rounds
ROUND_FACTOR = 4.0
PREFILL_SLACK_S = 10.0  # a request's first round also waits for both prefills (fresh workers: cold)
PREFILL_FACTOR = 10.0  # ... and this many times the profiled prefill time per prompt token


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """How long the front end waits on its workers, in a request, before it declares them hung
    (start-up and restart: LOAD_S, or the link's timeout for a linked draft host)."""

    round_s: float = LOAD_S  # one decode round (generous until profiled)
    prefill_token_s: float = 0.0  # a request's first round gets this much more per prompt token

    def prefill(self, prompt_tokens: int) -> float:
        """The limit of a request's first round: both prefills, then a round."""
        return self.round_s + PREFILL_SLACK_S + self.prefill_token_s * prompt_tokens

    @staticmethod
    def profiled(round_s: float, prefill_token_s: float, worker_timeout: float) -> "Limits":
        """Limits from a warm-up's seconds per round and per prompt token; worker_timeout > 0
        (--worker-timeout) sets the round limit instead of ROUND_SLACK_S + ROUND_FACTOR rounds."""
        limit = worker_timeout or ROUND_SLACK_S + ROUND_FACTOR * round_s
        return Limits(round_s=limit, prefill_token_s=PREFILL_FACTOR * prefill_token_s)


@dataclass(frozen=True, slots=True)
class DeadWorker:
    rank: int
    exitcode: int | None


class WorkerPool:
    """The worker processes (global ranks 1 .. world_size - 1) of one engine.

    Each worker asks the kernel for SIGKILL when its parent ends (PR_SET_PDEATHSIG). That signal
    follows the *thread* that started the worker, so every spawn runs on one thread that lives as
    long as the pool, never on a request's thread."""

    def __init__(self, entry: Callable[..., None], world_size: int) -> None:
        self._entry = entry  # entry(rank, *args, parent_pid), importable (spawn pickles it by name)
        self._world_size = world_size
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="swiftspec-spawner")
        self._lock = threading.Lock()
        self._procs: list = []  # multiprocessing Process objects, rank - 1 = index
        self._running = False  # a worker that exits now is a fault (not so while stopping them)

    def spawn(self, *args: object) -> None:
        self._spawner.submit(self._start, args).result()

    def _start(self, args: tuple) -> None:
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=self._entry, args=(rank, *args, os.getpid()), daemon=True,
                             name=f"swiftspec-rank{rank}") for rank in range(1, self._world_size)]
        with self._lock:
            for proc in procs:
                proc.start()
            self._procs, self._running = procs, True

    @property
    def pids(self) -> dict[int, int]:
        """rank -> process id of the current workers."""
        return {rank: proc.pid for rank, proc in enumerate(list(self._procs), 1)}

    def first_dead(self) -> DeadWorker | None:
        """A worker that exited while it should be running."""
        with self._lock:
            if not self._running:
                return None
            for rank, proc in enumerate(self._procs, 1):
                if not proc.is_alive():
                    return DeadWorker(rank, proc.exitcode)
        return None

    def stopped(self) -> list[int]:
        """Ranks of workers stopped by a signal (SIGSTOP, a debugger): Linux /proc state T."""
        ranks = []
        for rank, proc in enumerate(list(self._procs), 1):
            try:
                state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state in ("T", "t"):
                ranks.append(rank)
        return ranks

    def kill(self) -> None:
        """SIGKILL every worker (a stopped one too); their exits are no longer faults."""
        with self._lock:
            self._running = False
            for proc in self._procs:
                if proc.is_alive():
                    proc.kill()

    def stop(self, grace_s: float) -> None:
        """Wait up to grace_s for the workers to exit on their own, kill the rest, reap them all."""
        with self._lock:
            self._running = False
        deadline = time.monotonic() + grace_s
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        self.kill()
        for proc in self._procs:
            proc.join()
        self._procs = []

    def close(self) -> None:
        self.stop(0.0)
        self._spawner.shutdown()


@dataclass(frozen=True, slots=True)
class _Watch:
    phase: str
    limit_s: float
    deadline: float  # time.monotonic()


class Watchdog:
    """A thread that declares a fault when a worker dies or a watched phase overruns its limit, and
    then kills every worker (pool None, under torchrun: it can only report)."""

    def __init__(self, pool: WorkerPool | None, role: Callable[[int], str]) -> None:
        self.fault: str | None = None  # what went wrong; cleared after a restart
        self._pool = pool
        self._role = role  # rank -> "target" | "draft"
        self._watch: _Watch | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="swiftspec-watchdog", daemon=True)
        self._thread.start()

    @contextmanager
    def watch(self, phase: str, limit_s: float) -> Iterator[None]:
        """The block must finish within limit_s, or the workers count as hung."""
        self._watch = _Watch(phase, limit_s, time.monotonic() + limit_s)
        try:
            yield
        finally:
            self._watch = None

    def clear(self) -> None:
        self.fault = None

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            if self.fault is None and (fault := self._check()) is not None:
                self.fault = fault
                if self._pool is not None:
                    self._pool.kill()

    def _check(self) -> str | None:
        dead = self._pool.first_dead() if self._pool is not None else None
        if dead is not None:
            return f"async worker rank {dead.rank} ({self._role(dead.rank)} group) died (exit code {dead.exitcode})"
        watch = self._watch
        if watch is None or time.monotonic() <= watch.deadline:
            return None
        stopped = self._pool.stopped() if self._pool is not None else []
        who = "".join(f"; rank {r} ({self._role(r)} group) is stopped" for r in stopped)
        return f"async workers made no progress in {watch.phase} within {watch.limit_s:.1f} s{who}"
