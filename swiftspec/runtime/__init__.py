"""Engines behind one interface: autoregressive, serial chain/tree speculation, async disaggregated."""

from __future__ import annotations

import dataclasses

from swiftspec.config import EngineConfig, TreeConfig
from swiftspec.runtime.base import Engine, GenerationStats


def chain_config(tree: TreeConfig) -> TreeConfig:
    """Classic speculative decoding as a one-wide tree: k draft tokens, k + 1 verified nodes."""
    k = tree.chain_length
    return dataclasses.replace(tree, width=1, topk=1, depth=k, verify_size=k + 1, budget=max(tree.budget, 2 * k + 2))


def build_engine(config: EngineConfig) -> Engine:
    """Load the models and build the engine that `config.mode` names."""
    from swiftspec.weights import load_model

    if config.mode == "async":
        from swiftspec.runtime.async_engine import AsyncEngine

        return AsyncEngine(config)
    target = load_model(config.target, config.target_load)
    max_seq_len = config.target_load.max_seq_len
    if config.mode == "ar":
        from swiftspec.runtime.autoregressive import AutoregressiveEngine

        return AutoregressiveEngine(target, max_seq_len)
    from swiftspec.runtime.serial import SerialEngine

    draft = load_model(config.draft, config.draft_load)
    tree = chain_config(config.tree) if config.mode == "chain" else config.tree
    return SerialEngine(target, draft, tree, max_seq_len)


__all__ = ["Engine", "GenerationStats", "build_engine", "chain_config"]
