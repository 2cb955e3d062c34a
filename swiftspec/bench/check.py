"""`python -m swiftspec.bench.check DIR`: validate a bench report (schema, files, greedy losslessness).

Fails (exit 1, one line per problem) when report.json lacks a required key, report.md or report.png
is missing, or a greedy run of one of our modes left `ar`'s tokens at a point that is not a tie.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REQUIRED_MODE_KEYS = (
    "tokens_per_s", "ttft_s", "acceptance_length", "matches_ar", "first_divergence", "divergences", "roofline",
)
DIST_KEYS = ("mean", "median", "p10", "p90")
MACHINE_KEYS = ("cpu", "cores", "threads", "torch", "git_commit", "date", "command")


def problems(out: Path) -> list[str]:
    """Everything wrong with the report in `out`; empty when it passes."""
    path = out / "report.json"
    if not path.is_file():
        return [f"{path} is missing"]
    report = json.loads(path.read_text())
    found = [f"{out / name} is missing" for name in ("report.md", "report.png") if not (out / name).is_file()]
    found += [f"machine.{k} is missing" for k in MACHINE_KEYS if k not in report.get("machine", {})]
    if not report.get("modes"):
        found.append("no mode ran")
    for name, mode in report.get("modes", {}).items():
        found += [f"modes.{name}.{k} is missing" for k in REQUIRED_MODE_KEYS if k not in mode]
        found += [f"modes.{name}.tokens_per_s.{k} is missing" for k in DIST_KEYS
                  if k not in mode.get("tokens_per_s", {})]
        if mode.get("kind") == "ours" and mode.get("matches_ar") is False:
            found += [f"modes.{name} left ar's greedy tokens without a tie: {d}"
                      for d in mode.get("divergences", []) if not d.get("tie")]
    return found


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0] if args else "bench_out")
    found = problems(out)
    print("\n".join(found) or f"bench-check: {out / 'report.json'} ok", file=sys.stderr if found else sys.stdout)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
