"""async across hosts, on one machine: two network namespaces joined by a veth pair stand for two hosts.
The target host (tests/distributed/multihost_driver.py) runs in one, `swiftspec worker --role draft`
in the other. Greedy output equals ar; a delayed link gives the same output; a wrong secret is refused;
a killed draft host or a cut link costs at most the link timeout, and the target finishes in ar
(degraded) and goes async again when the draft host rejoins. Needs root and `ip`; skips otherwise."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swiftspec.config import EngineConfig, LoadConfig
from swiftspec.runtime import build_engine
from swiftspec.sampling import SamplingParams

pytestmark = pytest.mark.netns
DRIVER = Path(__file__).with_name("multihost_driver.py")
ROOT = Path(__file__).resolve().parents[2]  # the driver imports this checkout's swiftspec
LINK_TIMEOUT_S = 3.0
SECRET = "netns-test-secret"
PORT = 29650


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


class Hosts:
    """Two namespaces T (target, .1) and D (draft, .2) on a private /30, removed afterwards."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}"
        self.t, self.d = f"ssmh-t{tag}", f"ssmh-d{tag}"
        self.t_if, self.d_if = f"ssmt{tag}", f"ssmd{tag}"
        net = f"10.203.{os.getpid() % 250}"
        self.t_ip, self.d_ip = f"{net}.1", f"{net}.2"
        sh("ip", "netns", "add", self.t)
        sh("ip", "netns", "add", self.d)
        sh("ip", "link", "add", self.t_if, "netns", self.t, "type", "veth", "peer", "name", self.d_if, "netns", self.d)
        for ns, ifname, ip in ((self.t, self.t_if, self.t_ip), (self.d, self.d_if, self.d_ip)):
            sh("ip", "-n", ns, "addr", "add", f"{ip}/30", "dev", ifname)
            sh("ip", "-n", ns, "link", "set", ifname, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")

    @property
    def address(self) -> str:
        return f"{self.t_ip}:{PORT}"

    def link(self, up: bool) -> None:
        sh("ip", "-n", self.d, "link", "set", self.d_if, "up" if up else "down")

    def netem(self, delay_ms: float) -> str | None:
        """Delay both directions; the reason it cannot, else None."""
        for ns, ifname in ((self.t, self.t_if), (self.d, self.d_if)):
            done = sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", ifname, "root", "netem", "delay",
                      f"{delay_ms}ms", check=False)
            if done.returncode:
                return f"tc netem: {done.stderr.strip() or done.returncode} (this kernel lacks sch_netem)"
        return None

    def close(self) -> None:
        for ns in (self.t, self.d):
            sh("ip", "netns", "del", ns, check=False)


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


class Target:
    """The driver in namespace T, one JSON line per command."""

    def __init__(self, hosts: Hosts, target: Path, draft: Path, log: Path) -> None:
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", hosts.t, sys.executable, str(DRIVER), str(target), str(draft), hosts.address,
             str(LINK_TIMEOUT_S)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log.open("w"), text=True,
            env=os.environ | {"SWIFTSPEC_SECRET": SECRET,
                              "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
        assert self.read()["event"] == "ready", log.read_text()

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        assert line, "the target driver died"
        return json.loads(line)

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        try:
            self.ask(cmd="quit")
            self.proc.wait(30)
        finally:
            self.proc.kill()


def start_draft(hosts: Hosts, draft: Path, log: Path, secret: str = SECRET, rtt_s: float = 0.0) -> subprocess.Popen:
    cmd = ["ip", "netns", "exec", hosts.d, sys.executable, "-m", "swiftspec.cli", "worker", "--role", "draft",
           "--rendezvous", hosts.address, "--draft-model", str(draft), "--device", "cpu", "--dtype", "float32",
           "--max-seq-len", "512", "--depth", "2", "--link-timeout", str(LINK_TIMEOUT_S)]
    env = os.environ | {"SWIFTSPEC_SECRET": secret, "SWIFTSPEC_TEST_LINK_RTT_S": str(rtt_s)}
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log.open("w"), env=env, text=True)


def stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(10)


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
        assert not target.ask(cmd="rejoin", wait_s=20)["joined"]
        assert bad.wait(30) == 2
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

        # A draft host that rejoins over a slow link (10 ms round trip): async again, the same tokens.
        link("draft2.log", rtt_s=0.010)

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
