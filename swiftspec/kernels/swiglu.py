"""SwiGLU for few rows: silu(x Wg^T) * (x Wu^T) from the packed gate_up weight [2I, H] (gate rows first).

Two Triton kernels, each with a plain-torch reference of the same signature:
- `swiglu_act(gate_up [M, 2I]) -> [M, I]`: the activation and product, fused (any M);
- `swiglu(x [M, H], weight [2I, H]) -> [M, I]`: the gate and up matmuls fused with the activation,
  for M <= MAX_SWIGLU_ROWS (decode and tree verification). Each program owns BLOCK_N columns of both
  halves, so one pass streams the weight once and the [M, 2I] intermediate never reaches memory.
The kernels accumulate and activate in fp32 and round once; the references round as the model's
CPU path does (bf16 after the matmul, after silu and after the product), so they agree to bf16 ulps.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from swiftspec.kernels.triton_support import cdiv, jit

tl = None  # triton.language, bound by triton_support.jit when a kernel here is first built

MAX_SWIGLU_ROWS = 16  # one BLOCK_M tile of rows: tl.dot wants at least 16
ACT_BLOCK = 1024  # columns per program of swiglu_act


def swiglu_act_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [M, 2I] (gate columns first) -> silu(gate) * up [M, I]; the model's CPU code."""
    gate, up = gate_up.chunk(2, dim=-1)  # [M, I] each
    return F.silu(gate).mul_(up)


def swiglu_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [M, H], weight [2I, H] -> [M, I]: the unfused matmul, then swiglu_act_ref."""
    return swiglu_act_ref(F.linear(x, weight))


def swiglu_act_triton(gate_up: torch.Tensor) -> torch.Tensor:
    """Triton swiglu_act: gate_up [M, 2I] with unit column stride -> [M, I]."""
    rows, width = gate_up.shape
    inter = width // 2
    out = gate_up.new_empty((rows, inter))
    grid = (rows, cdiv(inter, ACT_BLOCK))
    jit(_act_kernel, ("inter",))[grid](gate_up, out, inter, gate_up.stride(0), out.stride(0), BLOCK=ACT_BLOCK)
    return out


def swiglu_triton(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Triton swiglu: x [M <= MAX_SWIGLU_ROWS, H], weight [2I, H] (unit stride along H) -> [M, I]."""
    rows, hidden = x.shape
    inter = weight.shape[0] // 2
    if rows > MAX_SWIGLU_ROWS:
        raise ValueError(f"swiglu_triton takes at most {MAX_SWIGLU_ROWS} rows, got {rows}")
    block_n = 32 if inter <= 8192 else 64  # more programs when I is small
    out = x.new_empty((rows, inter))
    jit(_fused_kernel, ("rows", "inter", "hidden"))[(cdiv(inter, block_n),)](
        x, weight, out, rows, inter, hidden, x.stride(0), weight.stride(0), out.stride(0),
        BLOCK_M=MAX_SWIGLU_ROWS, BLOCK_N=block_n, BLOCK_K=128,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
    )
    return out


def _act_kernel(GateUp, Out, inter, stride_g, stride_o, BLOCK: tl.constexpr):
    """Program (row, column block): out = silu(gate) * up in fp32, rounded once."""
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < inter
    gate = tl.load(GateUp + row * stride_g + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(GateUp + row * stride_g + inter + cols, mask=ok, other=0.0).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(Out + row * stride_o + cols, out.to(Out.dtype.element_ty), mask=ok)


def _fused_kernel(
    X, W, Out, rows, inter, hidden, stride_x, stride_w, stride_o,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Program n: columns [n * BLOCK_N, +BLOCK_N) of gate and of up over all rows, then the activation."""
    m = tl.arange(0, BLOCK_M)[:, None]  # [BLOCK_M, 1]
    n = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N))[None, :]  # [1, BLOCK_N]
    n_ok = n < inter
    acc_gate = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        k_row = k0 + tl.arange(0, BLOCK_K)[None, :]  # [1, BLOCK_K]
        k_col = k0 + tl.arange(0, BLOCK_K)[:, None]  # [BLOCK_K, 1]
        x = tl.load(X + m * stride_x + k_row, mask=(m < rows) & (k_row < hidden), other=0.0)
        w_ok = n_ok & (k_col < hidden)
        w_gate = tl.load(W + n * stride_w + k_col, mask=w_ok, other=0.0)  # [BLOCK_K, BLOCK_N] = Wg^T tile
        w_up = tl.load(W + (inter + n) * stride_w + k_col, mask=w_ok, other=0.0)
        acc_gate = tl.dot(x, w_gate, acc_gate, input_precision=DOT_PRECISION)
        acc_up = tl.dot(x, w_up, acc_up, input_precision=DOT_PRECISION)
    out = acc_gate * tl.sigmoid(acc_gate) * acc_up
    tl.store(Out + m * stride_o + n, out.to(Out.dtype.element_ty), mask=(m < rows) & n_ok)
