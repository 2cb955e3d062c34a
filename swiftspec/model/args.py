"""Architecture hyper-parameters of the Llama/Qwen2 family, read from HF config.json or GGUF metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from swiftspec.config import ConfigError

SUPPORTED_ARCHS = ("llama", "qwen2")
# Bytes per weight of our quantized formats (swiftspec.kernels.quant): int8 is one byte plus a
# per-channel scale (negligible); int4 is half a byte plus an fp16 scale and min per 128-weight group.
# gguf runs a Q4_K_M file's blocks as stored: Q4_K at 4.625 bits, Q6_K (the LM head, half of
# ffn_down and attn_v) at 6.625; 5.25 bits on average for the default target.
FORMAT_BYTES = {"int8": 1.0, "int4": 0.5 + 4 / 128, "gguf": 5.25 / 8}
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True, slots=True, kw_only=True)
class RopeScaling:
    """Llama-3 style frequency scaling ("llama3"); factor 1.0 means none."""

    kind: str = "none"  # "none" | "llama3" | "linear"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelArgs:
    """Everything the decoder needs to know about one checkpoint's shape."""

    arch: str  # "llama" | "qwen2"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    qkv_bias: bool = False
    o_bias: bool = False  # Llama's attention_bias also puts a bias on o_proj; Qwen2's does not
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096

    def __post_init__(self) -> None:
        if self.arch not in SUPPORTED_ARCHS:
            raise ConfigError(f"unsupported architecture {self.arch!r} (supported: {', '.join(SUPPORTED_ARCHS)})")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError("num_heads must be a multiple of num_kv_heads")

    def linear_weights(self, head_rows: int | None = None) -> int:
        """Weights in every linear layer plus the LM head (head_rows of them; default: the whole
        vocabulary), embeddings and norms excluded: what one forward reads."""
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        h, i = self.hidden_size, self.intermediate_size
        per_layer = h * q + 2 * h * kv + q * h + 3 * h * i
        return self.num_layers * per_layer + (self.vocab_size if head_rows is None else head_rows) * h

    def weight_bytes(self, dtype: str, weights: str, head_rows: int | None = None) -> int:
        """Bytes our engine reads per forward with weights in format `weights` ("bf16" = dtype)."""
        return int(self.linear_weights(head_rows) * FORMAT_BYTES.get(weights, DTYPE_BYTES[dtype]))

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> "ModelArgs":
        """Build from a transformers config.json dictionary."""
        model_type = cfg.get("model_type", "")
        arch = {"llama": "llama", "qwen2": "qwen2", "mistral": "llama"}.get(model_type)
        if arch is None:
            raise ConfigError(f"unsupported architecture {model_type!r} (supported: {', '.join(SUPPORTED_ARCHS)})")
        heads = cfg["num_attention_heads"]
        hidden = cfg["hidden_size"]
        # transformers >= 5 writes theta and scaling together under "rope_parameters"
        rope = cfg.get("rope_parameters") or {}
        return cls(
            arch=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=hidden,
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or hidden // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0),
            rope_scaling=_rope_scaling(cfg.get("rope_scaling") or rope),
            qkv_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
            o_bias=arch == "llama" and bool(cfg.get("attention_bias", False)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
        )


def _rope_scaling(raw: dict[str, Any] | None) -> RopeScaling:
    if not raw:
        return RopeScaling()
    kind = raw.get("rope_type") or raw.get("type") or "none"
    if kind == "default":
        return RopeScaling()
    if kind not in ("llama3", "linear"):
        raise ConfigError(f"unsupported rope scaling {kind!r}")
    return RopeScaling(
        kind=kind,
        factor=float(raw.get("factor", 1.0)),
        low_freq_factor=float(raw.get("low_freq_factor", 1.0)),
        high_freq_factor=float(raw.get("high_freq_factor", 4.0)),
        original_max_position=int(raw.get("original_max_position_embeddings", 8192)),
    )
