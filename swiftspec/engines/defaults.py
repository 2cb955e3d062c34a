"""resolve_defaults: the one place where the defaults that the flags leave open are settled, once,
after parsing: the device, the target's and the draft's weight formats, and the check of the rows a
tree verifies against that device's CPU kernels.

Settled elsewhere, where what they need is known: the context length (max_seq_len 0) when the
engine is built (runner.load.resolve_context: the models' headers and the free memory), the bench's
context from its prompts (bench.command), and the tree depth (0), the async draft cores (0) and the
worker timeout (0) by the engines' start-up profiles.
"""

from __future__ import annotations

import dataclasses

from swiftspec.config import AUTO, ConfigError, EngineConfig, LoadConfig, TreeConfig
from swiftspec.engines.device import default_device
from swiftspec.kernels import MAX_DECODER_ROWS, cpu_ext
from swiftspec.weights.source import is_gguf


def resolve_defaults(config: EngineConfig) -> EngineConfig:
    """config with every open default settled (a settled config comes back equal, and asks
    nothing of the machine):

    - device AUTO: CUDA when its start-up check passed on this machine, else the CPU (engines.device);
    - the target's weights None: default_target_weights;
    - the draft's weights None: default_draft_weights of the settled target (this may compile the
      C++ kernels, to see whether they load: the reason flag parsing leaves it open);
    - a tree verifying more rows than the CPU kernels take in one call is refused (ConfigError)."""
    device = None
    if AUTO in (config.target_load.device, config.draft_load.device):
        device = default_device()
    target_load = _placed(config.target_load, device)
    if target_load.weights is None:
        target_load = dataclasses.replace(target_load, weights=default_target_weights(config.target,
                                                                                       target_load.device))
    draft_load = _placed(config.draft_load, device)
    if draft_load.weights is None:
        draft_load = dataclasses.replace(draft_load, weights=default_draft_weights(target_load))
    check_rows(config.tree, target_load.device)
    return dataclasses.replace(config, target_load=target_load, draft_load=draft_load)


def _placed(load: LoadConfig, device: str | None) -> LoadConfig:
    return dataclasses.replace(load, device=device) if load.device == AUTO else load


def default_target_weights(source: str, device: str) -> str:
    """The target's weight format when --weights is not given: a GGUF on the CPU runs as stored
    ("gguf": the file's own quality at its own size), anything else in bf16."""
    return "gguf" if device.startswith("cpu") and is_gguf(source) else "bf16"


def default_draft_weights(target: LoadConfig) -> str:
    """The draft's weight format when --draft-weights is not given.

    On CPU with bf16 activations and the C++ kernels, the draft reads fewer bytes than the
    target's format would make it (the draft only proposes tokens: its precision never changes
    the output): a bf16 target gets an int8 draft where the CPU has int8 dot products (VNNI; its
    acceptance on HumanEval matches a bf16 draft's) and an int4 one at the plain AVX2 level,
    where an int8 MAC costs twice an int4 one (docs/bench/avx2.md#int4-draft-at-avx2); a GGUF target (`gguf`) gets an
    int4 one (faster than the draft file as stored, whose Q8_0/Q5_0 blocks run as int8, at no
    loss of acceptance: docs/bench/auto.md#auto-check).  Otherwise the draft uses the target's format."""
    own = {"bf16": "int8", "gguf": "int4"}.get(target.weights)
    if own is None or not target.device.startswith("cpu") or target.dtype != "bfloat16":
        return target.weights
    if cpu_ext.load() is None:
        return target.weights
    return "int4" if own == "int8" and cpu_ext.level() < cpu_ext.LEVELS["avx2-vnni"] else own


def check_rows(tree: TreeConfig, device: str) -> None:
    """Refuse a verify size past the rows the CPU kernels take in one call: verification would
    silently leave the fused path (one-line ConfigError)."""
    if device.startswith("cpu") and tree.verify_size > MAX_DECODER_ROWS:
        raise ConfigError(f"--verify-size {tree.verify_size} exceeds the {MAX_DECODER_ROWS} rows the CPU kernels "
                          "verify in one call")
