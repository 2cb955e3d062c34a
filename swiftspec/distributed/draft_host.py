"""async across hosts, the draft host's side: `swiftspec worker --role draft` loads the draft, links
to the target host (parallel/rendezvous.py), drafts for it (distributed/workers.draft_loop) until the
link ends, and links again.  Between requests it beats, so that the target host sees it is alive.
The target host's side: engines/remote.py.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from swiftspec.config import NO_DRAFT, EngineConfig, require_settled
from swiftspec.distributed.protocol import BEAT_KEY, DistTransport, Message, Shutdown, Start, Verified, hello
from swiftspec.distributed.workers import DraftSettings, draft_loop
from swiftspec.errors import LinkError, UserError, link_errors
from swiftspec.parallel.groups import Layout, all_ready, init_groups, leave_groups
from swiftspec.parallel.rendezvous import Joined, connect, read_secret
from swiftspec.speculate import load_drafter
from swiftspec.weights.loader import model_args
from swiftspec.weights.source import resolve_source

log = logging.getLogger(__name__)
BEAT_S = 1.0  # how often an idle draft host beats (and checks that the target's store still answers)
IDLE_POLL_S = 0.002  # how often an idle draft host looks for the next request
RETRY_S = 1.0  # how often a draft host tries to reach a target host that does not answer


class DraftHostIO:
    """The draft leader's link to a remote target: between requests it polls for the next message
    (a blocking receive would time out on an idle target) and beats; inside one it blocks, and the
    process group's timeout turns a stalled link into LinkError."""

    group = None  # the draft host runs one rank

    def __init__(self, link: DistTransport, joined: Joined) -> None:
        self.link, self.store = link, joined.store
        self.busy = False

    def recv(self) -> Message:
        if not self.busy:
            self._idle()
        msg = self.link.recv()
        if isinstance(msg, Start):
            self.busy = True
        elif isinstance(msg, Shutdown) or (isinstance(msg, Verified) and msg.stop):
            self.busy = False
        return msg

    def _idle(self) -> None:
        next_beat = 0.0
        while not self.link.ready():
            if time.monotonic() >= next_beat:
                with link_errors():  # fails once the target host (which holds the store) is gone
                    self.store.add(BEAT_KEY, 1)
                next_beat = time.monotonic() + BEAT_S
            time.sleep(IDLE_POLL_S)

    def send(self, msg: Message) -> None:
        self.link.send(msg)

    def ready(self) -> bool:
        return self.link.ready()


def serve_draft(config: EngineConfig, once: bool = False) -> int:
    """`swiftspec worker --role draft`: load the draft, then link to the target host, draft for it
    until it leaves, and link again (once: return after the first link ends).  config: settled by
    engines.defaults.resolve_defaults (its draft context, when 0, is settled here)."""
    remote = config.remote
    if config.draft == NO_DRAFT:
        raise UserError("a draft host needs a draft model (--draft-model)")
    require_settled(config)
    if not config.draft_load.max_seq_len:  # the draft's own context: at least what a target host of the pair takes
        length = model_args(resolve_source(config.draft)).max_position_embeddings
        config = dataclasses.replace(config, draft_load=dataclasses.replace(config.draft_load, max_seq_len=length))
    secret = read_secret(remote.secret_file)
    draft = load_drafter(config.draft, config.draft_load, config.tree, config.draft_load.max_seq_len,
                         config.draft_vocab)
    drafter = draft.drafter
    mine = hello("draft", draft.loaded.tokenizer, config)
    settings = DraftSettings(verify_size=config.tree.verify_size)
    waiting_said = False
    while True:
        try:
            joined = connect(remote.rendezvous, secret, mine, remote.link_timeout)
        except (OSError, LinkError) as exc:  # nobody listens there yet, or it went away mid-handshake
            if not waiting_said:
                log.warning("draft host: waiting for the target host at %s (%s)", remote.rendezvous, exc)
                waiting_said = True
            time.sleep(RETRY_S)
            continue
        waiting_said = False
        log.warning("draft host: linked to the target host at %s", remote.rendezvous)
        try:
            init_groups(Layout(), 1, "gloo", joined.store, joined.timeout_s)
            all_ready()
            draft_loop(drafter, DraftHostIO(DistTransport(0), joined), settings)
            log.warning("draft host: the target host closed the link; waiting for it again")
        except LinkError as exc:
            log.warning("draft host: lost the target host (%s); waiting for it again", exc)
        finally:
            leave_groups()
        if once:
            return 0

