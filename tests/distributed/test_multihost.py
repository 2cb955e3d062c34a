"""async across hosts, on one machine: two network namespaces joined by a veth pair stand for two hosts
(tests/support/netns_hosts.py). The target host runs in one, `swiftspec worker --role draft` in the
other. Greedy output equals ar; a delayed link gives the same output; a wrong secret is refused;
a killed draft host or a cut link costs at most the link timeout, and the target finishes in ar
(degraded) and goes async again when the draft host rejoins. Needs root and `ip`; skips otherwise."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time

import pytest

from injection import Injection
from netns_hosts import LINK_TIMEOUT_S, Hosts, Target, start_draft, stop
from swiftspec.config import EngineConfig, LoadConfig
from swiftspec.engines import build_engine
from swiftspec.sampling import SamplingParams

pytestmark = pytest.mark.netns


def refused(target: Target, draft: subprocess.Popen, wait_s: float = 30.0) -> int:
    """The exit status of a draft host that the target host, accepting meanwhile (a second at a
    time, so that the test goes on once the draft host exits), never links."""
    deadline = time.monotonic() + wait_s
    while draft.poll() is None and time.monotonic() < deadline:
        assert not target.ask(cmd="rejoin", wait_s=1)["joined"]
    return draft.wait(1)


@pytest.fixture(scope="module")
def hosts():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2's `ip`")
    try:
        made = Hosts()
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot build network namespaces here: {exc.stderr.strip()}")
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(scope="module")
def prompts():
    rng = random.Random(21)
    return [[rng.randrange(3, 500) for _ in range(rng.randint(2, 12))] for _ in range(3)]


@pytest.fixture(scope="module")
def want(tiny_qwen_dir, prompts):
    ar = build_engine(EngineConfig(mode="ar", target=str(tiny_qwen_dir), target_load=LoadConfig(dtype="float32",
                                                                                                 max_seq_len=512)))
    long = [t for chunk in ar.generate(prompts[0], SamplingParams(), 300) for t in chunk]
    return {"short": [[t for c in ar.generate(p, SamplingParams(), 24) for t in c] for p in prompts], "long": long}


def test_two_namespaces(hosts, tiny_qwen_dir, tiny_draft_dir, prompts, want, tmp_path) -> None:
    target = Target(hosts, tiny_qwen_dir, tiny_draft_dir, tmp_path / "target.log")
    drafts: list[subprocess.Popen] = []
    try:
        # No draft host yet: the target serves, degraded, in ar.
        got = target.ask(cmd="gen", prompts=prompts, n=24)
        assert got["outs"] == want["short"] and got["degraded"]

        # A wrong secret is refused on both sides, with one line.
        bad = start_draft(hosts, tiny_draft_dir, tmp_path / "bad.log", secret="not-the-secret")
        assert refused(target, bad) == 2
        err = (tmp_path / "bad.log").read_text().strip().splitlines()
        assert err[-1] == "error: the target host refused to link: the target host refused this host: wrong secret"

        def link(log: str, **draft) -> None:
            """Start a draft host, let it rejoin, and check async output token-exact against ar."""
            drafts.append(start_draft(hosts, tiny_draft_dir, tmp_path / log, **draft))
            assert target.ask(cmd="rejoin", wait_s=60)["joined"], (tmp_path / log).read_text()
            got = target.ask(cmd="gen", prompts=prompts, n=24)
            assert got["outs"] == want["short"] and not got["degraded"]

        # A draft host with the secret links: async, token-exact against ar.
        link("draft1.log")

        # The draft host dies mid-request: the request finishes in ar, at once.
        assert target.ask(cmd="gen", prompts=[prompts[0]], n=300, notify=True) == {"event": "first"}
        drafts[-1].send_signal(signal.SIGKILL)
        got = target.read()
        assert got["outs"] == [want["long"]] and got["degraded"] and got["max_gap_s"] < LINK_TIMEOUT_S

        # A draft host that rejoins over a slow link (10 ms round trip, injected into its process as
        # a sleep of half of it before each send and after each receive): async again, the same tokens.
        slow = Injection(log=tmp_path / "inject.log", link_rtt_s=0.010)
        link("draft2.log", env=slow.env())
        delays = slow.sleeps("link")
        assert len(delays) >= 4 * len(prompts), delays  # Start, tree, Verified, Profile at least
        assert {seconds for _, seconds in delays} == {0.005}

        # The link is cut mid-request: a timeout within the link timeout, the rest in ar; the draft
        # host times out too, waits, and rejoins once the link is back.
        assert target.ask(cmd="gen", prompts=[prompts[0]], n=300, notify=True) == {"event": "first"}
        hosts.link(up=False)
        got = target.read()
        assert got["outs"] == [want["long"]] and got["degraded"]
        assert got["max_gap_s"] < LINK_TIMEOUT_S + 2.0
        hosts.link(up=True)
        assert target.ask(cmd="rejoin", wait_s=60)["joined"], (tmp_path / "draft2.log").read_text()
        got = target.ask(cmd="gen", prompts=prompts[:1], n=24)
        assert got["outs"] == want["short"][:1] and not got["degraded"]
        assert drafts[-1].poll() is None  # the draft host outlived the cut
    finally:
        target.close()
        for proc in drafts:
            stop(proc)
    log = (tmp_path / "draft2.log").read_text()
    assert "lost the target host" in log and "closed the link" in log


def test_netem_delay(hosts, tiny_qwen_dir, tiny_draft_dir, prompts, want, tmp_path) -> None:
    """5 ms of kernel-injected delay each way: the same output."""
    why = hosts.netem(5)
    if why is not None:
        pytest.skip(why)
    target = Target(hosts, tiny_qwen_dir, tiny_draft_dir, tmp_path / "target.log")
    draft = start_draft(hosts, tiny_draft_dir, tmp_path / "draft.log")
    try:
        assert target.ask(cmd="rejoin", wait_s=60)["joined"]
        got = target.ask(cmd="gen", prompts=prompts, n=24)
        assert got["outs"] == want["short"] and not got["degraded"]
    finally:
        target.close()
        stop(draft)
