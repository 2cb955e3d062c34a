"""Tensor-parallel placement of one model replica (ParallelState) and the collectives its layers use.

Every torch.distributed call of the model runtime lives here; with tp_size == 1 none is made.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from swiftspec.errors import link_errors


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelState:
    """Where this process sits in its tensor-parallel group. Passed explicitly; never global."""

    tp_rank: int = 0
    tp_size: int = 1
    group: Any = None  # torch.distributed ProcessGroup of the TP ranks; None means the default group

    def __post_init__(self) -> None:
        if self.tp_size < 1 or not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"invalid tensor-parallel placement: rank {self.tp_rank} of {self.tp_size}")

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum x over the TP ranks, in place. Identity when tp_size == 1."""
        if self.tp_size > 1:
            with link_errors():
                dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's x along the last dim, in rank order. Identity when tp_size == 1."""
        if self.tp_size == 1:
            return x
        # list-based all_gather works on gloo too (all_gather_into_tensor does not everywhere)
        parts = [torch.empty_like(x) for _ in range(self.tp_size)]
        with link_errors():
            dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)
