"""transformers config.json -> ModelArgs fields, per family: Llama/Mistral, Qwen2/Qwen3, Gemma 2/3 text.

Both config layouts are read: transformers < 5 (`rope_theta`, `rope_scaling`, Gemma 3's
`rope_local_base_freq`, `sliding_window_pattern`) and >= 5 (`rope_parameters`, per layer type for
Gemma 3; `layer_types`).
"""

from __future__ import annotations

import math
from typing import Any

from swiftspec.config import ConfigError
from swiftspec.model.args import SUPPORTED_ARCHS, ModelArgs, RopeScaling

# HF model_type -> our arch; Mistral is a Llama with a sliding window
ARCH_OF_MODEL_TYPE = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
                      "gemma2": "gemma2", "gemma3_text": "gemma3"}
_SLIDING, _FULL = "sliding_attention", "full_attention"


def model_args(cfg: dict[str, Any]) -> ModelArgs:
    """ModelArgs of a transformers config.json dictionary."""
    return ModelArgs(**hf_fields(cfg))


def hf_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """The ModelArgs keyword arguments a config.json describes; ConfigError for what we cannot run."""
    model_type = cfg.get("model_type", "")
    arch = ARCH_OF_MODEL_TYPE.get(model_type)
    if arch is None:
        hint = " (a multimodal Gemma 3: use its text-only checkpoint)" if model_type == "gemma3" else ""
        raise ConfigError(f"unsupported architecture {model_type!r}{hint} (supported: {', '.join(SUPPORTED_ARCHS)})")
    heads = cfg["num_attention_heads"]
    hidden = cfg["hidden_size"]
    fields = dict(
        arch=arch,
        vocab_size=cfg["vocab_size"],
        hidden_size=hidden,
        intermediate_size=cfg["intermediate_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or hidden // heads,
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        qkv_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
        o_bias=arch in ("llama", "qwen3") and bool(cfg.get("attention_bias", False)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", arch.startswith("gemma"))),
        max_position_embeddings=cfg.get("max_position_embeddings", 4096),
    )
    fields.update(_rope_fields(cfg, arch))
    fields.update(_attention_fields(cfg, arch))
    return fields


def _rope_fields(cfg: dict[str, Any], arch: str) -> dict[str, Any]:
    """rope_theta and rope_scaling (of the full-attention layers) and Gemma 3's local theta."""
    # transformers >= 5 writes theta and scaling together under "rope_parameters"
    rope = cfg.get("rope_parameters") or {}
    if arch != "gemma3":
        theta = float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0)
        return dict(rope_theta=theta, rope_scaling=rope_scaling(cfg.get("rope_scaling") or rope, cfg))
    full = rope.get(_FULL) or {}
    local = rope.get(_SLIDING) or {}
    return dict(
        rope_theta=float(cfg.get("rope_theta") or full.get("rope_theta") or 1000000.0),
        rope_scaling=rope_scaling(cfg.get("rope_scaling") or full, cfg),
        local_rope_theta=float(cfg.get("rope_local_base_freq") or local.get("rope_theta") or 10000.0),
    )


def _attention_fields(cfg: dict[str, Any], arch: str) -> dict[str, Any]:
    """q/k norms, the Gemma block, soft-capping and the sliding window with its layers."""
    if arch in ("qwen2", "qwen3") and cfg.get("use_sliding_window"):
        raise ConfigError(f"{arch} with use_sliding_window is not supported")
    window = cfg.get("sliding_window")
    if arch in ("qwen2", "qwen3"):  # their sliding_window only counts with use_sliding_window
        window = None
    fields: dict[str, Any] = dict(qk_norm=arch in ("qwen3", "gemma3"), sliding_window=window)
    if not arch.startswith("gemma"):
        return fields
    if cfg.get("hidden_activation", cfg.get("hidden_act", "gelu_pytorch_tanh")) not in ("gelu_pytorch_tanh",):
        raise ConfigError(f"{arch}: unsupported activation {cfg.get('hidden_activation')!r}")
    if cfg.get("use_bidirectional_attention"):  # EmbeddingGemma: an encoder, not a causal LM
        raise ConfigError(f"{arch} with bidirectional attention (an embedding model) cannot generate")
    scalar = cfg.get("query_pre_attn_scalar")
    fields.update(
        gemma=True,
        query_pre_attn_scalar=None if scalar is None else float(scalar),
        attn_softcap=_cap(cfg.get("attn_logit_softcapping")),
        final_softcap=_cap(cfg.get("final_logit_softcapping")),
        sliding_layers=_sliding_layers(cfg, arch) if window is not None else (),
    )
    return fields


def _sliding_layers(cfg: dict[str, Any], arch: str) -> tuple[bool, ...]:
    """Which layers slide: `layer_types`, else Gemma 2's every other layer (the first slides) and
    Gemma 3's sliding_window_pattern (every pattern-th layer is global)."""
    layers = cfg["num_hidden_layers"]
    if cfg.get("layer_types"):
        types = tuple(cfg["layer_types"])
        if set(types) - {_SLIDING, _FULL}:
            raise ConfigError(f"unsupported layer types {sorted(set(types) - {_SLIDING, _FULL})}")
        return tuple(t == _SLIDING for t in types)
    if arch == "gemma2":
        return tuple(i % 2 == 0 for i in range(layers))
    pattern = int(cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6)
    return tuple((i + 1) % pattern != 0 for i in range(layers))


def _cap(value: Any) -> float | None:
    return None if value is None else float(value)


def rope_scaling(raw: dict[str, Any] | None, cfg: dict[str, Any]) -> RopeScaling:
    """RopeScaling of a `rope_scaling` / `rope_parameters` dictionary (type "default" = none)."""
    if not raw:
        return RopeScaling()
    kind = raw.get("rope_type") or raw.get("type") or "none"
    if kind in ("default", "none"):
        return RopeScaling()
    if kind not in ("llama3", "linear", "yarn"):
        raise ConfigError(f"unsupported rope scaling {kind!r}")
    if kind == "yarn":
        return _yarn(raw, cfg)
    return RopeScaling(
        kind=kind,
        factor=float(raw.get("factor", 1.0)),
        low_freq_factor=float(raw.get("low_freq_factor", 1.0)),
        high_freq_factor=float(raw.get("high_freq_factor", 4.0)),
        original_max_position=int(raw.get("original_max_position_embeddings", 8192)),
    )


def _yarn(raw: dict[str, Any], cfg: dict[str, Any]) -> RopeScaling:
    """YaRN as transformers' _compute_yarn_parameters reads it (attention_factor from factor and
    mscale / mscale_all_dim when not given)."""
    original = int(raw.get("original_max_position_embeddings") or cfg.get("max_position_embeddings", 4096))
    factor = raw.get("factor")
    factor = float(factor) if factor is not None else cfg.get("max_position_embeddings", 4096) / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = raw.get("attention_factor")
    if attention is None:
        m, m_all = raw.get("mscale"), raw.get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    return RopeScaling(kind="yarn", factor=factor, original_max_position=original,
                       beta_fast=float(raw.get("beta_fast") or 32), beta_slow=float(raw.get("beta_slow") or 1),
                       attention_factor=float(attention), truncate=bool(raw.get("truncate", True)))
