"""Load a model ready to run: the target packed as its weight format asks, the draft's default
format, and the check that a pair shares its tokenizer."""

from __future__ import annotations

import dataclasses

from swiftspec import kernels
from swiftspec.config import ConfigError, EngineConfig, LoadConfig
from swiftspec.kernels import cpu_ext
from swiftspec.parallel.state import ParallelState
from swiftspec.weights import load_model


def load_target(source: str, load: LoadConfig, parallel=None):
    """Load a target model (or this rank's shard) and pack its weights as `load.weights` asks."""
    loaded = load_model(source, load, parallel or ParallelState())
    kernels.prepare_model_(loaded.model, load.weights)
    return loaded


def default_draft_weights(target: LoadConfig) -> str:
    """The draft's weight format when --draft-weights is not given.

    On CPU with bf16 activations and the C++ kernels, the draft reads fewer bytes than the
    target's format would make it (the draft only proposes tokens: its precision never changes
    the output): a bf16 target gets an int8 draft where the CPU has int8 dot products (VNNI; its
    acceptance on HumanEval matches a bf16 draft's) and an int4 one at the plain AVX2 level,
    where an int8 MAC costs twice an int4 one (docs/bench/avx2); a GGUF target (`gguf`) gets an
    int4 one (faster than the draft file as stored, whose Q8_0/Q5_0 blocks run as int8, at no
    loss of acceptance: docs/bench/auto-check).  Otherwise the draft uses the target's format."""
    own = {"bf16": "int8", "gguf": "int4"}.get(target.weights)
    if own is None or not target.device.startswith("cpu") or target.dtype != "bfloat16":
        return target.weights
    if cpu_ext.load() is None:
        return target.weights
    return "int4" if own == "int8" and cpu_ext.level() < cpu_ext.LEVELS["avx2-vnni"] else own


def resolve_draft_weights(config: EngineConfig) -> EngineConfig:
    """config with draft_load.weights set: None (no --draft-weights) becomes default_draft_weights.

    Called where an engine is built or chosen, not while flags are parsed: the default asks
    whether the C++ kernels load, which may compile them."""
    if config.draft_load.weights is not None:
        return config
    weights = default_draft_weights(config.target_load)
    return dataclasses.replace(config, draft_load=dataclasses.replace(config.draft_load, weights=weights))


def check_pair(target, draft) -> None:  # the Tokenizers of target and draft (swiftspec.tokenizer)
    """Draft and target must share a tokenizer: the tree carries token ids between them."""
    probe = "def check(pair):\n    return 'ok'  # ünï\n"
    if target.encode(probe) != draft.encode(probe):
        raise ConfigError("the draft model's tokenizer differs from the target's; pick a draft of the same family")
