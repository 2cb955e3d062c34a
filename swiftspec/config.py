"""Frozen configuration dataclasses, built once and validated on construction."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from swiftspec.errors import UserError


class ConfigError(UserError, ValueError):
    """A user-facing configuration problem (reported as a one-line error)."""


MODES = ("ar", "chain", "tree", "async")
NO_DRAFT = "none"  # --draft-model none: no draft model, the tree holds prompt-lookup candidates only
AUTO = "auto"  # choose among MODES by a cached profile of this machine and model pair (engines/auto)
# As LoadConfig.device, AUTO (the flags' default) is settled by engines.defaults.resolve_defaults: CUDA
# when its start-up check passed on this machine, else the CPU.
WEIGHT_FORMATS = ("bf16", "int8", "int4")
SINK_TOKENS = 4  # a windowed draft context keeps the prompt's first tokens (StreamingLLM's attention sinks)


@dataclass(frozen=True, slots=True, kw_only=True)
class TreeConfig:
    """Shape of the speculative tree (paper defaults: w = bs = 8)."""

    width: int = 8  # w: leaves expanded per draft forward
    verify_size: int = 8  # bs: nodes sent to the target per round
    depth: int = 0  # d: draft expansions per round (0 = choose by profiling)
    topk: int = 8  # children proposed per expanded leaf
    budget: int = 1024  # most nodes a tree may hold (a small budget starves the async tree's depth)
    chain_length: int = 4  # k: draft tokens per round in chain mode
    adaptive: bool = True  # serial tree: skip leaves not worth a draft forward (ends rounds early)
    adaptive_verify: bool = True  # tree (adaptive rounds) and async: verify only nodes worth their rows (else all bs)
    lookup: bool = True  # add prompt-lookup (n-gram) candidates to the tree as branches
    lookup_tokens: int = 8  # most tokens of one lookup candidate
    lookup_branches: int = 3  # most distinct continuations grafted per lookup
    lookup_ngram: int = 4  # longest n-gram matched against the prompt and output (down to 1)
    # prompt lookup also reads the last request's text past the prefix this one shares (the prompt
    # cache's: an editor's last suggestion, which the user may be typing now)
    lookup_earlier: bool = True
    # prompt tokens the draft model reads (its first SINK_TOKENS and the last ones; 0 = all): on a long
    # prompt the draft's own prefill would cost more decode time than its better guesses save
    draft_context: int = 256
    # serial rounds: a request whose drafting rounds emit fewer tokens per second than plain decoding
    # decodes plainly for a while, then drafts again (speculate/fallback.py); auto turns it on
    fallback: bool = False

    def __post_init__(self) -> None:
        for name in ("width", "verify_size", "topk", "budget", "chain_length", "lookup_tokens",
                     "lookup_branches", "lookup_ngram"):
            if getattr(self, name) < 1:
                raise ConfigError(f"tree setting {name} must be >= 1, got {getattr(self, name)}")
        for name in ("adaptive", "adaptive_verify", "lookup", "lookup_earlier", "fallback"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"tree setting {name} must be True or False, got {getattr(self, name)!r}")
        if self.depth < 0:
            raise ConfigError(f"tree depth must be >= 0, got {self.depth}")
        if self.draft_context != 0 and self.draft_context < 2 * SINK_TOKENS:
            raise ConfigError(f"draft context must be 0 (the whole prompt) or >= {2 * SINK_TOKENS}, "
                              f"got {self.draft_context}")
        if self.budget < self.verify_size + self.width * self.topk:
            raise ConfigError("tree budget must hold at least verify_size + width * topk nodes")


# "gguf": a GGUF's Q4_K / Q5_K / Q6_K / Q8_0 / Q5_0 / Q4_0 linears as stored (weights/gguf_native.py),
# the rest int8.
WEIGHT_FORMATS = ("bf16", "int8", "int4", "gguf")


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadConfig:
    """How a model is placed in memory."""

    device: str = "cpu"  # or AUTO, until engines.defaults.resolve_defaults settles it
    dtype: str = "bfloat16"  # "bfloat16" | "float32" | "float16"
    max_seq_len: int = 0  # tokens of context (KV cache length); 0: the model's own, within memory (runner.load)
    # weight format of the linear layers: "bf16" | "int8" | "int4" | "gguf"; None (no --weights or
    # --draft-weights): the default, settled by engines.defaults.resolve_defaults
    weights: str | None = "bf16"

    def __post_init__(self) -> None:
        if self.dtype not in ("bfloat16", "float32", "float16"):
            raise ConfigError(f"unsupported dtype {self.dtype!r}")
        if self.weights is not None and self.weights not in WEIGHT_FORMATS:
            raise ConfigError(f"unsupported weight format {self.weights!r}")
        if self.max_seq_len != 0 and self.max_seq_len < 16:
            raise ConfigError(f"max_seq_len must be 0 (the model's own) or >= 16, got {self.max_seq_len}")


@dataclass(frozen=True, slots=True, kw_only=True)
class AutoConfig:
    """What `--mode auto` may choose from, and whether it measures again."""

    modes: tuple[str, ...] = MODES  # candidate engines; flags that apply to some modes narrow them
    choose_draft_weights: bool = True  # False: keep draft_load.weights (--draft-weights was given)
    reprofile: bool = False  # profile again even when this machine and pair have a cached profile

    def __post_init__(self) -> None:
        if not self.modes:
            raise ConfigError("no engine is left for --mode auto to choose from")
        unknown = [m for m in self.modes if m not in MODES]
        if unknown:
            raise ConfigError(f"unknown mode {unknown[0]!r} among the auto candidates")


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoteConfig:
    """async across hosts: where the two hosts meet, the shared secret, and how long a message may take."""

    rendezvous: str  # HOST:PORT the target host listens on (and the draft host connects to)
    secret_file: str = ""  # first line is the shared secret; "" = $SWIFTSPEC_SECRET
    link_timeout: float = 30.0  # seconds any one message (or the handshake) may take before the link counts as lost
    wait_draft: float = 0.0  # target host: seconds to wait at start for a draft host (0 = serve ar until one joins)

    def __post_init__(self) -> None:
        if not self.link_timeout > 0 or not self.wait_draft >= 0:
            raise ConfigError("--link-timeout must be > 0 and --wait-draft >= 0 seconds")


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """One engine: which models, how they are loaded, and how speculation is shaped."""

    mode: str = "ar"  # one of MODES, or AUTO
    target: str = "qwen2.5-coder-1.5b-instruct"  # bundled name, .gguf path or HF dir
    draft: str = "qwen2.5-coder-0.5b-instruct"  # unused by mode "ar"; NO_DRAFT: prompt lookup alone drafts
    target_load: LoadConfig = LoadConfig()
    draft_load: LoadConfig = LoadConfig()
    tree: TreeConfig = TreeConfig()
    draft_vocab: int = 32768  # pruned draft LM head size (0 = full vocabulary); requests it does not cover use the full
    target_tp: int = 1
    draft_tp: int = 1
    draft_cores: int = 0  # async on CPU: threads of the draft group (0 = half the cores)
    trace: str = ""  # write each request's timeline here (Chrome trace-event JSON)
    auto: AutoConfig = AutoConfig()  # used when mode is AUTO
    worker_timeout: float = 0.0  # async: seconds a decode round may take before the workers count as hung (0 = auto)
    remote: RemoteConfig | None = None  # async with the draft group on another host (engines/remote.py)
    # MiB of earlier texts' target KV kept for later prompts beside the live cache (-1: sized from
    # the free memory; 0: only the last text's KV is kept)
    prompt_cache_mb: int = -1

    def __post_init__(self) -> None:
        if self.remote is not None and (self.mode != "async" or self.target_tp != 1 or self.draft_tp != 1):
            raise ConfigError("--rendezvous links one target rank to one draft rank: --mode async, tensor-parallel 1")
        if self.mode not in MODES + (AUTO,):
            raise ConfigError(f"unknown mode {self.mode!r} (choose from {', '.join(MODES + (AUTO,))})")
        if self.target_tp < 1 or self.draft_tp < 1:
            raise ConfigError("tensor-parallel sizes must be >= 1")
        if self.prompt_cache_mb < -1:
            raise ConfigError(f"--prompt-cache-mb must be >= 0 (or -1: sized from the free memory), got {self.prompt_cache_mb}")
        if not self.worker_timeout >= 0:
            raise ConfigError(f"worker timeout must be >= 0 seconds, got {self.worker_timeout}")
        if self.draft == NO_DRAFT and self.mode != "ar" and not self.tree.lookup:
            raise ConfigError("--draft-model none drafts by prompt lookup alone; it needs --lookup 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    """The HTTP server: where it listens, who may call it, and the limits on each request."""

    host: str = "127.0.0.1"  # loopback only unless asked otherwise
    port: int = 8000  # 0 = any free port
    api_key: str = ""  # "" = no authentication
    max_queue: int = 64  # requests that may wait behind the running one
    max_tokens: int = 1024  # most new tokens one request may ask for (also the default)
    max_body_bytes: int = 1 << 20
    max_prompt_tokens: int = 0  # 0 = the engine's context length - 1
    served_model_name: str = "swiftspec"  # the `model` that requests must name
    max_prefill_s: float = 60.0  # refuse a prompt whose prefill would take longer, at the measured rate (0 = off)
    shutdown_grace_s: float = 5.0  # SIGTERM: running requests may finish for this long, then end with an error
    body_timeout_s: float = 30.0  # a request body not read in full within this long gets 408

    def __post_init__(self) -> None:
        if not self.host:
            raise ConfigError("the server host must not be empty")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be in [0, 65535], got {self.port}")
        if any(c.isspace() for c in self.api_key):
            raise ConfigError("the API key must not contain whitespace")
        for name in ("max_queue", "max_tokens", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"server setting {name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_prefill_s", "shutdown_grace_s"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"server setting {name} must be >= 0, got {getattr(self, name)}")
        if not self.body_timeout_s > 0:
            raise ConfigError(f"server setting body_timeout_s must be > 0, got {self.body_timeout_s}")
        if self.max_prompt_tokens < 0:
            raise ConfigError(f"max_prompt_tokens must be >= 0, got {self.max_prompt_tokens}")
        if not self.served_model_name:
            raise ConfigError("the served model name must not be empty")


def require_settled(config: EngineConfig) -> None:
    """Refuse (one-line ConfigError) a config that still holds an open default: what builds or
    chooses an engine takes a config that resolve_defaults has settled, and decides nothing itself."""
    for load in (config.target_load, config.draft_load):
        if load.device == AUTO or load.weights is None:
            raise ConfigError("the engine config has open defaults (device auto or weights None): settle it "
                              "with swiftspec.engines.defaults.resolve_defaults first")


def chain_config(tree: TreeConfig) -> TreeConfig:
    """Classic speculative decoding as a one-wide tree: k draft tokens, k + 1 verified nodes (no
    lookup branches, which would make it a tree)."""
    k = tree.chain_length
    return dataclasses.replace(tree, width=1, topk=1, depth=k, verify_size=k + 1, budget=max(tree.budget, 2 * k + 2),
                               adaptive=False, lookup=False)
