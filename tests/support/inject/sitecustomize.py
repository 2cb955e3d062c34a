"""Delays the tests inject into processes they start, where a monkeypatch in the test process does not
reach: the async engine's spawned workers, `swiftspec worker --role draft` in a network namespace.
Python imports this module at start-up when its folder is on PYTHONPATH; tests/support/injection.py
puts it there, with the settings below, for the processes a test starts.

LINK_RTT_ENV=R: the draft host's link (distributed/draft_host.py, DraftHostIO) sleeps R/2 before each message
it sends and after each it receives, as a link with round-trip time R would delay them (a stand-in for
`tc netem`, which not every kernel has).
DRAFT_JITTER_ENV=J: the draft sleeps a random 0..J s before each round's drafting (TreeDrafter.draft,
called once per round by the async draft loop), so the verified tokens reach it at varying points.
LOG_ENV=PATH: each injected sleep appends a line "<kind> <pid> <seconds>" there, so that a test can
check that the injection ran.
"""

from __future__ import annotations

import functools
import os
import random
import time

LINK_RTT_ENV = "SWIFTSPEC_INJECT_LINK_RTT_S"
DRAFT_JITTER_ENV = "SWIFTSPEC_INJECT_DRAFT_JITTER_S"
LOG_ENV = "SWIFTSPEC_INJECT_LOG"


def _sleep(kind: str, seconds: float) -> None:
    time.sleep(seconds)
    with open(os.environ[LOG_ENV], "a") as log:
        log.write(f"{kind} {os.getpid()} {seconds!r}\n")


def delay_link(rtt_s: float) -> None:
    from swiftspec.distributed.draft_host import DraftHostIO

    send, recv = DraftHostIO.send, DraftHostIO.recv

    @functools.wraps(send)
    def delayed_send(self, msg):
        _sleep("link", rtt_s / 2)
        send(self, msg)

    @functools.wraps(recv)
    def delayed_recv(self):
        msg = recv(self)
        _sleep("link", rtt_s / 2)
        return msg

    DraftHostIO.send, DraftHostIO.recv = delayed_send, delayed_recv


def jitter_draft(jitter_s: float) -> None:
    from swiftspec.speculate.drafter import TreeDrafter

    draft = TreeDrafter.draft

    @functools.wraps(draft)
    def jittered(self, *args, **kwargs):
        _sleep("jitter", random.uniform(0.0, jitter_s))
        return draft(self, *args, **kwargs)

    TreeDrafter.draft = jittered


if __name__ == "sitecustomize":  # at start-up; tests/support/injection.py imports only the names above
    if LINK_RTT_ENV in os.environ:
        delay_link(float(os.environ[LINK_RTT_ENV]))
    if DRAFT_JITTER_ENV in os.environ:
        jitter_draft(float(os.environ[DRAFT_JITTER_ENV]))
