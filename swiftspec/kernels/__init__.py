"""The kernels' public names: the dispatch point (dispatch.py: `linear`, `attention`, `rms_norm`,
`tree_attention`, `swiglu`, `swiglu_act`, each picking a C++, Triton or torch kernel), `cpu_decoder`
(a whole stack of decoder layers in one C++ call on CPU; its reference: the unfused model), the
quantized-weight formats and model conversion."""

from __future__ import annotations

from swiftspec.kernels.decoder import MAX_DECODER_ROWS, CpuDecoder, LayerWeights, cpu_decoder
from swiftspec.kernels.dispatch import attention, linear, rms_norm, swiglu, swiglu_act, tree_attention, use_triton
from swiftspec.kernels.packed import PackedWeight, select_tiles
from swiftspec.kernels.prepare import (
    prepare_model_,
    prepare_weight,
    quantize_linear_,
    quantize_model_,
    quantize_weight,
)
from swiftspec.kernels.quant import quantize_int4, quantize_int8
from swiftspec.kernels.quant_ref import dequantize, quant_linear_a8_ref, quant_linear_ref
from swiftspec.kernels.rowwise import rms_norm_ref
from swiftspec.kernels.swiglu import swiglu_act_ref, swiglu_ref
from swiftspec.kernels.tree_attention import grouped_attention, tree_attention_ref

__all__ = [
    "CpuDecoder", "LayerWeights", "MAX_DECODER_ROWS", "PackedWeight", "attention", "cpu_decoder",
    "dequantize", "linear", "prepare_model_", "prepare_weight",
    "quant_linear_a8_ref", "quant_linear_ref",
    "quantize_int4", "quantize_int8", "quantize_linear_", "quantize_model_", "quantize_weight",
    "rms_norm", "rms_norm_ref", "select_tiles",
    "grouped_attention", "swiglu", "swiglu_act", "swiglu_act_ref", "swiglu_ref", "tree_attention",
    "tree_attention_ref", "use_triton",
]

