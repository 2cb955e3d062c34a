"""The other ranks of the async engine: how a worker starts (spawned, or under torchrun), and the loops
of the draft group (leader and followers) and of the target group's tensor-parallel followers.
Each loop serves requests until `Shutdown`."""

from __future__ import annotations

import ctypes
import dataclasses
import os
import signal
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from swiftspec.config import NO_DRAFT, EngineConfig, LoadConfig
from swiftspec.distributed.protocol import (
    DistTransport,
    DraftTree,
    GroupBroadcast,
    Message,
    Profile,
    Shutdown,
    Start,
    Transport,
    Verified,
)
from swiftspec.distributed.supervisor import LOAD_S
from swiftspec.errors import UserError
from swiftspec.parallel.cores import Lane, pin, plan_cores
from swiftspec.parallel.groups import Groups, Layout, all_ready, init_groups, join
from swiftspec.runner.load import load_target
from swiftspec.speculate import LookupDrafter, TreeDrafter, TreeVerifier, load_drafter
from swiftspec.speculate.costs import RoundCosts, RoundTimes, promised
from swiftspec.trace import Timeline
from swiftspec.tree import mask_from_parents


@dataclass(frozen=True, slots=True, kw_only=True)
class DraftSettings:
    """What the draft loop needs besides its drafter and link."""

    verify_size: int  # bs
    prefill: Lane = field(default_factory=Lane)  # runs the prefill and the first expansion (target idle)


class GroupIO:
    """A rank's view of the link: the leader receives from the other group and relays each message
    to its followers; followers hear only the relay. Only the leader sends across groups."""

    def __init__(self, link: Transport | None, group: Transport | None) -> None:
        self.link = link  # None on followers
        self.group = group  # None when the group has one rank

    def recv(self) -> Message:
        if self.link is None:
            return self.group.recv()
        msg = self.link.recv()
        if self.group is not None:
            self.group.send(msg)
        return msg

    def send(self, msg: Message) -> None:
        if self.link is not None:
            self.link.send(msg)

    def ready(self) -> bool:
        """A single-rank group may stop drafting early once the verified tokens are in; a
        tensor-parallel group keeps its fixed depth so that every rank runs the same forwards."""
        return self.group is None and self.link.ready()


def draft_loop(drafter: TreeDrafter, io: GroupIO, settings: DraftSettings) -> None:
    """Draft group: for each request, keep growing the tree while the target verifies."""
    costs = RoundCosts()  # the verification-size rule's running costs, kept across requests
    while True:
        msg = io.recv()
        if isinstance(msg, Shutdown):
            return
        if isinstance(msg, Start):
            costs.verify_s = msg.verify_costs.tolist()
            _draft_request(drafter, io, msg, settings, costs)


@dataclass(frozen=True, slots=True)
class SentTree:
    """A tree on its way to the target: when its selection began, its size, and the tokens its
    nodes' path probabilities promised (for RoundCosts.trust)."""

    at: float
    nodes: int
    promised: float


def _draft_request(drafter: TreeDrafter, io: GroupIO, start: Start, settings: DraftSettings,
                   costs: RoundCosts) -> None:
    """Paper Algorithm 1, draft side: d expansions, rendezvous, re-root + compact, top-up, send.

    Re-rooting also grafts the prompt-lookup continuations at the new root, so a tree that the
    draft could not grow in time (the walk left it) still goes deep; the top-up expands only the
    root.  Drafting stops when the verified tokens arrive (io.ready): the tree's shape never decides
    a token, since sampled ones are position-keyed (sampling.Draws)."""
    timeline, bs = Timeline(), settings.verify_size
    settings.prefill.run(_first_tree, drafter, start, timeline)
    sent = _send_tree(drafter, io, bs, timeline, costs)
    while True:
        with timeline.span("expand"):
            drafter.draft(start.depth, stop=io.ready)  # overlaps the target's verification
        with timeline.span("wait_verified"):
            msg = io.recv()
        if not isinstance(msg, Verified) or msg.stop:
            break
        with timeline.span("reroot"):
            drafter.advance(msg.tokens.tolist())
        if drafter.size < bs or not drafter.tree.expanded[0]:
            with timeline.span("topup"):
                drafter.expand(width=1)
        if costs.verify_s:  # the round just verified, as seen from here
            costs.update(RoundTimes(draft_s=0.0, expansions=0, nodes=sent.nodes, verify_s=costs.verify_s[sent.nodes - 1],
                                    round_s=time.perf_counter() - sent.at, tokens=msg.tokens.numel(),
                                    promised=sent.promised))
        sent = _send_tree(drafter, io, bs, timeline, costs)
    io.send(Profile(seconds=timeline.busy_seconds(), events=timeline.as_tensor()))


def _first_tree(drafter: TreeDrafter, start: Start, timeline: Timeline) -> None:
    with timeline.span("prefill"):
        drafter.start(start.prompt.tolist(), start.first_token, start.params)
    with timeline.span("expand"):
        drafter.expand()  # the first tree: the root's children


def _send_tree(drafter: TreeDrafter, io: GroupIO, bs: int, timeline: Timeline, costs: RoundCosts) -> SentTree:
    """Send the best bs-node subtree; with the target's verify costs, only the nodes that repay
    their rows (tree.best_size, the round's other time and the draft's trust measured here)."""
    at = time.perf_counter()
    with timeline.span("select"):
        if costs.verify_s:
            sub = drafter.subtree(bs, costs.verify_costs(), costs.other_s, costs.trust())
            promise = promised(drafter.tree.weights, sub.nodes)
        else:
            sub, promise = drafter.subtree(bs), 0.0
    with timeline.span("send_tree"):
        io.send(DraftTree(tokens=sub.tokens, parents=sub.parents, depths=sub.depths))
    return SentTree(at, sub.tokens.numel(), promise)


def target_follower_loop(verifier: TreeVerifier, io: GroupIO) -> None:
    """Target tensor-parallel follower: mirror the leader's forwards and commits."""
    while True:
        msg = io.recv()
        if isinstance(msg, Shutdown):
            return
        if isinstance(msg, Start):
            verifier.prefill(msg.prompt.tolist(), reuse=False)  # as the leader: reuse is off under tensor parallelism
        elif isinstance(msg, DraftTree):
            verifier.forward_tree(msg.tokens, msg.depths, mask_from_parents(msg.parents))
        elif isinstance(msg, Verified):
            verifier.commit(msg.nodes)


def backend(config: EngineConfig) -> str:
    """Messages between groups are small CPU tensors (gloo); tensor parallelism on GPU uses NCCL."""
    return "cpu:gloo,cuda:nccl" if config.target_load.device.startswith("cuda") else "gloo"


def torchrun_init(config: EngineConfig, layout: Layout) -> str | None:
    """Under torchrun, join through its environment; ranks > 0 serve as workers, then exit."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    if int(os.environ["WORLD_SIZE"]) != layout.world_size:
        raise UserError(f"torchrun started {os.environ['WORLD_SIZE']} ranks; --target-tp + --draft-tp "
                        f"needs {layout.world_size}")
    rank = int(os.environ["RANK"])
    if rank:
        run_worker(config, layout, rank, "env://")
        sys.exit(0)
    return "env://"


def rank_load(load: LoadConfig, groups: Groups) -> LoadConfig:
    """load on this rank's own GPU when on CUDA (made the current device), else as it is."""
    if not load.device.startswith("cuda"):
        return load
    device = f"cuda:{groups.rank % torch.cuda.device_count()}"
    torch.cuda.set_device(device)
    return dataclasses.replace(load, device=device)


def worker_entry(rank: int, config: EngineConfig, layout: Layout, port: int, parent_pid: int) -> None:
    """A spawned rank: die with the front end, meet it at `port`, serve until Shutdown."""
    _die_with_parent(parent_pid)
    run_worker(config, layout, rank, join(port, layout.world_size, LOAD_S))


def run_worker(config: EngineConfig, layout: Layout, rank: int, rendezvous: str | dist.Store) -> None:
    """Join both groups, load this rank's model, tell the front end it is ready, run its loop.

    Cores (CPU): the process pins itself to its share once, for its life, before it loads its model
    (its memory then lands on its cores' NUMA node).  A lone draft rank also gets a lane on every
    core for the prefill and the first expansion, while the target waits for that first tree."""
    groups = init_groups(layout, rank, backend(config), rendezvous, LOAD_S)
    on_cpu = not config.target_load.device.startswith("cuda")
    all_cores = sorted(os.sched_getaffinity(0))
    if on_cpu:
        pin(plan_cores(layout, rank, config.draft_cores))
    group = GroupBroadcast(groups.parallel.group, groups.leader) if groups.parallel.tp_size > 1 else None
    io = GroupIO(DistTransport(groups.peer_leader) if groups.is_leader else None, group)
    if groups.role == "draft":
        drafter = _make_drafter(config, groups)
        prefill = Lane(all_cores if on_cpu and layout.draft_tp == 1 else None, "draft-prefill")
        settings = DraftSettings(verify_size=config.tree.verify_size, prefill=prefill)
        all_ready()
        draft_loop(drafter, io, settings)
        prefill.close()
    else:
        target = load_target(config.target, rank_load(config.target_load, groups), groups.parallel)
        verifier = TreeVerifier(target.model, config.target_load.max_seq_len, config.tree.verify_size)
        all_ready()
        target_follower_loop(verifier, io)
    dist.destroy_process_group()


def _make_drafter(config: EngineConfig, groups: Groups):
    """The draft group's drafter: over this rank's draft (load_drafter: a packed CPU draft comes from
    its cache entry), or prompt lookup alone (--draft-model none)."""
    if config.draft == NO_DRAFT:
        return LookupDrafter(config.tree)
    return load_drafter(config.draft, rank_load(config.draft_load, groups), config.tree,
                        config.target_load.max_seq_len, config.draft_vocab, groups.parallel).drafter


def _die_with_parent(parent_pid: int) -> None:
    """Linux: SIGKILL this worker when the front end exits, so no orphan survives it (also when the
    front end is killed, or this worker is stopped); exit now if the front end is already gone."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    if os.getppid() != parent_pid:
        os._exit(1)
