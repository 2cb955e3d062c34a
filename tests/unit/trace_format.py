"""A checker for the Chrome trace-event format (the JSON object form), written from the format's
description rather than from our writer: what Perfetto and chrome://tracing need to load a file."""

from __future__ import annotations

import numbers

PHASES = {"X", "B", "E", "i", "I", "C", "M", "b", "e", "n", "s", "t", "f", "P", "O", "N", "D"}
METADATA = {"process_name", "process_labels", "process_sort_index", "thread_name", "thread_sort_index"}


def _event_problems(i: int, e: object) -> list[str]:
    if not isinstance(e, dict):
        return [f"event {i} is not an object"]
    out = []
    if e.get("ph") not in PHASES:
        out.append(f"event {i}: unknown phase {e.get('ph')!r}")
    if not isinstance(e.get("name"), str):
        out.append(f"event {i}: name must be a string")
    for key in ("pid", "tid"):
        if key in e and not isinstance(e[key], int):
            out.append(f"event {i}: {key} must be an integer")
    if e.get("ph") != "M" and not isinstance(e.get("ts"), numbers.Real):
        out.append(f"event {i}: ts (microseconds) must be a number")
    if e.get("ph") == "X" and not (isinstance(e.get("dur"), numbers.Real) and e["dur"] >= 0):
        out.append(f"event {i}: a complete event needs dur >= 0")
    if e.get("ph") == "C":
        args = e.get("args")
        if not isinstance(args, dict) or not args or not all(isinstance(v, numbers.Real) for v in args.values()):
            out.append(f"event {i}: a counter needs numeric args")
    if e.get("ph") == "M" and (e.get("name") not in METADATA or not isinstance(e.get("args"), dict)):
        out.append(f"event {i}: bad metadata event {e.get('name')!r}")
    return out


def _nesting_problems(events: list[dict]) -> list[str]:
    """Complete events on one thread must nest or follow each other (1 us of rounding allowed)."""
    out = []
    tracks: dict[tuple[int, int], list[dict]] = {}
    for e in events:
        if e.get("ph") == "X":
            tracks.setdefault((e.get("pid", 0), e.get("tid", 0)), []).append(e)
    for key, spans in tracks.items():
        spans.sort(key=lambda e: (e["ts"], -e["dur"]))
        open_ends: list[float] = []
        for e in spans:
            while open_ends and open_ends[-1] <= e["ts"] + 1.0:
                open_ends.pop()
            if open_ends and e["ts"] + e["dur"] > open_ends[-1] + 1.0:
                out.append(f"thread {key}: {e['name']} at {e['ts']} overlaps an enclosing span")
            open_ends.append(e["ts"] + e["dur"])
    return out


def trace_problems(doc: object) -> list[str]:
    """Everything in doc that violates the trace-event format (empty when it conforms)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return ["the top level must be an object with a traceEvents list"]
    if doc.get("displayTimeUnit", "ms") not in ("ms", "ns"):
        return ["displayTimeUnit must be ms or ns"]
    events = doc["traceEvents"]
    out = [p for i, e in enumerate(events) for p in _event_problems(i, e)]
    return out or _nesting_problems(events)
