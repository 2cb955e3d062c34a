"""Per-round timeline of the async engine: named spans on each side, busy and idle time, JSON output."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from typing import Iterator

import torch

# Span names; a span is busy time unless its name starts with "wait".
SPANS = ("expand", "wait_verified", "reroot", "topup", "select", "send_tree",
         "wait_tree", "forward", "verify", "send_verified", "prefill")
CODE = {name: i for i, name in enumerate(SPANS)}


class Timeline:
    """Records (span, start, end) on one side; cheap enough to stay on in every request."""

    def __init__(self) -> None:
        self.events: list[tuple[int, float, float]] = []

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        start = time.time()
        try:
            yield
        finally:
            self.events.append((CODE[name], start, time.time()))

    def clear(self) -> None:
        self.events.clear()

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


def write_json(path: str, target: torch.Tensor, draft: torch.Tensor) -> None:
    """The whole timeline (times relative to its first event) plus its summary."""
    both = torch.cat([target, draft])
    t0 = float(both[:, 1].min()) if both.numel() else 0.0

    def rows(ev: torch.Tensor) -> list[dict]:
        return [{"span": SPANS[int(c)], "start": s - t0, "end": e - t0} for c, s, e in ev.tolist()]

    doc = {"summary": summarize(target, draft), "target": rows(target), "draft": rows(draft)}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
