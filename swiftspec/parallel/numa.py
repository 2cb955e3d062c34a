"""Placement of the two groups on a host with several NUMA nodes: each group takes its cores from its own
node, so that it reads its weights over its own memory bus. Memory follows by first touch: a rank pins
itself to its cores before it loads its model (distributed/workers.run_worker), and Linux places the
pages it writes on the node it runs on. Planning is pure; reading the topology is one function.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

NODE_ROOT = Path("/sys/devices/system/node")


@dataclass(frozen=True, slots=True, kw_only=True)
class NumaPlan:
    """Which node and cores each group gets (None: one node, nothing to separate)."""

    target_node: int
    draft_node: int
    target_cores: list[int]
    draft_cores: list[int]

    def line(self) -> str:
        return (f"numa: target group on node {self.target_node} (cores {_span(self.target_cores)}), "
                f"draft group on node {self.draft_node} (cores {_span(self.draft_cores)})")


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]"""
    cores: list[int] = []
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            cores += range(int(lo), int(hi or lo) + 1)
    return cores


def _span(cores: list[int]) -> str:
    return f"{cores[0]}-{cores[-1]}" if len(cores) > 1 and cores == list(range(cores[0], cores[-1] + 1)) else \
        ",".join(map(str, cores))


def read_nodes(root: Path = NODE_ROOT, allowed: set[int] | None = None) -> dict[int, list[int]]:
    """node -> the cores of it this process may run on (nodes without such cores left out)."""
    allowed = set(os.sched_getaffinity(0)) if allowed is None else allowed
    nodes: dict[int, list[int]] = {}
    for path in sorted(root.glob("node[0-9]*")):
        try:
            cores = [c for c in parse_cpulist((path / "cpulist").read_text()) if c in allowed]
        except OSError:
            continue
        if cores:
            nodes[int(path.name[4:])] = cores
    return nodes


def plan_groups(nodes: dict[int, list[int]], draft_cores: int = 0) -> NumaPlan | None:
    """The target group gets the node with the most cores (the lower number on a tie), the draft group
    the next; draft_cores > 0 caps the draft's share of its node. None with fewer than two nodes."""
    if len(nodes) < 2:
        return None
    order = sorted(nodes, key=lambda n: (-len(nodes[n]), n))
    target, draft = order[0], order[1]
    share = nodes[draft][: draft_cores] if draft_cores > 0 else nodes[draft]
    return NumaPlan(target_node=target, draft_node=draft, target_cores=list(nodes[target]), draft_cores=list(share))


def placement_line(nodes: dict[int, list[int]], draft_cores: int = 0) -> str:
    """One line for `swiftspec info`: the NUMA nodes and where each async group runs."""
    plan = plan_groups(nodes, draft_cores)
    if plan is None:
        return f"numa: {len(nodes) or 1} node: async groups split its cores (they share one memory bus)"
    return plan.line()
