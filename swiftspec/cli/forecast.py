"""`swiftspec forecast`: before running, what each engine would decode here (the auto profile of this
machine and pair, cached), and whether a second host for the draft would pay (engines/auto/placements.py)."""

from __future__ import annotations

import argparse

from swiftspec.config import EngineConfig
from swiftspec.engines.auto.choose import decide
from swiftspec.engines.auto.placements import Setting, forecast, report
from swiftspec.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reprofile", action="store_true", help="profile this machine and pair again")
    parser.add_argument("--rtt-ms", type=float, default=1.0, help="two hosts: network round trip per round (ms)")
    parser.add_argument("--draft-speed", type=float, default=None,
                        help="two hosts: the draft host runs the draft this many times as fast as this one does")


def run(args: argparse.Namespace, config: EngineConfig) -> int:
    if args.rtt_ms < 0 or (args.draft_speed is not None and args.draft_speed <= 0):
        raise UserError("--rtt-ms must be >= 0 and --draft-speed > 0")
    decision = decide(config)
    print(decision.line())
    for p in sorted(decision.best_per_mode, key=lambda p: -p.tokens_per_s):
        print(f"  {p.label}: {p.tokens_per_s:.1f} tok/s predicted ({decision.speedup(p):.2f}x ar), "
              f"{p.tokens_per_round:.2f} tokens per round")
    print(decision.async_needs())
    rtt_s, tree = args.rtt_ms / 1e3, decision.config.tree
    lines = report(decision.profile, tree, rtt_s)
    if args.draft_speed is not None:
        setting = Setting(two_hosts=True, draft_speed=args.draft_speed, rtt_s=rtt_s)
        lines.insert(2, forecast(decision.profile, tree, setting).line())
    print("\n".join(lines))
    return 0
