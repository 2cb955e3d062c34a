"""Lanes: work runs on a thread pinned once to its cores; the caller's thread keeps its settings."""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
import torch

from swiftspec.kernels import cpu_ext
from swiftspec.parallel.cores import Lane


@dataclass(frozen=True)
class Seat:
    thread: int
    cores: list[int]
    threads: int  # torch's intra-op count


def _where() -> Seat:
    return Seat(threading.get_ident(), sorted(os.sched_getaffinity(0)), torch.get_num_threads())


def test_a_lane_runs_on_its_cores_and_leaves_the_caller_alone() -> None:
    cores = sorted(os.sched_getaffinity(0))
    before = _where()
    with contextlib.closing(Lane(cores[:1], "test")) as lane:
        seat = lane.run(_where)
        assert seat.thread != before.thread and seat.cores == cores[:1] and seat.threads == 1
        assert lane.run(_where) == seat  # one thread, set once
    assert _where() == before


def test_the_default_lane_is_the_calling_thread() -> None:
    assert Lane().run(_where) == _where()


def test_a_lane_raises_its_work_s_exception_in_the_caller() -> None:
    with contextlib.closing(Lane(sorted(os.sched_getaffinity(0))[:1], "test")) as lane:
        with pytest.raises(ZeroDivisionError):
            lane.run(lambda: 1 / 0)
        assert lane.run(lambda: 7) == 7


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
@pytest.mark.parametrize("work", ["torch", "kernels"])
def test_a_lane_keeps_its_count_when_another_sets_one(work: str) -> None:
    """torch hands a thread, at its first parallel call of each library, the count last set by any
    thread: pin() takes torch's and the kernels' first."""
    if work == "kernels" and cpu_ext.load() is None:
        pytest.skip("no C++ kernels here")
    cores = sorted(os.sched_getaffinity(0))
    with contextlib.closing(Lane(cores[:1], "one")) as one, contextlib.closing(Lane(cores, "all")) as every:
        one.run(lambda: None)
        assert every.run(torch.get_num_threads) == len(cores)
        assert one.run(_count_after, work) == 1


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_threads_started_after_a_lane_take_the_creator_s_count() -> None:
    """A lane's own count is not what a later thread (a server's request thread) starts with."""
    count = torch.get_num_threads()
    with contextlib.closing(Lane(sorted(os.sched_getaffinity(0))[:1], "one")):
        with ThreadPoolExecutor(1) as later:
            assert later.submit(_count_after, "torch").result() == count


def _count_after(work: str) -> int:
    """This thread's torch count after an intra-op parallel call, by torch or by the kernels."""
    x = torch.ones(64, 4096)
    if work == "torch":
        torch.exp(x)
    else:
        cpu_ext.rms_norm(x.to(torch.bfloat16), torch.ones(4096, dtype=torch.bfloat16), 1e-6)
    return torch.get_num_threads()
