"""Engines behind one interface: autoregressive, serial chain/tree speculation, async disaggregated
(build.build_engine makes the one a config names)."""

from swiftspec.engines.base import Engine, GenerationStats
from swiftspec.engines.build import build_engine, chain_config

__all__ = ["Engine", "GenerationStats", "build_engine", "chain_config"]
