"""The loops of the async engine's other ranks: the draft group (leader and followers) and the
target group's tensor-parallel followers. Each loop serves requests until `Shutdown`."""

from __future__ import annotations

import contextlib

from swiftspec.draft import TreeDrafter
from swiftspec.parallel.groups import pinned
from swiftspec.runtime.protocol import DraftTree, Message, Profile, Shutdown, Start, Transport, Verified
from swiftspec.runtime.target import TreeVerifier
from swiftspec.tree import mask_from_parents
from swiftspec.runtime.trace import Timeline


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


def draft_loop(drafter: TreeDrafter, io: GroupIO, verify_size: int, prefill_cores: list[int] | None = None) -> None:
    """Draft group: for each request, keep growing the tree while the target verifies.
    prefill_cores: CPU cores for the prompt prefill and first expansion, when the target is idle."""
    while True:
        msg = io.recv()
        if isinstance(msg, Shutdown):
            return
        if isinstance(msg, Start):
            _draft_request(drafter, io, msg, verify_size, prefill_cores)


def _draft_request(drafter: TreeDrafter, io: GroupIO, start: Start, bs: int, prefill_cores: list[int] | None) -> None:
    """Paper Algorithm 1, draft side: d expansions, rendezvous, re-root + compact, top-up, send.

    Re-rooting also grafts the prompt-lookup continuations at the new root, so a tree that the
    draft could not grow in time (the walk left it) still goes deep; the top-up expands only the
    root.  A seeded sampled request always runs all d expansions: the tree's shape decides which
    random draws verification makes, so it must not depend on when the verified tokens arrive."""
    timeline = Timeline()
    params = start.params
    stop = None if params.seed is not None and not params.greedy else io.ready
    with pinned(prefill_cores) if prefill_cores else contextlib.nullcontext():
        with timeline.span("prefill"):
            drafter.start(start.prompt.tolist(), start.first_token, start.params)
        with timeline.span("expand"):
            drafter.expand()  # the first tree: the root's children
    _send_tree(drafter, io, bs, timeline)
    while True:
        with timeline.span("expand"):
            drafter.draft(start.depth, stop=stop)  # overlaps the target's verification
        with timeline.span("wait_verified"):
            msg = io.recv()
        if not isinstance(msg, Verified) or msg.stop:
            break
        with timeline.span("reroot"):
            drafter.advance(msg.tokens.tolist())
        if drafter.size < bs or not drafter.tree.expanded[0]:
            with timeline.span("topup"):
                drafter.expand(width=1)
        _send_tree(drafter, io, bs, timeline)
    io.send(Profile(seconds=timeline.busy_seconds(), events=timeline.as_tensor()))


def _send_tree(drafter: TreeDrafter, io: GroupIO, bs: int, timeline: Timeline) -> None:
    with timeline.span("select"):
        sub = drafter.subtree(bs)
    with timeline.span("send_tree"):
        io.send(DraftTree(tokens=sub.tokens, parents=sub.parents, depths=sub.depths))


def target_follower_loop(verifier: TreeVerifier, io: GroupIO) -> None:
    """Target tensor-parallel follower: mirror the leader's forwards and commits."""
    while True:
        msg = io.recv()
        if isinstance(msg, Shutdown):
            return
        if isinstance(msg, Start):
            verifier.prefill(msg.prompt.tolist())
        elif isinstance(msg, DraftTree):
            verifier.forward_tree(msg.tokens, msg.depths, mask_from_parents(msg.parents))
        elif isinstance(msg, Verified):
            verifier.commit(msg.nodes)
            if msg.stop:
                verifier.runner.kv.reset()
