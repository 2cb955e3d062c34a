"""The flags of async across hosts: --rendezvous makes the target host's engine async, other modes
refuse it, and `swiftspec worker` wants --role draft and --rendezvous."""

from __future__ import annotations

import pytest

from swiftspec.cli.engine_args import engine_config_from_args
from swiftspec.cli.main import build_parser
from swiftspec.config import ConfigError


def config(*argv: str):
    return engine_config_from_args(build_parser().parse_args(["generate", "x", "--device", "cpu", *argv]))


def test_rendezvous_makes_auto_async_and_keeps_its_settings() -> None:
    cfg = config("--rendezvous", "10.0.0.1:29500", "--link-timeout", "5", "--wait-draft", "60")
    assert cfg.mode == "async"
    assert (cfg.remote.rendezvous, cfg.remote.link_timeout, cfg.remote.wait_draft) == ("10.0.0.1:29500", 5.0, 60.0)
    assert config().remote is None


def test_other_modes_and_tensor_parallel_refuse_it() -> None:
    with pytest.raises(ConfigError, match="--rendezvous links one target rank"):
        config("--mode", "tree", "--rendezvous", "10.0.0.1:29500")
    with pytest.raises(ConfigError, match="--rendezvous links one target rank"):
        config("--mode", "async", "--target-tp", "2", "--rendezvous", "10.0.0.1:29500")


def test_worker_needs_role_and_rendezvous() -> None:
    parser = build_parser()
    args = parser.parse_args(["worker", "--role", "draft", "--rendezvous", "h:1", "--draft-model", "d", "--once"])
    assert args.role == "draft" and args.once
    with pytest.raises(SystemExit):
        parser.parse_args(["worker", "--rendezvous", "h:1"])
