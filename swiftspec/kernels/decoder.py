"""Fused CPU forward of a decoder stack's layers for a few rows (csrc/decoder_cpu.cpp).

One C++ call runs every layer of a Llama/Qwen2 decoder (pre-norm attention and SwiGLU blocks) at
the row counts of decoding, tree verification and draft expansion.  It calls the kernels the
unfused model calls (the packed linears, the masked attention, the row-wise ops), in the same
order with the same rounding, so its output equals the unfused forward's bit for bit; what it
removes is the Python and ATen dispatch around ~20 ops per layer.  Its reference is the model's
own unfused forward (tests/unit/test_fused_decoder.py compares the two).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from swiftspec.kernels import cpu_ext
from swiftspec.kernels.packed import PackedWeight

MAX_DECODER_ROWS = cpu_ext.MAX_SMALL_ROWS  # longer calls (prefill) run the unfused model
_EMPTY = torch.empty(0)
_KQUANT_CODES = {"q4k": 3, "q6k": 4, "q5k": 6}  # PackedLinear's fmt codes (csrc/decoder.h)
_QBLOCK_CODES = {"q8_0": 5, "q5_0": 7, "q4_0": 8}


@dataclass(frozen=True, slots=True)
class LayerWeights:
    """One decoder layer as the fused forward takes it: x + o(attn(norm1(x))), then
    x + down(silu(gate(.)) * up(.)) of norm2(x)."""

    input_norm: torch.Tensor  # [hidden]
    post_norm: torch.Tensor  # [hidden]
    qkv: PackedWeight  # [(heads + 2 kv_heads) * head_dim, hidden]: q, then k, then v
    qkv_bias: torch.Tensor | None
    o: PackedWeight  # [hidden, heads * head_dim]
    o_bias: torch.Tensor | None
    gate_up: PackedWeight  # [2 * intermediate, hidden]: gate rows first
    down: PackedWeight  # [hidden, intermediate]


def _fusable(layer: LayerWeights, dtype: torch.dtype) -> bool:
    linears = (layer.qkv, layer.o, layer.gate_up, layer.down)
    if not all(isinstance(w, PackedWeight) and w.device.type == "cpu" for w in linears):
        return False
    bf16_ok = dtype == torch.bfloat16 and cpu_ext.available("bf16_linear")  # bf16 rows only
    return all(w.fmt != "bf16" or bf16_ok for w in linears) and layer.input_norm.dtype == dtype


def _packed(ext, w: PackedWeight, bias: torch.Tensor | None):  # noqa: ANN001, ANN202 - extension types
    """PackedLinear(fmt: 0 bf16 / 1 int8 / 2 int4, qweight, scale, d, mn, bias, N, K, block), or
    for the K-quants PackedLinear(3 q4k / 6 q5k / 4 q6k, qweight, d, dm, bias, N, K, qh, sc, mm), for the
    GGUF blocks PackedLinear(5 q8_0 / 7 q5_0 / 8 q4_0, qweight, d, -, bias, N, K, qh (q5_0), -, -)."""
    n, k = w.shape
    if w.fmt in _QBLOCK_CODES:
        qh = w.kblocks.qh if w.fmt == "q5_0" else _EMPTY
        return ext.PackedLinear(_QBLOCK_CODES[w.fmt], w.qweight, w.scale, _EMPTY, bias, n, k, qh, _EMPTY, _EMPTY)
    if w.fmt in _KQUANT_CODES:
        kb = w.kblocks
        return ext.PackedLinear(_KQUANT_CODES[w.fmt], w.qweight, w.scale, w.mins, bias, n, k, kb.qh, kb.sc, kb.mm)
    if w.fmt == "int4":
        return ext.PackedLinear(2, w.qweight, _EMPTY, w.scale, w.mins, bias, n, k, w.group_size)
    if w.fmt == "int8":
        return ext.PackedLinear(1, w.qweight, w.scale, _EMPTY, _EMPTY, bias, n, k, w.group_size)
    return ext.PackedLinear(0, w.qweight, _EMPTY, _EMPTY, _EMPTY, bias, n, k, 0)


class CpuDecoder:
    """The fused forward of one model's layers; build it with `cpu_decoder`."""

    def __init__(self, layers: list[LayerWeights], final_norm: torch.Tensor, eps: float, heads: int,
                 kv_heads: int, head_dim: int) -> None:
        ext = cpu_ext.load()
        packed = [
            ext.DecoderLayerWeights(
                w.input_norm, w.post_norm, _packed(ext, w.qkv, w.qkv_bias), _packed(ext, w.o, w.o_bias),
                _packed(ext, w.gate_up, None), _packed(ext, w.down, None),
            )
            for w in layers
        ]
        self._impl = ext.CpuDecoder(packed, final_norm, eps, heads, kv_heads, head_dim, cpu_ext.level())

    def __call__(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                 cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] embeddings (T <= MAX_DECODER_ROWS) -> final-normed hidden [T, hidden].

        k_cache, v_cache [layers, S_max, kv_heads, head_dim] contiguous; slots [T] int64 (each
        layer's K/V of this call is written there first); cos, sin [T, head_dim] RoPE rows
        (RotaryEmbedding's tables); mask [T, S] bool (True = may attend), S <= S_max."""
        mask = mask if mask.stride(-1) == 1 else mask.contiguous()
        return self._impl.forward(x, k_cache, v_cache, slots, cos, sin, mask)


def cpu_decoder(layers: list[LayerWeights], final_norm: torch.Tensor, eps: float, heads: int, kv_heads: int,
                head_dim: int) -> CpuDecoder | None:
    """The fused forward of these layers, or None where it does not apply: no attention and row-wise kernels,
    a layer whose linears are not all packed CPU weights (kernels.prepare_model_), a head dim
    that is not a multiple of 16 up to 256, or activations other than bf16/fp32."""
    dtype = final_norm.dtype
    if dtype not in (torch.bfloat16, torch.float32) or final_norm.device.type != "cpu":
        return None
    if head_dim % 16 or head_dim > 256 or not (cpu_ext.available("attention") and cpu_ext.available("rowwise")):
        return None
    if not all(_fusable(layer, dtype) for layer in layers):
        return None
    return CpuDecoder(layers, final_norm, eps, heads, kv_heads, head_dim)
