"""Load a model ready to run: the target packed as its weight format asks, the context length a
config leaves open (0), and the check that a pair shares its tokenizer."""

from __future__ import annotations

import dataclasses
import logging
import os

import torch

from swiftspec import kernels
from swiftspec.cache.prompt_store import PromptStore
from swiftspec.config import NO_DRAFT, ConfigError, EngineConfig, LoadConfig
from swiftspec.model.args import ModelArgs
from swiftspec.parallel.state import ParallelState
from swiftspec.tokenizer import Tokenizer, vocab_mismatch
from swiftspec.weights.loaded_model import LoadedModel
from swiftspec.weights.loader import DTYPES, load_model, model_args
from swiftspec.weights.source import resolve_source

log = logging.getLogger("swiftspec")

_PROBE = "def check(pair):\n    return 'ok'  # ünï\n"  # also catches a BOS one tokenizer adds and the other not
KV_MEMORY_SHARE = 0.25  # the default context's KV caches take at most this share of the free memory
CONTEXT_STEP = 256  # a context capped by memory is a multiple of this
PROMPT_CACHE_SHARE = 0.125  # the default prompt cache (earlier texts' KV) takes this share of the free memory
PROMPT_CACHE_MAX_MB = 4096  # ... and at most this much


def load_target(source: str, load: LoadConfig, parallel: ParallelState | None = None) -> LoadedModel:
    """Load a target model (or this rank's shard) and pack its weights as `load.weights` asks."""
    loaded = load_model(source, load, parallel or ParallelState())
    kernels.prepare_model_(loaded.model, load.weights)
    return loaded


def resolve_context(config: EngineConfig) -> EngineConfig:
    """config with the context length settled: --max-seq-len 0 (the default) becomes the target's
    own context length (32k for the default pair), capped so that the target's and the draft's KV
    caches take at most KV_MEMORY_SHARE of the memory free on the device (a warning says so)."""
    if config.target_load.max_seq_len:
        return config
    target = model_args(resolve_source(config.target))
    per_token = _kv_bytes(target, config.target_load.dtype)
    if config.mode != "ar" and config.draft != NO_DRAFT:
        per_token += _kv_bytes(model_args(resolve_source(config.draft)), config.draft_load.dtype)
    fits = int(KV_MEMORY_SHARE * free_memory(config.target_load.device) / per_token) // CONTEXT_STEP * CONTEXT_STEP
    length = max(CONTEXT_STEP, min(target.max_position_embeddings, fits))
    if length < target.max_position_embeddings:
        log.warning("context: %d tokens (the model takes %d; more would not fit in memory: --max-seq-len)",
                    length, target.max_position_embeddings)
    return with_context(config, length)


def with_context(config: EngineConfig, length: int) -> EngineConfig:
    """config with a context of `length` tokens for the target and the draft."""
    return dataclasses.replace(config, target_load=dataclasses.replace(config.target_load, max_seq_len=length),
                               draft_load=dataclasses.replace(config.draft_load, max_seq_len=length))


def _kv_bytes(args: ModelArgs, dtype: str) -> int:
    """Bytes of K and V per cached token."""
    return 2 * args.num_layers * args.num_kv_heads * args.head_dim * DTYPES[dtype].itemsize


def prompt_store(config: EngineConfig) -> PromptStore | None:
    """The target's store of earlier texts' KV, as large as config.prompt_cache_mb says (-1: a
    PROMPT_CACHE_SHARE of the free memory, at most PROMPT_CACHE_MAX_MB; 0: none, so that only the
    last text's KV, in the live cache, is kept).  None too for a tensor-parallel target (its ranks
    would have to evict alike)."""
    mb = config.prompt_cache_mb
    if mb < 0:
        mb = min(PROMPT_CACHE_MAX_MB, int(PROMPT_CACHE_SHARE * free_memory(config.target_load.device)) >> 20)
    return PromptStore(mb << 20) if mb > 0 and config.target_tp == 1 else None


def free_memory(device: str) -> int:
    """Bytes free for new tensors: on CUDA the device's, else the host's MemAvailable."""
    if device.startswith("cuda"):
        return torch.cuda.mem_get_info(torch.device(device))[0]
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_pair(target: Tokenizer, draft: Tokenizer, target_rows: int | None = None,
               draft_rows: int | None = None) -> None:
    """Draft and target (their tokenizers) must agree on every token the draft can emit, since
    the tree carries token ids between them: the same spelling of each id (tokenizer.vocab_mismatch,
    given each model's LM-head rows; padding rows may differ), and the same split of a probe text.
    ConfigError (one line) naming the first mismatch otherwise."""
    problem = vocab_mismatch(target.tokens, draft.tokens, target_rows or target.vocab_size,
                             draft_rows or draft.vocab_size)
    if problem is None and target.encode(_PROBE) != draft.encode(_PROBE):
        problem = f"they split {_PROBE!r} differently ({target.encode(_PROBE)} and {draft.encode(_PROBE)})"
    if problem is not None:
        raise ConfigError(f"draft and target do not pair: {problem}; pick a draft of the target's family")
