"""The one kernel dispatch point: `linear` picks F.linear, the C++ quantized CPU kernel or its
torch reference; the quantized-weight formats and model conversion are re-exported here."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from swiftspec.kernels import cpu_ext
from swiftspec.kernels.convert import quantize_linear_, quantize_model_, quantize_weight
from swiftspec.kernels.quant import (
    QuantWeight,
    dequantize,
    quant_linear_a8_ref,
    quant_linear_ref,
    quantize_int4,
    quantize_int8,
)

__all__ = [
    "QuantWeight", "dequantize", "linear", "quant_linear_a8_ref", "quant_linear_ref",
    "quantize_int4", "quantize_int8", "quantize_linear_", "quantize_model_", "quantize_weight",
]

_KERNEL_DTYPES = (torch.bfloat16, torch.float32)


def linear(x: torch.Tensor, weight: torch.Tensor | QuantWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y [..., N] = x [..., K] @ weight^T (+ bias [N]).

    Plain tensors go to F.linear.  A QuantWeight runs the C++ kernel when x is a bf16/fp32 CPU
    tensor and the extension is built (x rows quantized to int8 per K-block, see quant.py), and
    the exact torch reference otherwise (other devices or dtypes, or no compiler)."""
    if not isinstance(weight, QuantWeight):
        return F.linear(x, weight, bias)
    if x.device.type == "cpu" and weight.device.type == "cpu" and x.dtype in _KERNEL_DTYPES:
        if cpu_ext.load() is not None:
            return cpu_ext.quant_linear(x, weight, bias)
    return quant_linear_ref(x, weight, bias)
