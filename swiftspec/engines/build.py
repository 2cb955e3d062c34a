"""build_engine: load the models and build the engine a config names (ar, chain, tree, async; auto chooses)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch

from swiftspec.config import AUTO, NO_DRAFT, ConfigError, EngineConfig, chain_config, require_settled
from swiftspec.engines.ar import AutoregressiveEngine
from swiftspec.engines.async_engine import AsyncEngine
from swiftspec.engines.auto.choose import decide
from swiftspec.engines.base import Engine
from swiftspec.engines.remote import RemoteEngine
from swiftspec.engines.serial import SerialEngine
from swiftspec.engines.startup import StartupProfile
from swiftspec.runner.load import check_pair, load_target, prompt_store, resolve_context
from swiftspec.speculate import LookupDrafter, load_drafter
from swiftspec.trace import TraceFile
from swiftspec.weights.loaded_model import LoadedModel


def build_engine(config: EngineConfig, target: LoadedModel | None = None,
                 startup: StartupProfile | None = None) -> Engine:
    """Load the models and build the engine that `config.mode` names; for `auto`, the one that
    engines.auto chooses (it says which, and why, in one line on stderr).  config: settled by
    engines.defaults.resolve_defaults (its context length, when 0, is settled here, where the
    models' headers and the free memory are known).  With config.trace set,
    every request's timeline goes to that file.  target: the target already loaded as
    config.target_load asks (runner.load.load_target, tensor-parallel size 1), which engines may
    share (each keeps its own KV cache); None loads it.  startup: the engine's start-up profile when
    known already (auto's decision carries the chosen engine's); None: the engine measures its own."""
    require_settled(config)
    config = resolve_context(config)
    if config.mode == AUTO:
        decision = decide(config)
        print(decision.line(), file=sys.stderr, flush=True)
        config, startup = decision.config, decision.startup
    engine = _build(config, target, startup)
    engine.mode = config.mode
    if config.trace:
        engine.trace = TraceFile(Path(config.trace), config.mode)
    return engine


def _build(config: EngineConfig, target: LoadedModel | None, startup: StartupProfile | None) -> Engine:
    _check_placement(config)
    if target is not None and config.target_tp > 1:
        raise ConfigError("a target loaded by the caller is not sharded: it cannot serve --target-tp > 1")
    if config.mode == "async" and config.remote is not None:
        return RemoteEngine(config, target)
    if config.mode == "async":
        return AsyncEngine(config, target=target, startup=startup)
    target = target or load_target(config.target, config.target_load)
    max_seq_len = config.target_load.max_seq_len
    if config.mode == "ar":
        return AutoregressiveEngine(target, max_seq_len, prompt_store(config))

    if config.draft == NO_DRAFT:  # prompt lookup alone drafts (a chain keeps the best continuation)
        tree = dataclasses.replace(config.tree, lookup_branches=1) if config.mode == "chain" else config.tree
        return SerialEngine(target, LookupDrafter(tree), tree, max_seq_len, startup, prompt_store(config))
    tree = chain_config(config.tree) if config.mode == "chain" else config.tree
    draft = load_drafter(config.draft, config.draft_load, tree, max_seq_len, config.draft_vocab)
    check_pair(target.tokenizer, draft.loaded.tokenizer, target.args.vocab_size, draft.loaded.args.vocab_size)
    return SerialEngine(target, draft.drafter, tree, max_seq_len, startup, prompt_store(config))


def _check_placement(config: EngineConfig) -> None:
    for load in (config.target_load, config.draft_load):
        if load.weights != "bf16" and not load.device.startswith("cpu"):
            raise ConfigError("int8/int4 weights use the CPU kernels; on GPU use --weights bf16")
        if load.device.startswith("cuda"):
            if not torch.cuda.is_available():
                raise ConfigError("--device cuda: no CUDA device is available")
