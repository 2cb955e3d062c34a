"""Flags that link the two hosts of `async` across machines: `serve|generate --rendezvous` on the
target host, `swiftspec worker --role draft --rendezvous` on the draft host."""

from __future__ import annotations

import argparse

from swiftspec.config import RemoteConfig


def add_remote_arguments(parser: argparse.ArgumentParser, *, worker: bool = False) -> None:
    """worker: the draft host's command, where --role and --rendezvous are required."""
    parser.add_argument("--role", choices=("draft",) if worker else ("target",), required=worker,
                        default=None if worker else "target",
                        help="this host's group: the draft host runs `swiftspec worker --role draft`")
    parser.add_argument("--rendezvous", required=worker, default="",
                        help="HOST:PORT the target host listens on (its own address, never 0.0.0.0 unless "
                             "given) and the draft host connects to; async then runs across the two hosts")
    parser.add_argument("--secret-file", default="", help="file whose first line is the secret both hosts share "
                        "(default: $SWIFTSPEC_SECRET); a peer without it is refused")
    parser.add_argument("--link-timeout", type=float, default=RemoteConfig(rendezvous="").link_timeout,
                        help="seconds a message between the hosts may take before the link counts as lost")
    if worker:
        parser.add_argument("--once", action="store_true", help="exit when the first link ends (default: rejoin)")
    else:
        parser.add_argument("--wait-draft", type=float, default=0.0,
                            help="target host: seconds to wait at start for the draft host (default 0: serve "
                                 "without speculation until it joins)")


def remote_config_from_args(args: argparse.Namespace) -> RemoteConfig | None:
    """None unless --rendezvous was given."""
    if not getattr(args, "rendezvous", ""):
        return None
    return RemoteConfig(rendezvous=args.rendezvous, secret_file=args.secret_file, link_timeout=args.link_timeout,
                        wait_draft=getattr(args, "wait_draft", 0.0))
