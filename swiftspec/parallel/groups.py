"""Process groups of the disaggregated engine: a target group and a draft group, each tensor-parallel.

Global ranks [0, T) form the target group (rank 0 leads it and decides the tokens); ranks
[T, T + D) form the draft group (rank T leads it). Only the two leaders talk across groups.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed import distributed_c10d

from swiftspec.errors import link_errors
from swiftspec.parallel.state import ParallelState

_JOINED = "swiftspec/joined"  # meeting-point key: workers that have joined


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """How many ranks each group has."""

    target_tp: int = 1
    draft_tp: int = 1

    @property
    def world_size(self) -> int:
        return self.target_tp + self.draft_tp

    @property
    def draft_leader(self) -> int:
        return self.target_tp

    def role(self, rank: int) -> str:
        return "target" if rank < self.target_tp else "draft"

    def leader(self, rank: int) -> int:
        return 0 if rank < self.target_tp else self.target_tp


@dataclass(frozen=True, slots=True)
class Groups:
    """This rank's place in the layout."""

    rank: int
    layout: Layout
    parallel: ParallelState  # the tensor-parallel group this rank's model shards over

    @property
    def role(self) -> str:
        return self.layout.role(self.rank)

    @property
    def leader(self) -> int:
        return self.layout.leader(self.rank)

    @property
    def is_leader(self) -> bool:
        return self.rank == self.leader

    @property
    def peer_leader(self) -> int:
        """The other group's leader (the only cross-group peer)."""
        return self.layout.draft_leader if self.role == "target" else 0


def init_groups(layout: Layout, rank: int, backend: str, rendezvous: str | dist.Store, timeout_s: float) -> Groups:
    """Join the world and build both tensor-parallel groups (every rank must create every group).
    rendezvous: an init_method URL (torchrun: env://), or the store of meeting_point()/join()."""
    where = {"init_method": rendezvous} if isinstance(rendezvous, str) else {"store": rendezvous}
    with link_errors():
        dist.init_process_group(backend, rank=rank, world_size=layout.world_size,
                                timeout=datetime.timedelta(seconds=timeout_s), **where)
        target = dist.new_group(list(range(layout.target_tp)))
        draft = dist.new_group(list(range(layout.target_tp, layout.world_size)))
    mine = target if layout.role(rank) == "target" else draft
    size = layout.target_tp if layout.role(rank) == "target" else layout.draft_tp
    tp_rank = rank - layout.leader(rank)
    return Groups(rank, layout, ParallelState(tp_rank=tp_rank, tp_size=size, group=mine if size > 1 else None))


def meeting_point(world_size: int, timeout_s: float) -> dist.TCPStore:
    """Rank 0's rendezvous store, on a loopback port the OS picks as it binds (a port probed first
    and bound later may be taken by another process in between)."""
    with link_errors():
        return dist.TCPStore("127.0.0.1", 0, world_size, is_master=True,
                             timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)


def join(port: int, world_size: int, timeout_s: float) -> dist.TCPStore:
    """A worker's side of meeting_point(): connect, and count itself in (see joined())."""
    with link_errors():
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False,
                              timeout=datetime.timedelta(seconds=timeout_s))
        store.add(_JOINED, 1)
    return store


def joined(store: dist.Store) -> int:
    """Workers that have joined: rank 0 waits for all before init_groups, which it cannot leave early."""
    with link_errors():
        return store.add(_JOINED, 0)


def leave_groups() -> None:
    """Destroy this process's groups, so that it can build new ones with fresh workers.

    torch counts the default group into the names of later groups before its rendezvous; when that
    init fails, no group exists to destroy and the count is never reset, so the next init would name
    its groups unlike fresh workers do, and each side would wait for the other's keys forever."""
    if dist.is_initialized():
        dist.destroy_process_group()
    else:
        distributed_c10d._world.group_count = 0


def all_ready() -> None:
    """Every rank of the world waits here until all have arrived (after loading their models)."""
    with link_errors():
        dist.barrier()
