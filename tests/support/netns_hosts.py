"""Two hosts on one machine: network namespaces joined by a veth pair, the target host
(multihost_driver.py) in one and `swiftspec worker --role draft` in the other. Used by
tests/distributed/test_multihost.py and benchmarks/multihost_figures.py; needs root and iproute2's `ip`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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


def start_draft(hosts: Hosts, draft: Path, log: Path, secret: str = SECRET,
                env: dict[str, str] | None = None) -> subprocess.Popen:
    """`swiftspec worker --role draft` in namespace D; env: added to its environment."""
    cmd = ["ip", "netns", "exec", hosts.d, sys.executable, "-m", "swiftspec.cli", "worker", "--role", "draft",
           "--rendezvous", hosts.address, "--draft-model", str(draft), "--device", "cpu", "--dtype", "float32",
           "--max-seq-len", "512", "--depth", "2", "--link-timeout", str(LINK_TIMEOUT_S)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log.open("w"), text=True,
                            env=os.environ | {"SWIFTSPEC_SECRET": secret} | (env or {}))


def stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(10)
