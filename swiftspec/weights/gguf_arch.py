"""Per-family GGUF conventions of llama.cpp's converter: tensor names of Qwen3's and Gemma's extra norms,
Gemma's norms stored as 1 + w, and the metadata of Gemma 2/3 (soft-capping, sliding windows, local RoPE).

A Mistral GGUF is a "llama" one; llama.cpp runs it without a window unless the file names one
(`llama.attention.sliding_window`), and so do we.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

QK_NORM_NAMES = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
# Gemma's sandwich norms; its ffn_norm is the pre-MLP norm (Llama's ffn_norm is post_attention_layernorm)
GEMMA_NORM_NAMES = {
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
# llama.cpp's swa pattern n: layer il slides iff il % n < n - 1 (Gemma 2 alternates; Gemma 3: 5 of 6)
DEFAULT_SWA_PATTERN = {"gemma2": 2, "gemma3": 6}
# Layer counts of the 27B models, whose attention scale llama.cpp takes from hidden / heads
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}
GEMMA3_LOCAL_THETA = 10000.0  # llama.cpp's rope_freq_base_train_swa for Gemma 3

Meta = Callable[..., Any]  # GGUFCheckpoint.meta: (key, default) -> value


def block_names(arch: str, base: dict[str, str]) -> dict[str, str]:
    """GGUF block-tensor fragment -> HF fragment for `arch`, extending base (Llama's)."""
    names = dict(base)
    if arch in ("qwen3", "gemma3"):
        names.update(QK_NORM_NAMES)
    if arch.startswith("gemma"):
        names.update(GEMMA_NORM_NAMES)
    return names


def norm_shift(arch: str, gguf_name: str) -> float:
    """What llama.cpp added to a stored tensor: 1 for Gemma's norms (it runs them as plain x * w)."""
    return 1.0 if arch.startswith("gemma") and gguf_name.endswith("norm.weight") else 0.0


def swa_layers(pattern: int, num_layers: int) -> tuple[bool, ...]:
    """llama.cpp's set_swa_pattern: which layers slide."""
    return tuple(i % pattern < pattern - 1 for i in range(num_layers))


def family_fields(meta: Meta, arch: str, shape: dict[str, int], has_qk_norm: bool) -> dict[str, Any]:
    """ModelArgs fields beyond Llama's that the metadata of `arch` describes; shape has the keys
    num_layers, hidden_size, num_heads and head_dim."""
    window = meta(f"{arch}.attention.sliding_window", None)
    fields: dict[str, Any] = dict(qk_norm=has_qk_norm, sliding_window=None if window is None else int(window))
    if not arch.startswith("gemma"):
        return fields
    layers = shape["num_layers"]
    big = layers == _GEMMA_27B_LAYERS[arch]
    fields.update(
        gemma=True,
        query_pre_attn_scalar=float(shape["hidden_size"] // shape["num_heads"] if big else shape["head_dim"]),
        attn_softcap=_cap(meta(f"{arch}.attn_logit_softcapping", None)),
        final_softcap=_cap(meta(f"{arch}.final_logit_softcapping", None)),
        sliding_layers=_sliding_layers(meta(f"{arch}.attention.sliding_window_pattern", None), arch, layers)
        if window is not None else (),
    )
    if arch == "gemma3":
        fields["local_rope_theta"] = f32(meta(f"{arch}.rope.freq_base_swa", GEMMA3_LOCAL_THETA))
    return fields


def _sliding_layers(pattern: Any, arch: str, layers: int) -> tuple[bool, ...]:
    if isinstance(pattern, list):  # one flag per layer, True = sliding
        return tuple(bool(p) for p in pattern)
    return swa_layers(int(pattern or DEFAULT_SWA_PATTERN[arch]), layers)


def _cap(value: Any) -> float | None:
    return None if value is None or float(value) == 0.0 else f32(value)


def f32(value: float) -> float:
    """GGUF stores floats as float32: 1e-6 reads back as 9.99999997e-07. Take the shortest decimal
    that rounds to the same float32, which is what the original config said."""
    return float(str(np.float32(value)))
