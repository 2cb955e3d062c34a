"""The packed linear's torch references for every format: ``dequantize`` (dispatched by format to
quant.py, kquant.py or qblock.py), the kernels' activation quantization and the two linears.

It sits above the format modules (it imports them; they import only packed.py), so the dispatch
needs no late import."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from swiftspec.kernels import kquant, qblock, quant
from swiftspec.kernels.packed import PackedWeight

_DEQUANTIZE: dict[str, Callable[[PackedWeight], torch.Tensor]] = {
    **dict.fromkeys(("bf16", "int8", "int4"), quant.dequantize_int),
    **dict.fromkeys(kquant.FMTS.values(), kquant.dequantize_k),
    **dict.fromkeys(qblock.FMTS.values(), qblock.dequantize_q),
}


def dequantize(qw: PackedWeight) -> torch.Tensor:
    """The fp32 [N, K] weight that ``qw`` represents."""
    return _DEQUANTIZE[qw.fmt](qw)


def quantize_act_ref(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [M, K] -> (q [M, Kp] fp32 holding int8 values, scale [M, Kp/block]) as the kernel does."""
    m, k = x.shape
    kp = -(-k // block) * block
    xb = F.pad(x.float(), (0, kp - k)).view(m, kp // block, block)
    amax = xb.abs().amax(dim=-1, keepdim=True)
    # Tensor / tensor is an IEEE division, as in the kernel (a python-scalar numerator would go
    # through a rounded reciprocal and flip some roundings).
    c127 = torch.full_like(amax, 127.0)
    inv = torch.where(amax > 0, c127 / torch.where(amax > 0, amax, 1.0), 0.0)
    q = torch.round(xb * inv).clamp_(-127, 127)
    return q.view(m, kp), (amax / c127).view(m, -1)


def quant_linear_ref(x: torch.Tensor, qw: PackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Ideal result: x [..., K] @ dequant(qw)^T [K, N] (+ bias) in fp32, cast to x.dtype."""
    y = x.float() @ dequantize(qw).to(x.device).T
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def quant_linear_a8_ref(x: torch.Tensor, qw: PackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The kernel's numerics: x rows quantized to int8 per K-block, then exact products (the
    K-quant formats' K-block is their super-block of 256)."""
    x2 = x.reshape(-1, qw.shape[1])
    q, s = quantize_act_ref(x2, qw.group_size)
    xd = (q.view(x2.shape[0], -1, qw.group_size) * s[..., None]).view(x2.shape[0], -1)
    y = xd[:, : qw.shape[1]] @ dequantize(qw).to(x.device).T
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype).view(*x.shape[:-1], qw.shape[0])
