"""Engines behind one interface: autoregressive, serial chain/tree speculation, async disaggregated."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from swiftspec.config import AUTO, NO_DRAFT, ConfigError, EngineConfig, LoadConfig, TreeConfig
from swiftspec.runtime.base import Engine, GenerationStats


def chain_config(tree: TreeConfig) -> TreeConfig:
    """Classic speculative decoding as a one-wide tree: k draft tokens, k + 1 verified nodes (no
    lookup branches, which would make it a tree)."""
    k = tree.chain_length
    return dataclasses.replace(tree, width=1, topk=1, depth=k, verify_size=k + 1, budget=max(tree.budget, 2 * k + 2),
                               adaptive=0, lookup=0)


def build_engine(config: EngineConfig) -> Engine:
    """Load the models and build the engine that `config.mode` names; for `auto`, the one that
    runtime.auto chooses (it says which, and why, in one line on stderr).  With config.trace set,
    every request's timeline goes to that file."""
    if config.mode == AUTO:
        from swiftspec.runtime.auto.choose import decide

        decision = decide(config)
        print(decision.line(), file=sys.stderr, flush=True)
        config = decision.config
    engine = _build(config)
    if config.trace:
        from swiftspec.runtime.trace import TraceFile

        engine.trace = TraceFile(Path(config.trace), config.mode)
    return engine


def _build(config: EngineConfig) -> Engine:
    from swiftspec.weights import load_model

    _check_placement(config)
    if config.mode == "async" and config.remote is not None:
        from swiftspec.runtime.remote import RemoteEngine

        return RemoteEngine(config)
    if config.mode == "async":
        from swiftspec.runtime.async_engine import AsyncEngine

        return AsyncEngine(config)
    target = load_target(config.target, config.target_load)
    max_seq_len = config.target_load.max_seq_len
    if config.mode == "ar":
        from swiftspec.runtime.autoregressive import AutoregressiveEngine

        return AutoregressiveEngine(target, max_seq_len)
    from swiftspec.draft import LookupDrafter, build_drafter
    from swiftspec.runtime.serial import SerialEngine

    if config.draft == NO_DRAFT:  # prompt lookup alone drafts (a chain keeps the best continuation)
        tree = dataclasses.replace(config.tree, lookup_branches=1) if config.mode == "chain" else config.tree
        return SerialEngine(target, LookupDrafter(tree), tree, max_seq_len)
    draft = load_model(config.draft, config.draft_load)
    check_pair(target.tokenizer, draft.tokenizer)
    tree = chain_config(config.tree) if config.mode == "chain" else config.tree
    drafter = build_drafter(draft, tree, max_seq_len, config.draft_vocab, config.draft_load.weights)
    return SerialEngine(target, drafter, tree, max_seq_len)


def load_target(source: str, load: LoadConfig, parallel=None):
    """Load a target model (or this rank's shard) and pack its weights as `load.weights` asks."""
    from swiftspec import kernels
    from swiftspec.parallel.state import ParallelState
    from swiftspec.weights import load_model

    loaded = load_model(source, load, parallel or ParallelState())
    kernels.prepare_model_(loaded.model, load.weights)
    return loaded


def default_draft_weights(target: LoadConfig) -> str:
    """The draft's weight format when --draft-weights is not given.

    A bf16 target on CPU gets an int8 draft when the C++ kernels are available: the draft only
    proposes tokens, so its precision never changes the output, and int8 halves the bytes each
    draft forward reads (its acceptance on HumanEval matches a bf16 draft's).  Otherwise the
    draft uses the target's format."""
    if target.weights != "bf16" or not target.device.startswith("cpu") or target.dtype != "bfloat16":
        return target.weights
    from swiftspec.kernels import cpu_ext

    return "int8" if cpu_ext.load() is not None else "bf16"


def check_pair(target, draft) -> None:  # the Tokenizers of target and draft (swiftspec.tokenizer)
    """Draft and target must share a tokenizer: the tree carries token ids between them."""
    probe = "def check(pair):\n    return 'ok'  # ünï\n"
    if target.encode(probe) != draft.encode(probe):
        raise ConfigError("the draft model's tokenizer differs from the target's; pick a draft of the same family")


def _check_placement(config: EngineConfig) -> None:
    for load in (config.target_load, config.draft_load):
        if load.weights != "bf16" and not load.device.startswith("cpu"):
            raise ConfigError("int8/int4 weights use the CPU kernels; on GPU use --weights bf16")
        if load.device.startswith("cuda"):
            import torch

            if not torch.cuda.is_available():
                raise ConfigError("--device cuda: no CUDA device is available")


__all__ = ["Engine", "GenerationStats", "build_engine", "chain_config", "default_draft_weights"]
