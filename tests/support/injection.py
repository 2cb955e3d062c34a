"""The test side of inject/sitecustomize.py: the environment that makes a child process inject delays,
and the log that shows it did."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from inject.sitecustomize import DRAFT_JITTER_ENV, LINK_RTT_ENV, LOG_ENV

SHIM = Path(__file__).resolve().with_name("inject")
ROOT = Path(__file__).resolve().parents[2]  # children import this checkout's swiftspec


@dataclass(frozen=True, slots=True, kw_only=True)
class Injection:
    log: Path  # one line per injected sleep
    link_rtt_s: float | None = None  # the draft host's link round trip
    draft_jitter_s: float | None = None  # the draft's most sleep before a round

    def env(self) -> dict[str, str]:
        """What to add to a child's environment: the shim's folder and this checkout first on
        PYTHONPATH, and the delays."""
        path = os.pathsep.join(filter(None, [str(SHIM), str(ROOT), os.environ.get("PYTHONPATH")]))
        env = {"PYTHONPATH": path, LOG_ENV: str(self.log)}
        if self.link_rtt_s is not None:
            env[LINK_RTT_ENV] = repr(self.link_rtt_s)
        if self.draft_jitter_s is not None:
            env[DRAFT_JITTER_ENV] = repr(self.draft_jitter_s)
        return env

    def sleeps(self, kind: str) -> list[tuple[int, float]]:
        """(pid, seconds) of each sleep of `kind` ("link", "jitter") injected so far."""
        if not self.log.exists():
            return []
        lines = [line.split() for line in self.log.read_text().splitlines()]
        return [(int(pid), float(seconds)) for k, pid, seconds in lines if k == kind]
