"""The async engine's worker group, seen from the front end (global rank 0): start the other ranks
(spawned here, started by torchrun, or a draft host linked through parallel/rendezvous.py), watch
them, restart them after a fault, shut them down.

A restart renews the process groups, so the group also holds what hangs on them: the target (loaded
again when sharded), its verifier, the link to the draft leader and the relay to the target's
tensor-parallel followers.  Watching and restarting: distributed/supervisor.py.
"""

from __future__ import annotations

import contextlib
import logging
import time
from contextlib import contextmanager
from typing import Iterator

import torch.distributed as dist

from swiftspec.cache.prompt_store import PromptStore
from swiftspec.config import EngineConfig
from swiftspec.distributed.protocol import DistTransport, GroupBroadcast, Shutdown
from swiftspec.distributed.supervisor import LOAD_S, POLL_S, Watchdog, WorkerPool
from swiftspec.distributed.workers import backend, rank_load, torchrun_init, worker_entry
from swiftspec.errors import EngineFault, LinkError
from swiftspec.parallel.groups import Layout, all_ready, init_groups, joined, leave_groups, meeting_point
from swiftspec.parallel.rendezvous import Joined
from swiftspec.runner.load import load_target, prompt_store
from swiftspec.speculate import TreeVerifier
from swiftspec.weights.loaded_model import LoadedModel

log = logging.getLogger(__name__)
CAUSE_GRACE_S = 1.0  # after a failed message, how long a dying worker's exit may take to show
SHUTDOWN_S = 10.0  # how long close() waits for the workers to exit on Shutdown


class WorkerGroup:
    """The ranks > 0 of one async engine, and the front end's handles on them.

    A worker that dies or hangs, or a request that fails with the groups out of step, leaves a
    fault: no request runs until recover() has started fresh workers (spawned ones only; torchrun's
    and a linked draft host cannot be respawned from here)."""

    def __init__(self, config: EngineConfig, joined: Joined | None = None,
                 target: LoadedModel | None = None, store: PromptStore | None = None) -> None:
        """joined: a draft host already linked (no workers to spawn); target: the target model, when
        the caller has loaded it already; store: the prompt cache's store the caller shares (None:
        the config's own, runner.load.prompt_store).  Under torchrun, ranks > 0 serve here and never return."""
        self.config = config
        self.store = store or prompt_store(config)
        self.layout = Layout(target_tp=config.target_tp, draft_tp=config.draft_tp)
        self.load_s = joined.timeout_s if joined else LOAD_S  # start-up (and restart) limit
        self._fault: str | None = None  # a request failed with the groups out of step
        self._torchrun = joined.store if joined else torchrun_init(config, self.layout)
        self.pool = None if self._torchrun else WorkerPool(worker_entry, self.layout.world_size)
        self.watchdog = Watchdog(self.pool, self.layout.role)
        self.target, self.verifier = target, None
        self.link: DistTransport | None = None  # to the draft leader
        self.followers: GroupBroadcast | None = None  # to the target's tensor-parallel ranks
        self._closed = False

    def start(self) -> None:
        """Start the workers and join them. A failed message becomes an EngineFault that names its
        cause; any failure leaves the fault recorded, so that the next recover() tries again."""
        try:
            with self.watchdog.watch("start-up", self.load_s):
                self._start()
        except LinkError as exc:
            raise self._fail(f"the async workers did not start: {self._cause(exc)}") from None
        except Exception as exc:
            self._fail(f"the async workers did not start: {type(exc).__name__}: {exc}")
            raise

    def _start(self) -> None:
        """Spawn the workers, join both groups, load the target (again only when its shards need the
        new tensor-parallel group) and wait until every rank has loaded its model."""
        rendezvous = self._torchrun or self._spawn()
        groups = init_groups(self.layout, 0, backend(self.config), rendezvous, self.load_s)
        if self.target is None or self.layout.target_tp > 1:
            self.target = self.verifier = None  # free the old shard first
            load = rank_load(self.config.target_load, groups)
            self.target = load_target(self.config.target, load, groups.parallel)
        if self.verifier is None:
            self.verifier = TreeVerifier(self.target.model, self.config.target_load.max_seq_len,
                                         self.config.tree.verify_size, self.store)
        self.link = DistTransport(self.layout.draft_leader)
        tp_group = groups.parallel.group
        self.followers = GroupBroadcast(tp_group, 0) if self.layout.target_tp > 1 else None
        all_ready()

    def _spawn(self) -> dist.Store:
        """Start the workers and wait until each has joined the meeting point (a worker that dies
        first fails the start-up at once; init_groups itself cannot be left before its timeout)."""
        store = meeting_point(self.layout.world_size, self.load_s)
        self.pool.spawn(self.config, self.layout, store.port)
        log.info("async workers: %s", ", ".join(f"rank {rank} ({self.layout.role(rank)}) pid {pid}"
                                                for rank, pid in self.pool.pids.items()))
        while joined(store) < self.layout.world_size - 1:
            if self.watchdog.fault is not None:
                raise LinkError("a worker did not join")
            time.sleep(POLL_S)
        return store

    @property
    def fault(self) -> str | None:
        """Why the engine cannot serve until recover() (a worker died or hung); None when it can."""
        return self._fault or self.watchdog.fault

    def recover(self) -> bool:
        """After a fault, restart the workers (raises EngineFault if that fails). True if it restarted."""
        fault = self.fault
        if fault is None:
            return False
        if self.pool is None:
            raise EngineFault(f"{fault}; workers started by torchrun cannot be respawned: restart the job")
        log.warning("restarting the async workers after: %s", fault)
        started = time.perf_counter()
        self.pool.stop(0.0)
        leave_groups()
        self._fault = None
        self.watchdog.clear()
        self.start()
        log.warning("async workers restarted in %.1f s", time.perf_counter() - started)
        return True

    def watch(self, phase: str, limit_s: float) -> contextlib.AbstractContextManager[None]:
        """The block must finish within limit_s, or the workers count as hung (distributed/supervisor.py)."""
        return self.watchdog.watch(phase, limit_s)

    @contextmanager
    def serving(self) -> Iterator[None]:
        """Around one request: fails at once while a fault stands, and turns a failure inside into a
        recorded fault (a failed message into an EngineFault that names its cause)."""
        fault = self.fault
        if fault is not None:
            raise EngineFault(f"the async workers are down ({fault}); the engine must recover first")
        try:
            yield
        except LinkError as exc:  # only a failed message is a lost contact
            raise self._fail(self._cause(exc)) from None
        except Exception as exc:  # keeps its type and message; the groups are out of step now
            self._fail(f"the last request failed with {type(exc).__name__}: {exc}")
            raise

    def _cause(self, exc: LinkError) -> str:
        """Why a message failed: what the watchdog saw (a worker died or hung), else lost contact."""
        deadline = time.monotonic() + CAUSE_GRACE_S
        while self.watchdog.fault is None and self.pool is not None and time.monotonic() < deadline:
            time.sleep(POLL_S)
        return self.watchdog.fault or f"lost contact with the async workers: {exc}"

    def _fail(self, reason: str) -> EngineFault:
        """Record the fault and kill every worker (recover() starts fresh ones)."""
        self._fault = self._fault or reason
        if self.pool is not None:
            self.pool.kill()
        return EngineFault(reason)

    def close(self) -> None:
        """Shut the workers down (killed if they are out of step or slow to exit); leave the groups."""
        if self._closed:
            return
        self._closed = True
        healthy = self.target is not None and self.fault is None
        self.watchdog.close()
        if healthy:
            with contextlib.suppress(LinkError):
                self.link.send(Shutdown())
                if self.followers is not None:
                    self.followers.send(Shutdown())
                self.link.flush()
        if self.pool is not None:
            self.pool.stop(SHUTDOWN_S if healthy else 0.0)
            self.pool.close()
        leave_groups()
