"""`swiftspec trace FILE --png OUT`: a trace written by `--trace` as a timeline picture (matplotlib),
for readers without Perfetto or chrome://tracing at hand, plus each track's busy time on stdout."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from swiftspec.errors import UserError

# One colour per algorithm step (the events' category); waits are drawn pale.
STEP_COLORS = {"prefill": "#7f7f7f", "expand": "#1f77b4", "reroot": "#9467bd", "select": "#17becf",
               "send": "#bcbd22", "forward": "#d62728", "verify": "#ff7f0e", "wait": "#e5e5e5"}
# Counters as markers at each round's end (filled dots, then hollow squares), so equal values stay visible.
COUNTER_STYLES = ({"marker": "o", "color": "#1f77b4", "markersize": 5},
                  {"marker": "s", "color": "#ff7f0e", "markersize": 9, "markerfacecolor": "none"})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="a trace written by --trace (Chrome trace-event JSON)")
    parser.add_argument("--png", default=None, help="draw the timeline into this PNG file")


@dataclass(frozen=True, slots=True)
class Track:
    """One group's spans: (start ms, duration ms, step) rows."""

    name: str
    spans: list[tuple[float, float, str]]

    def busy_ms(self) -> float:
        return sum(dur for _, dur, step in self.spans if step != "wait")

    def summary(self, wall_ms: float) -> str:
        per: dict[str, float] = {}
        for _, dur, step in self.spans:
            per[step] = per.get(step, 0.0) + dur
        parts = ", ".join(f"{step} {ms / 1e3:.2f} s" for step, ms in sorted(per.items(), key=lambda kv: -kv[1]))
        busy = self.busy_ms() / wall_ms if wall_ms else 0.0
        return f"{self.name}: busy {busy:.0%} of {wall_ms / 1e3:.2f} s ({parts})"


def read_trace(path: Path) -> dict:
    """The trace-event JSON object (UserError when the file is missing or not a trace)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"cannot read the trace {path}: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise UserError(f"{path} is not a trace-event JSON object (no traceEvents list)")
    return doc


def tracks(doc: dict) -> list[Track]:
    """The thread tracks with spans, in their sort order."""
    names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    rows: dict[int, list[tuple[float, float, str]]] = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "X":
            rows.setdefault(e["tid"], []).append((e["ts"] / 1e3, e["dur"] / 1e3, e.get("cat", e["name"])))
    return [Track(names.get(tid, f"thread {tid}"), spans) for tid, spans in sorted(rows.items())]


def counters(doc: dict) -> dict[str, list[tuple[float, float]]]:
    """Counter name -> (time ms, value) points."""
    out: dict[str, list[tuple[float, float]]] = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "C":
            for value in e["args"].values():
                out.setdefault(e["name"], []).append((e["ts"] / 1e3, float(value)))
    return out


def draw(doc: dict, out: Path) -> None:
    """Tracks as horizontal bars coloured by step above the per-round counters, time in ms."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows, series = tracks(doc), counters(doc)
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(13, 4.5), height_ratios=(2, 1))
    for y, track in enumerate(rows):
        for step, color in STEP_COLORS.items():
            bars = [(start, dur) for start, dur, s in track.spans if s == step]
            top.broken_barh(bars, (y - 0.4, 0.8), facecolors=color, edgecolor="none")
    top.set_yticks(range(len(rows)), [t.name for t in rows])
    top.invert_yaxis()
    used = {s for t in rows for _, _, s in t.spans}
    top.legend(handles=[Patch(color=c, label=s) for s, c in STEP_COLORS.items() if s in used],
               loc="upper center", bbox_to_anchor=(0.5, 1.25), ncol=8, frameon=False)
    for (name, points), style in zip(series.items(), COUNTER_STYLES):
        bottom.plot([t for t, _ in points], [v for _, v in points], linestyle="none", label=name, **style)
    bottom.set_ylabel("per round")
    bottom.set_xlabel("time (ms)")
    bottom.set_ylim(0, 1.2 * max((v for pts in series.values() for _, v in pts), default=1.0) + 0.5)
    if series:
        bottom.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), frameon=False)
    mode = doc.get("otherData", {}).get("mode", "")
    fig.suptitle(f"swiftspec {mode} timeline".strip(), y=0.99)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    doc = read_trace(Path(args.file))
    rows = tracks(doc)
    ends = [start + dur for t in rows for start, dur, _ in t.spans]
    starts = [start for t in rows for start, _, _ in t.spans]
    wall = max(ends, default=0.0) - min(starts, default=0.0)
    for track in rows:
        print(track.summary(wall))
    if args.png:
        draw(doc, Path(args.png))
        print(f"wrote {args.png}")
    return 0
