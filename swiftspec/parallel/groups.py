"""Process groups of the disaggregated engine: a target group and a draft group, each tensor-parallel.

Global ranks [0, T) form the target group (rank 0 leads it and decides the tokens); ranks
[T, T + D) form the draft group (rank T leads it). Only the two leaders talk across groups.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch.distributed as dist

from swiftspec.parallel.state import ParallelState


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


def init_groups(layout: Layout, rank: int, backend: str, init_method: str, timeout_s: float) -> Groups:
    """Join the world and build both tensor-parallel groups (every rank must create every group)."""
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=layout.world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    target = dist.new_group(list(range(layout.target_tp)))
    draft = dist.new_group(list(range(layout.target_tp, layout.world_size)))
    mine = target if layout.role(rank) == "target" else draft
    size = layout.target_tp if layout.role(rank) == "target" else layout.draft_tp
    tp_rank = rank - layout.leader(rank)
    return Groups(rank, layout, ParallelState(tp_rank=tp_rank, tp_size=size, group=mine if size > 1 else None))


def place_threads(layout: Layout, rank: int, draft_cores: int) -> list[int]:
    """Pin this rank to its share of the CPU cores (draft group: draft_cores, default half; target:
    the rest; split evenly among a group's ranks) and size torch's thread pool to match."""
    import os

    import torch

    cores = sorted(os.sched_getaffinity(0))
    n_draft = min(max(1, draft_cores or len(cores) // 2), max(1, len(cores) - 1)) if len(cores) > 1 else 1
    pools = {"draft": cores[len(cores) - n_draft:], "target": cores[: max(1, len(cores) - n_draft)]}
    pool = pools[layout.role(rank)]
    ranks = layout.target_tp if layout.role(rank) == "target" else layout.draft_tp
    index = rank - layout.leader(rank)
    share = max(1, len(pool) // ranks)
    mine = pool[(index * share) % len(pool):][:share] or pool[:1]
    os.sched_setaffinity(0, mine)
    torch.set_num_threads(len(mine))
    return mine
