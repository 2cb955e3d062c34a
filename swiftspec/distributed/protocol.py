"""Typed messages between the target and draft groups, and the transports that carry them.

Vocabulary: the *target leader* (global rank 0) verifies and decides the tokens; the *draft
leader* (global rank T) grows the tree. Only these cross between the groups: `Start` (a request's
prompt, first token and sampling settings), `DraftTree` (the best bs-node subtree),
`Verified` (the tokens emitted by a verification; `stop` ends the request), `Profile`, and
`Shutdown`. Across hosts, each side first sends its `hello` (parallel/rendezvous.py's handshake). A failed send or receive raises LinkError. Every message is encoded as CPU int64/float64 tensors (gloo, also on GPU machines): a fixed-size header whose first
entry is the message kind, then payload tensors whose sizes the header gives. Nothing is pickled.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol, Union

import torch
import torch.distributed as dist

from swiftspec.config import EngineConfig
from swiftspec.errors import link_errors
from swiftspec.parallel.rendezvous import Hello, tokenizer_digest
from swiftspec.sampling import SamplingParams

HEADER = 8
BEAT_KEY = "beat"  # the draft host counts up this store key while idle: the target sees it is alive


def hello(role: str, tokenizer, config: EngineConfig) -> Hello:  # tokenizer: swiftspec.tokenizer.Tokenizer
    load = config.target_load if role == "target" else config.draft_load
    return Hello(role=role, tokenizer=tokenizer_digest(tokenizer), verify_size=config.tree.verify_size,
                 max_seq_len=load.max_seq_len)


class Kind(IntEnum):
    START = 1
    TREE = 2
    VERIFIED = 3
    PROFILE = 4
    SHUTDOWN = 5


@dataclass(frozen=True, slots=True)
class Start:
    """Begin a request: the draft prefills `prompt` and plants a tree at `first_token`."""

    prompt: torch.Tensor  # [L] int64
    first_token: int
    depth: int  # d: draft expansions per round
    params: SamplingParams
    # [bs] float64: the target's seconds to verify 1..bs nodes, for the verification-size rule
    # (speculate/costs.py); empty: always send bs nodes (no cost rule: adaptive verification off)
    verify_costs: torch.Tensor = torch.zeros(0, dtype=torch.float64)


@dataclass(frozen=True, slots=True)
class DraftTree:
    """A subtree to verify, root (the last verified token) first; parents[i] < i."""

    tokens: torch.Tensor  # [n] int64
    parents: torch.Tensor  # [n] int64, parents[0] = -1
    depths: torch.Tensor  # [n] int64


@dataclass(frozen=True, slots=True)
class Verified:
    """The tokens one verification emitted (accepted drafts, then the bonus); stop ends the request.

    nodes are the accepted subtree indices (root first), which tensor-parallel followers commit.
    """

    tokens: torch.Tensor  # [a + 1] int64
    nodes: torch.Tensor  # [a + 1] int64
    stop: bool


@dataclass(frozen=True, slots=True)
class Profile:
    """The draft's report after a request stops: its busy seconds and its timeline spans.

    events rows are (span code, start, end) in seconds since the epoch; see swiftspec/trace.py.
    """

    seconds: float = 0.0
    events: torch.Tensor = torch.zeros(0, 3, dtype=torch.float64)  # [n, 3] float64


@dataclass(frozen=True, slots=True)
class Shutdown:
    """Workers exit."""


Message = Union[Start, DraftTree, Verified, Profile, Shutdown]


def encode(msg: Message) -> list[torch.Tensor]:
    """Header [HEADER] int64 followed by the payload tensors."""
    head = torch.zeros(HEADER, dtype=torch.long)
    if isinstance(msg, Start):
        p = msg.params
        head[:7] = torch.tensor([Kind.START, msg.prompt.numel(), msg.first_token, msg.depth,
                                 int(p.seed is not None), p.seed or 0, msg.verify_costs.numel()])
        floats = torch.tensor([p.temperature, p.top_p, float(p.top_k), p.min_p], dtype=torch.float64)
        return [head, floats, msg.prompt.long().cpu(), msg.verify_costs.double().cpu()]
    if isinstance(msg, DraftTree):
        head[:2] = torch.tensor([Kind.TREE, msg.tokens.numel()])
        return [head, torch.stack([msg.tokens, msg.parents, msg.depths]).long().cpu()]
    if isinstance(msg, Verified):
        head[:3] = torch.tensor([Kind.VERIFIED, msg.tokens.numel(), int(msg.stop)])
        return [head, torch.stack([msg.tokens, msg.nodes]).long().cpu()]
    if isinstance(msg, Profile):
        head[:2] = torch.tensor([Kind.PROFILE, msg.events.shape[0]])
        return [head, torch.tensor([msg.seconds], dtype=torch.float64), msg.events.double().reshape(-1, 3)]
    head[0] = Kind.SHUTDOWN
    return [head]


def payload_shapes(head: torch.Tensor) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """Shapes and dtypes of the tensors that follow a header."""
    kind, n = Kind(int(head[0])), int(head[1])
    if kind == Kind.START:
        return [((4,), torch.float64), ((n,), torch.long), ((int(head[6]),), torch.float64)]
    if kind == Kind.TREE:
        return [((3, n), torch.long)]
    if kind == Kind.VERIFIED:
        return [((2, n), torch.long)]
    if kind == Kind.PROFILE:
        return [((1,), torch.float64), ((n, 3), torch.float64)]
    return []


def decode(head: torch.Tensor, payload: list[torch.Tensor]) -> Message:
    kind = Kind(int(head[0]))
    if kind == Kind.START:
        f = payload[0].tolist()
        seed = int(head[5]) if int(head[4]) else None
        params = SamplingParams(temperature=f[0], top_p=f[1], top_k=int(f[2]), min_p=f[3], seed=seed)
        return Start(prompt=payload[1], first_token=int(head[2]), depth=int(head[3]), params=params,
                     verify_costs=payload[2])
    if kind == Kind.TREE:
        tokens, parents, depths = payload[0]
        return DraftTree(tokens=tokens, parents=parents, depths=depths)
    if kind == Kind.VERIFIED:
        return Verified(tokens=payload[0][0], nodes=payload[0][1], stop=bool(int(head[2])))
    if kind == Kind.PROFILE:
        return Profile(seconds=float(payload[0][0]), events=payload[1])
    return Shutdown()


class Transport(Protocol):
    """A point-to-point link between the two group leaders (or a leader and its followers)."""

    def send(self, msg: Message) -> None: ...

    def recv(self) -> Message: ...

    def ready(self) -> bool:
        """True when a message has arrived, so that recv() will not block."""
        ...


class DistTransport:
    """torch.distributed point-to-point (gloo on CPU, NCCL on CUDA) between two global ranks."""

    def __init__(self, peer: int) -> None:
        self.peer = peer
        self._head = torch.empty(HEADER, dtype=torch.long)
        self._posted: dist.Work | None = None  # an irecv of the next header, once ready() asked
        self._sending: list[dist.Work] = []  # the previous message's isends
        self._buffers: list[torch.Tensor] = []  # ... and their tensors, alive until sent

    def send(self, msg: Message) -> None:
        """Non-blocking: the sender goes on while the peer is still busy; the previous message's
        sends are completed first, so messages never overtake each other."""
        self.flush()
        self._buffers = encode(msg)
        with link_errors():
            self._sending = [dist.isend(t, dst=self.peer) for t in self._buffers]

    def flush(self) -> None:
        with link_errors():
            for work in self._sending:
                work.wait()
        self._sending, self._buffers = [], []

    def ready(self) -> bool:
        """True once the next message's header has begun to arrive (recv() then waits for all of it).
        gloo's Work.is_completed() stays False until wait(), so the header buffer is read instead:
        it is zeroed before the receive is posted, and every message kind is nonzero."""
        if self._posted is None:
            self._head.zero_()
            with link_errors():
                self._posted = dist.irecv(self._head, src=self.peer)
        return self._posted.is_completed() or bool(self._head[0] != 0)

    def recv(self) -> Message:
        with link_errors():
            if self._posted is None:
                dist.recv(self._head, src=self.peer)
            else:
                self._posted.wait()
                self._posted = None
            head = self._head.clone()
            payload = [torch.empty(s, dtype=d) for s, d in payload_shapes(head)]
            for t in payload:
                dist.recv(t, src=self.peer)
        return decode(head, payload)


class GroupBroadcast:
    """The leader shares each message with its tensor-parallel followers (dist.broadcast)."""

    def __init__(self, group: dist.ProcessGroup, leader: int) -> None:
        self.group = group
        self.leader = leader

    def send(self, msg: Message) -> None:
        with link_errors():
            for t in encode(msg):
                dist.broadcast(t, src=self.leader, group=self.group)

    def ready(self) -> bool:
        return False  # followers must mirror the leader step for step, never skip ahead

    def recv(self) -> Message:
        head = torch.empty(HEADER, dtype=torch.long)
        with link_errors():
            dist.broadcast(head, src=self.leader, group=self.group)
            payload = [torch.empty(s, dtype=d) for s, d in payload_shapes(head)]
            for t in payload:
                dist.broadcast(t, src=self.leader, group=self.group)
        return decode(head, payload)


class LocalTransport:
    """Both ends in one process (threads), for tests: messages still go through encode/decode."""

    def __init__(self, outbox: "queue.Queue[list[torch.Tensor]]", inbox: "queue.Queue[list[torch.Tensor]]") -> None:
        self.outbox = outbox
        self.inbox = inbox

    @staticmethod
    def pair() -> tuple["LocalTransport", "LocalTransport"]:
        a, b = queue.Queue(), queue.Queue()
        return LocalTransport(a, b), LocalTransport(b, a)

    def send(self, msg: Message) -> None:
        self.outbox.put([t.clone() for t in encode(msg)])

    def recv(self) -> Message:
        head, *payload = self.inbox.get()
        return decode(head, payload)

    def ready(self) -> bool:
        return not self.inbox.empty()
