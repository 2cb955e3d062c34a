"""Lanes: work runs on a thread pinned once to its cores; the caller's thread keeps its settings."""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass

import pytest
import torch

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
def test_a_lane_keeps_its_count_when_another_sets_one() -> None:
    """torch hands a thread's first use the count last set by any thread: pin() takes it first."""
    cores = sorted(os.sched_getaffinity(0))
    with contextlib.closing(Lane(cores[:1], "one")) as one, contextlib.closing(Lane(cores, "all")) as every:
        one.run(lambda: None)
        assert every.run(torch.get_num_threads) == len(cores)
        assert one.run(_count_after_work) == 1


def _count_after_work() -> int:
    torch.exp(torch.ones(1 << 20))  # intra-op parallel
    return torch.get_num_threads()
