"""The async engine over a random pair, for benchmarks/gpu_check.py: this process leads the target group
(engines.async_engine.AsyncEngine, handed the target and an already linked draft), and the draft
group is a process of ours that builds its random draft from the same seed and runs the engine's
own draft loop (distributed.workers.draft_loop).  No weights pass through files.

On a GPU both groups share the device (two processes, two CUDA contexts); on the CPU each takes
its own cores: the target's rounds run on a lane pinned to its share, the draft process pins itself.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gpu_pair import PairShapes, Placement, RandomModel, make_drafter, random_model

from swiftspec.config import EngineConfig, LoadConfig, TreeConfig
from swiftspec.distributed.protocol import DistTransport
from swiftspec.distributed.workers import DraftSettings, GroupIO, backend, draft_loop
from swiftspec.engines.async_engine import AsyncEngine
from swiftspec.parallel.cores import Lane, pin
from swiftspec.parallel.groups import Layout, all_ready, init_groups, join, joined, meeting_point
from swiftspec.parallel.rendezvous import Joined

LINK_TIMEOUT_S = 120.0  # start-up and every message between the groups
JOIN_TIMEOUT_S = 120.0  # the draft process must reach the meeting point within this
DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float16: "float16"}


@dataclass(frozen=True, slots=True, kw_only=True)
class DraftJob:
    """Everything the draft process needs (pickled to it)."""

    config: EngineConfig
    shapes: PairShapes
    place: Placement
    draft_vocab: int
    cores: tuple[int, ...] | None  # CPU: the draft group's cores; None on a GPU
    port: int  # the meeting point's


def engine_config(tree: TreeConfig, place: Placement, max_seq_len: int) -> EngineConfig:
    """The async engine's config for a random pair (its model names are never loaded)."""
    load = LoadConfig(device=place.device, dtype=DTYPE_NAMES[place.dtype], max_seq_len=max_seq_len,
                      weights=place.weights)
    return EngineConfig(mode="async", target="random", draft="random", target_load=load, draft_load=load, tree=tree)


def draft_process(job: DraftJob) -> None:
    """The draft group's one rank: join, build and pack the random draft, serve until Shutdown
    (distributed.workers.run_worker with a random draft in place of a loaded one)."""
    all_cores = sorted(os.sched_getaffinity(0))
    store = join(job.port, 2, LINK_TIMEOUT_S)
    groups = init_groups(Layout(), 1, backend(job.config), store, LINK_TIMEOUT_S)
    if job.cores is not None:
        pin(list(job.cores))
    if job.place.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(job.place.device).index or 0)
    draft = random_model(job.shapes.draft, job.place)
    drafter = make_drafter(draft, job.config.tree, job.config.target_load.max_seq_len, job.place.weights,
                           job.draft_vocab)
    prefill = Lane(all_cores if job.cores is not None else None, "draft-prefill")
    all_ready()
    draft_loop(drafter, GroupIO(DistTransport(groups.peer_leader), None),
               DraftSettings(verify_size=job.config.tree.verify_size, prefill=prefill))
    prefill.close()
    dist.destroy_process_group()


@contextmanager
def async_engine(target: RandomModel, job: DraftJob, target_cores: list[int] | None) -> Iterator[AsyncEngine]:
    """An AsyncEngine over `target` and a draft process started from job (its port is filled in);
    both are shut down on exit."""
    store = meeting_point(2, LINK_TIMEOUT_S)
    job = DraftJob(config=job.config, shapes=job.shapes, place=job.place, draft_vocab=job.draft_vocab,
                   cores=job.cores, port=store.port)
    proc = mp.get_context("spawn").Process(target=draft_process, args=(job,), daemon=True, name="gpu-check-draft")
    proc.start()
    engine = None
    try:
        _wait_joined(store, proc)
        engine = AsyncEngine(job.config, joined=Joined(store=store, timeout_s=LINK_TIMEOUT_S, cores=target_cores),
                             target=target)
        yield engine
    finally:
        if engine is not None:
            engine.close()
        proc.join(30.0)
        if proc.is_alive():
            proc.kill()
            proc.join()


def _wait_joined(store: dist.Store, proc) -> None:  # proc: multiprocessing.Process
    """Wait until the draft process has reached the meeting point; fail fast if it died first."""
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while joined(store) < 1:
        if not proc.is_alive():
            raise RuntimeError(f"the draft process exited with code {proc.exitcode} before joining")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the draft process did not join within {JOIN_TIMEOUT_S:.0f} s")
        time.sleep(0.05)
