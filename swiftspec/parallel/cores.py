"""This process's CPU cores: each async rank's share of them (plan_cores), and lanes, threads that
run work on a set of cores, pinned once when they start, for their whole life.

Linux affinity and torch's intra-op thread count (OpenMP's) are both a thread's own, so a process
whose phases want different cores gives each such phase a lane made when its engine starts, instead
of switching its thread's settings per request and back (which also leaves the thread pool that
OpenMP started earlier on the old cores).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

import torch

from swiftspec.kernels import cpu_ext
from swiftspec.parallel.groups import Layout
from swiftspec.parallel.numa import plan_groups, read_nodes

T = TypeVar("T")


def plan_cores(layout: Layout, rank: int, draft_cores: int) -> list[int]:
    """This rank's share of the CPU cores: the draft group gets draft_cores (default half), the
    target group the rest, each split evenly among the group's ranks. With several NUMA nodes each
    group takes the cores of its own node instead (parallel/numa.py)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) == 1:
        return cores
    numa = plan_groups(read_nodes(), draft_cores)  # several nodes: each group on its own node's cores
    if numa is not None:
        pool = numa.draft_cores if layout.role(rank) == "draft" else numa.target_cores
        return _share(pool, layout, rank)
    n_draft = min(max(1, draft_cores or len(cores) // 2), len(cores) - 1)
    pool = cores[len(cores) - n_draft :] if layout.role(rank) == "draft" else cores[: len(cores) - n_draft]
    return _share(pool, layout, rank)


def _share(pool: list[int], layout: Layout, rank: int) -> list[int]:
    """This rank's even share of its group's cores."""
    ranks = layout.target_tp if layout.role(rank) == "target" else layout.draft_tp
    share = max(1, len(pool) // ranks)
    start = ((rank - layout.leader(rank)) * share) % len(pool)
    return pool[start : start + share]


def pin(cores: list[int]) -> None:
    """Run the calling thread on `cores`, with its torch thread pool sized to match (the threads it
    starts later, OpenMP's among them, inherit the cores).  Called once per thread: an async worker's
    main thread when it starts, a lane's thread when it starts."""
    os.sched_setaffinity(0, cores)
    take_thread_count()
    torch.set_num_threads(len(cores))


def take_thread_count() -> int:
    """The calling thread's torch intra-op count, made its own now.  torch sets a thread's count at
    its first parallel call from each library (torch's, the kernels'), to the count last set by any
    thread: taken later, after another thread set its own, it would be that thread's count."""
    count = torch.get_num_threads()
    cpu_ext.take_thread_count()
    return count


class Lane:
    """A thread that runs work on `cores` (pin() once, when it starts); cores=None: the work runs on
    the calling thread, as that thread is set (nothing to pin, e.g. on CUDA).  One piece of work at
    a time, the caller waiting for it: no concurrency, only a place to run."""

    def __init__(self, cores: list[int] | None = None, name: str = "lane") -> None:
        self._thread: ThreadPoolExecutor | None = None
        if cores is not None:
            count = take_thread_count()  # the creating thread's, before the lane sets its own
            self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"swiftspec-{name}", initializer=pin,
                                              initargs=(cores,))
            self._thread.submit(int).result()  # the lane starts and pins itself now...
            torch.set_num_threads(count)  # ...then the count threads started later take is the creator's again

    def run(self, fn: Callable[..., T], *args: object) -> T:
        """fn(*args) on the lane; its result, or its exception raised here."""
        return fn(*args) if self._thread is None else self._thread.submit(fn, *args).result()

    def close(self) -> None:
        """End the thread (after the work in hand)."""
        if self._thread is not None:
            self._thread.shutdown()
