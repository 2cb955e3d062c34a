"""Architecture hyper-parameters of the supported families (Llama/Mistral, Qwen2/Qwen3, Gemma 2/3),
read from HF config.json (model/hf_args.py) or GGUF metadata (weights/gguf.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from swiftspec.config import ConfigError

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "gemma2", "gemma3")
# Bytes per weight of our quantized formats (swiftspec.kernels.quant): int8 is one byte plus a
# per-channel scale (negligible); int4 is half a byte plus an fp16 scale and min per 128-weight group.
# gguf runs a Q4_K_M file's blocks as stored: Q4_K at 4.625 bits, Q6_K (the LM head, half of
# ffn_down and attn_v) at 6.625; 5.25 bits on average for the default target.
FORMAT_BYTES = {"int8": 1.0, "int4": 0.5 + 4 / 128, "gguf": 5.25 / 8}
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True, slots=True, kw_only=True)
class RopeScaling:
    """RoPE frequency scaling as transformers computes it: "llama3" (Llama 3.1), "linear"
    (positions divided by factor) or "yarn" (NTK-by-parts, with cos/sin scaled by attention_factor)."""

    kind: str = "none"  # "none" | "llama3" | "linear" | "yarn"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    beta_fast: float = 32.0  # yarn: rotations bounding the extrapolated (kept) band
    beta_slow: float = 1.0  # yarn: rotations bounding the interpolated (scaled) band
    attention_factor: float = 1.0  # yarn: cos and sin are multiplied by this
    truncate: bool = True  # yarn: round the correction range to whole dimensions


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelArgs:
    """Everything the decoder needs to know about one checkpoint's shape."""

    arch: str  # one of SUPPORTED_ARCHS
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
    qk_norm: bool = False  # Qwen3, Gemma 3: RMSNorm over each q and k head before RoPE
    # Gemma 2/3 blocks: embeddings times sqrt(hidden), RMSNorm by (1 + w), norms before and after
    # attention and the MLP, GeGLU with tanh-approximated gelu
    gemma: bool = False
    query_pre_attn_scalar: float | None = None  # attention scale is this ** -0.5 (None: head_dim)
    attn_softcap: float | None = None  # Gemma 2: scores become cap * tanh(scores / cap)
    final_softcap: float | None = None  # Gemma 2: logits become cap * tanh(logits / cap)
    sliding_window: int | None = None  # a sliding layer's query sees its last this-many tokens, itself included
    sliding_layers: tuple[bool, ...] = ()  # which layers slide; () = every layer when sliding_window is set
    local_rope_theta: float | None = None  # Gemma 3: RoPE base of the sliding layers (unscaled)

    def __post_init__(self) -> None:
        if self.arch not in SUPPORTED_ARCHS:
            raise ConfigError(f"unsupported architecture {self.arch!r} (supported: {', '.join(SUPPORTED_ARCHS)})")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError("num_heads must be a multiple of num_kv_heads")
        if self.sliding_layers and len(self.sliding_layers) != self.num_layers:
            raise ConfigError(f"{len(self.sliding_layers)} layer types for {self.num_layers} layers")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ConfigError(f"sliding_window must be positive, not {self.sliding_window}")

    @property
    def plain(self) -> bool:
        """A Llama/Qwen2 block (what the fused C++ decoder and the Triton attention run): no
        q/k norms, no Gemma block, the default attention scale, no soft-capping, one RoPE."""
        return not (self.qk_norm or self.gemma or self.local_rope_theta is not None) and \
            self.query_pre_attn_scalar is None and self.attn_softcap is None and self.final_softcap is None

    def slides(self, layer: int) -> bool:
        """Whether layer `layer` attends through the sliding window."""
        return self.sliding_window is not None and (not self.sliding_layers or self.sliding_layers[layer])

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
