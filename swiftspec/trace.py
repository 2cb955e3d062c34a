"""Timelines of every engine: named spans per group and per-round counters, busy time, and the
Chrome trace-event JSON that Perfetto and chrome://tracing open (`--trace FILE`)."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import torch

# Span names; a span is busy time unless its name starts with "wait".
SPANS = ("expand", "wait_verified", "reroot", "topup", "select", "send_tree",
         "wait_tree", "forward", "verify", "send_verified", "prefill")
CODE = {name: i for i, name in enumerate(SPANS)}
# The algorithm step each span belongs to (the trace event's category).
STEP = {"expand": "expand", "topup": "expand", "wait_verified": "wait", "wait_tree": "wait", "reroot": "reroot",
        "select": "select", "send_tree": "send", "send_verified": "send", "forward": "forward",
        "verify": "verify", "prefill": "prefill"}
GROUPS = ("target", "draft")  # one track each; the target group's track comes first
COUNTERS = ("accepted tokens", "tree size")


@dataclass(frozen=True, slots=True)
class Round:
    """One target forward's outcome: when it ended, the tokens it emitted and the nodes it verified."""

    time: float  # seconds since the epoch
    accepted: int
    tree_size: int


class Timeline:
    """Records (span, start, end) on one group, and the rounds of the group that verifies.

    Times are seconds since the epoch, so that timelines of different processes line up; they are
    taken with perf_counter (monotonic, fine-grained) and shifted by the epoch offset once."""

    def __init__(self) -> None:
        self.events: list[tuple[int, float, float]] = []
        self.rounds: list[Round] = []
        self._epoch = time.time() - time.perf_counter()

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, start, time.perf_counter())

    def add(self, name: str, start: float, end: float) -> None:
        """A span between two perf_counter() readings."""
        self.events.append((CODE[name], self._epoch + start, self._epoch + end))

    def count(self, accepted: int, tree_size: int) -> None:
        """A round ended now: `accepted` tokens emitted after verifying `tree_size` nodes."""
        self.rounds.append(Round(self._epoch + time.perf_counter(), accepted, tree_size))

    def busy_seconds(self) -> float:
        return sum(end - start for code, start, end in self.events if not SPANS[code].startswith("wait"))

    def as_tensor(self) -> torch.Tensor:
        """[n, 3] float64 rows of (span code, start, end)."""
        return torch.tensor(self.events, dtype=torch.float64).reshape(-1, 3)


def summarize(target: torch.Tensor, draft: torch.Tensor) -> dict:
    """Busy fraction of each side over the wall time both spans cover; seconds per span name."""
    both = torch.cat([target, draft])
    if both.numel() == 0:
        return {"wall_s": 0.0}
    wall = float(both[:, 2].max() - both[:, 1].min())
    out = {"wall_s": wall}
    for side, ev in (("target", target), ("draft", draft)):
        per = {}
        for code, start, end in ev.tolist():
            per[SPANS[int(code)]] = per.get(SPANS[int(code)], 0.0) + end - start
        busy = sum(v for k, v in per.items() if not k.startswith("wait"))
        out[side] = {"busy_s": busy, "busy_fraction": busy / wall if wall else 0.0, "spans_s": per}
    return out


@dataclass(frozen=True, slots=True)
class RequestTrace:
    """One request's timelines: each group's spans ([n, 3] rows as Timeline.as_tensor) and the rounds."""

    tracks: dict[str, torch.Tensor]  # group name (GROUPS) -> [n, 3] float64
    rounds: list[Round]


def request_trace(target: Timeline, draft: Timeline | torch.Tensor | None = None) -> RequestTrace:
    """The trace of a request whose target group recorded `target` (and its rounds) and whose
    draft group recorded `draft` (a Timeline in this process, or the rows another process sent)."""
    tracks = {"target": target.as_tensor()}
    if draft is not None:
        tracks["draft"] = draft if isinstance(draft, torch.Tensor) else draft.as_tensor()
    return RequestTrace(tracks=tracks, rounds=list(target.rounds))


@dataclass(slots=True)
class TraceFile:
    """Every request traced since it was opened, rewritten after each one so that the file is
    always a complete trace.  Engines hold one only while a caller wants a trace (`--trace`);
    their own start-up profiling is never recorded."""

    path: Path
    mode: str  # the engine's mode, named in the trace
    requests: list[RequestTrace] = field(default_factory=list)

    def add(self, request: RequestTrace) -> None:
        self.requests.append(request)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(chrome_trace(self.requests, self.mode)))
        tmp.replace(self.path)


def _metadata(mode: str) -> list[dict]:
    events = [{"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": f"swiftspec {mode}"}}]
    for tid, group in enumerate(GROUPS, start=1):
        events.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": f"{group} group"}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": 1, "tid": tid, "args": {"sort_index": tid}})
    return events


def chrome_trace(requests: list[RequestTrace], mode: str) -> dict:
    """The trace-event JSON object: one complete ("X") event per span on its group's thread track,
    and counter ("C") events per round; times in microseconds since the first span."""
    starts = [float(ev[:, 1].min()) for r in requests for ev in r.tracks.values() if ev.numel()]
    t0 = min(starts, default=0.0)
    events = _metadata(mode)
    for index, req in enumerate(requests):
        for group, rows in req.tracks.items():
            tid = GROUPS.index(group) + 1
            for code, start, end in rows.tolist():
                name = SPANS[int(code)]
                events.append({"name": name, "cat": STEP[name], "ph": "X", "pid": 1, "tid": tid,
                               "ts": round((start - t0) * 1e6, 1), "dur": round((end - start) * 1e6, 1),
                               "args": {"request": index}})
        for r in req.rounds:
            ts = round((r.time - t0) * 1e6, 1)
            for name, value in zip(COUNTERS, (r.accepted, r.tree_size)):
                events.append({"name": name, "ph": "C", "pid": 1, "tid": 0, "ts": ts, "args": {name: value}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"mode": mode, "requests": len(requests), "version": 1}}
