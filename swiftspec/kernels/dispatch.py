"""The kernel dispatch point (re-exported by swiftspec.kernels): `linear` picks F.linear, the C++
bf16/quantized CPU kernels or their torch reference; `attention` the C++ layout-invariant CPU
attention or SDPA; `rms_norm` and `swiglu_act` the C++ row-wise kernels on CPU; `tree_attention`,
`swiglu` and `swiglu_act` pick Triton on CUDA tensors when Triton is importable (`use_triton`); each
falls back to its torch reference."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from swiftspec.kernels import capability, cpu_ext, triton_support
from swiftspec.kernels.packed import PackedWeight
from swiftspec.kernels.quant_ref import quant_linear_ref
from swiftspec.kernels.rowwise import rms_norm_ref
from swiftspec.kernels.swiglu import MAX_SWIGLU_ROWS, swiglu_act_ref, swiglu_act_triton, swiglu_triton
from swiftspec.kernels.tree_attention import grouped_attention, tree_attention_ref, tree_attention_triton

_KERNEL_DTYPES = (torch.bfloat16, torch.float32)


def linear(x: torch.Tensor, weight: torch.Tensor | PackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y [..., N] = x [..., K] @ weight^T (+ bias [N]).

    Plain tensors go to F.linear.  A wrapped bf16 weight and a bf16 CPU x run the small-M bf16
    kernel for at most cpu_ext.MAX_SMALL_ROWS rows; more rows (prefill) run F.linear where the
    CPU has AVX-512 BF16 (oneDNN's native bf16 GEMM) and the C++ prefill GEMM below that level,
    where oneDNN would emulate bf16 (slow, and its rounding would depend on the row count); other
    devices and dtypes run F.linear.  An
    int8/int4 (or GGUF blocks as stored, see kquant.py and qblock.py) PackedWeight runs the C++ kernel when x is a bf16/fp32 CPU tensor and the extension
    is built (x rows quantized to int8 per K-block, see quant.py), and the exact torch reference
    otherwise (other devices or dtypes, or no compiler).  F.linear on a PackedWeight comes here
    (PackedWeight.route_linear, below)."""
    if not isinstance(weight, PackedWeight):
        return F.linear(x, weight, bias)
    if weight.fmt == "bf16":
        if x.dtype == torch.bfloat16 and x.device.type == "cpu" and weight.device.type == "cpu" \
                and cpu_ext.available("bf16_linear"):
            if x.numel() // max(1, x.shape[-1]) <= cpu_ext.MAX_SMALL_ROWS:
                return cpu_ext.bf16_linear(x, weight.qweight, bias)
            if cpu_ext.kernel_paths()["bf16_linear"] < cpu_ext.LEVELS["avx512-bf16"]:
                return cpu_ext.bf16_prefill(x, weight.qweight, bias)
        return F.linear(x, weight.qweight, bias)
    if x.device.type == "cpu" and weight.device.type == "cpu" and x.dtype in _KERNEL_DTYPES:
        if cpu_ext.available("quant_linear"):
            return cpu_ext.quant_linear(x, weight, bias)
    return quant_linear_ref(x, weight, bias)


PackedWeight.route_linear(linear)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, row_mask: torch.Tensor) -> torch.Tensor:
    """Masked GQA of rotated q [T, H, D] over k, v [S, Hkv, D] (row_mask [group * T, S] bool, the
    [T, S] mask repeated per group member) -> [T, H, D].

    On CPU, calls of at most cpu_ext.MAX_SMALL_ROWS rows (decode, verification, draft expansion) run
    the C++ kernel whose result depends only on the ordered set of attended slots, so a tree
    node computes the bits its token gets when decoded alone; longer calls (prefill) run it too
    where it is the faster (capability.prefill_attention_ours), else grouped_attention (SDPA), as
    other devices do."""
    tokens, head_dim = q.shape[0], q.shape[-1]
    if (q.device.type == "cpu" and head_dim % 16 == 0 and head_dim <= 256 and q.dtype in _KERNEL_DTYPES
            and cpu_ext.available("attention") and (tokens <= cpu_ext.MAX_SMALL_ROWS or
                                                    capability.prefill_attention_ours(cpu_ext.kernel_paths()["attention"]))):
        return cpu_ext.masked_attention(q, k, v, row_mask[:tokens])
    return grouped_attention(q, k, v, row_mask)


def _cpu_rowwise(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype in _KERNEL_DTYPES and cpu_ext.available("rowwise")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., n] / rms(x) * weight [n], normalized in float32 and rounded to x's dtype before the
    weight (HF's order): the C++ kernel on CPU, rms_norm_ref otherwise."""
    if _cpu_rowwise(x) and weight.dtype == x.dtype:
        return cpu_ext.rms_norm(x, weight, eps)
    return rms_norm_ref(x, weight, eps)


def use_triton(x: torch.Tensor) -> bool:
    """The rule for every Triton kernel: x is a CUDA tensor and Triton is importable."""
    return x.is_cuda and triton_support.available()


def tree_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, mask: torch.Tensor,
                   cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Masked GQA of q [T, H, D] (pre-RoPE; rotated by cos, sin [T, D]) over slots [0, S) of a cache
    layer k_cache, v_cache [S_max, Hkv, D] (keys stored rotated), mask [T, S] bool (True = may
    attend) -> [T, H, D]. Shapes and layouts in kernels/tree_attention.py."""
    head_dim = q.shape[-1]
    fits = head_dim >= 16 and head_dim & (head_dim - 1) == 0 and q.dtype == k_cache.dtype == v_cache.dtype
    strides = (q.stride(-1), k_cache.stride(-1), v_cache.stride(-1), mask.stride(-1), cos.stride(-1), sin.stride(-1))
    if use_triton(q) and fits and strides == (1,) * 6:
        return tree_attention_triton(q, k_cache, v_cache, mask, cos, sin)
    return tree_attention_ref(q, k_cache, v_cache, mask, cos, sin)


def swiglu_act(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [M, 2I] (gate columns first) -> silu(gate) * up [M, I]."""
    if use_triton(gate_up) and gate_up.stride(-1) == 1:
        return swiglu_act_triton(gate_up)
    if _cpu_rowwise(gate_up):
        return cpu_ext.silu_mul(gate_up)
    return swiglu_act_ref(gate_up)


def swiglu(x: torch.Tensor, weight: torch.Tensor | PackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """silu(x Wg^T) * (x Wu^T) [M, I] for x [M, H] and the packed gate_up weight [2I, H] (+ bias [2I]).

    One fused Triton kernel for a plain CUDA weight and M <= MAX_SWIGLU_ROWS; otherwise `linear`
    (so a PackedWeight keeps its kernels) followed by `swiglu_act`."""
    plain = isinstance(weight, torch.Tensor) and bias is None and weight.dtype == x.dtype
    if use_triton(x) and plain and x.shape[0] <= MAX_SWIGLU_ROWS and x.stride(-1) == weight.stride(-1) == 1:
        return swiglu_triton(x, weight)
    return swiglu_act(linear(x, weight, bias))
