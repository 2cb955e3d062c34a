"""Frozen configuration dataclasses, built once and validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

from swiftspec.errors import UserError


class ConfigError(UserError, ValueError):
    """A user-facing configuration problem (reported as a one-line error)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TreeConfig:
    """Shape of the speculative tree (paper defaults: w = bs = 8)."""

    width: int = 8  # w: leaves expanded per draft forward
    verify_size: int = 8  # bs: nodes sent to the target per round
    depth: int = 0  # d: draft expansions per round (0 = choose by profiling)
    topk: int = 8  # children proposed per expanded leaf
    budget: int = 1024  # most nodes a tree may hold (a small budget starves the async tree's depth)
    chain_length: int = 4  # k: draft tokens per round in chain mode
    adaptive: int = 1  # serial tree: 1 = skip leaves not worth a draft forward (ends rounds early), 0 = off
    adaptive_verify: int = 1  # serial tree with adaptive rounds: 1 = verify only nodes worth their rows, 0 = all bs
    lookup: int = 1  # 1 = add prompt-lookup (n-gram) candidates to the tree as branches, 0 = off
    lookup_tokens: int = 8  # most tokens of one lookup candidate
    lookup_branches: int = 3  # most distinct continuations grafted per lookup
    lookup_ngram: int = 4  # longest n-gram matched against the prompt and output (down to 1)

    def __post_init__(self) -> None:
        for name in ("width", "verify_size", "topk", "budget", "chain_length", "lookup_tokens",
                     "lookup_branches", "lookup_ngram"):
            if getattr(self, name) < 1:
                raise ConfigError(f"tree setting {name} must be >= 1, got {getattr(self, name)}")
        for name in ("adaptive", "adaptive_verify", "lookup"):
            if getattr(self, name) not in (0, 1):
                raise ConfigError(f"tree setting {name} must be 0 or 1, got {getattr(self, name)}")
        if self.depth < 0:
            raise ConfigError(f"tree depth must be >= 0, got {self.depth}")
        if self.budget < self.verify_size + self.width * self.topk:
            raise ConfigError("tree budget must hold at least verify_size + width * topk nodes")


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadConfig:
    """How a model is placed in memory."""

    device: str = "cpu"
    dtype: str = "bfloat16"  # "bfloat16" | "float32" | "float16"
    max_seq_len: int = 4096
    weights: str = "bf16"  # weight format of the linear layers: "bf16" | "int8" | "int4"

    def __post_init__(self) -> None:
        if self.dtype not in ("bfloat16", "float32", "float16"):
            raise ConfigError(f"unsupported dtype {self.dtype!r}")
        if self.weights not in ("bf16", "int8", "int4"):
            raise ConfigError(f"unsupported weight format {self.weights!r}")
        if self.max_seq_len < 16:
            raise ConfigError(f"max_seq_len must be >= 16, got {self.max_seq_len}")


MODES = ("ar", "chain", "tree", "async")
NO_DRAFT = "none"  # --draft-model none: no draft model, the tree holds prompt-lookup candidates only


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """One engine: which models, how they are loaded, and how speculation is shaped."""

    mode: str = "ar"
    target: str = "qwen2.5-coder-1.5b-instruct"  # bundled name, .gguf path or HF dir
    draft: str = "qwen2.5-coder-0.5b-instruct"  # unused by mode "ar"; NO_DRAFT: prompt lookup alone drafts
    target_load: LoadConfig = LoadConfig()
    draft_load: LoadConfig = LoadConfig()
    tree: TreeConfig = TreeConfig()
    draft_vocab: int = 32768  # pruned draft LM head size (0 = full vocabulary); requests it does not cover use the full
    target_tp: int = 1
    draft_tp: int = 1
    draft_cores: int = 0  # async on CPU: threads of the draft group (0 = half the cores)
    trace: str = ""  # async: write the per-round timeline here as JSON

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"unknown mode {self.mode!r} (choose from {', '.join(MODES)})")
        if self.target_tp < 1 or self.draft_tp < 1:
            raise ConfigError("tensor-parallel sizes must be >= 1")
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
        if self.max_prompt_tokens < 0:
            raise ConfigError(f"max_prompt_tokens must be >= 0, got {self.max_prompt_tokens}")
        if not self.served_model_name:
            raise ConfigError("the served model name must not be empty")
