"""Building blocks of the Llama/Qwen2 decoder: RMSNorm, rotary embedding (with Llama-3/linear scaling), SwiGLU MLP."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from swiftspec import kernels
from swiftspec.model.args import RopeScaling
from swiftspec.parallel.linear import MergedColumnParallelLinear, RowParallelLinear
from swiftspec.parallel.state import ParallelState


class RMSNorm(nn.Module):
    """x / rms(x) * weight, normalised in float32 and cast back before the weight (as HF does;
    kernels.rms_norm)."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype, device=device), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, dim] -> [T, dim]."""
        return kernels.rms_norm(x, self.weight, self.eps)


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """Inverse frequencies [head_dim / 2] float32, following HF's rope_init functions."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    if scaling.kind != "llama3":
        return inv_freq
    # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, the band between interpolated.
    low_freq_wavelen = scaling.original_max_position / scaling.low_freq_factor
    high_freq_wavelen = scaling.original_max_position / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (scaling.original_max_position / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


@dataclass(frozen=True, slots=True)
class RopeAngles:
    """Rotation of T tokens in the half-split layout, shared by every layer of one forward."""

    cos: torch.Tensor  # [T, 1, head_dim]: cos of each frequency, repeated for both halves
    sin: torch.Tensor  # [T, 1, head_dim]: -sin for the first half, +sin for the second


class RotaryEmbedding:
    """Precomputed cos/sin tables [length, head_dim] in the model dtype; grown on demand.

    Angles are computed in float32 and rounded to the model dtype, as HF does before applying them.
    """

    def __init__(self, head_dim: int, theta: float, scaling: RopeScaling, length: int,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        self.inv_freq = rope_inv_freq(head_dim, theta, scaling).to(device)  # [head_dim / 2] float32
        self.dtype = dtype
        self.length = 0
        self.cos = self.sin = torch.empty(0)
        self.ensure(length)

    def ensure(self, length: int) -> None:
        """Make the tables cover positions [0, length) (a Python-int check; no device sync)."""
        if length <= self.length:
            return
        length = max(length, 2 * self.length)
        positions = torch.arange(length, dtype=torch.float32, device=self.inv_freq.device)  # [length]
        angles = torch.outer(positions, self.inv_freq)  # [length, head_dim / 2]
        cos, sin = angles.cos().to(self.dtype), angles.sin().to(self.dtype)
        self.cos = torch.cat((cos, cos), dim=-1)  # [length, head_dim]
        self.sin = torch.cat((-sin, sin), dim=-1)  # [length, head_dim]
        self.length = length

    def angles(self, positions: torch.Tensor) -> RopeAngles:
        """positions [T] int64 (each < self.length) -> the angles to rotate those tokens by."""
        return RopeAngles(cos=self.cos[positions].unsqueeze(1), sin=self.sin[positions].unsqueeze(1))


def apply_rope(x: torch.Tensor, rope: RopeAngles) -> torch.Tensor:
    """Rotate x [T, heads, head_dim] in the half-split (HF "rotate_half") layout:
    [x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin], with HF's rounding in low precision."""
    return x * rope.cos + x.roll(x.shape[-1] // 2, dims=-1) * rope.sin


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)) with gate and up packed into one column-parallel matmul."""

    def __init__(self, hidden_size: int, intermediate_size: int, parallel: ParallelState,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size, intermediate_size], bias=False, parallel=parallel, dtype=dtype,
            device=device,
        )
        self.down_proj = RowParallelLinear(
            intermediate_size, hidden_size, bias=False, parallel=parallel, dtype=dtype, device=device
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]."""
        proj = self.gate_up_proj  # on CPU: kernels.linear, then silu(gate) * up (kernels.swiglu_act)
        return self.down_proj(kernels.swiglu(x, proj.weight, proj.bias))  # [T, intermediate / tp] in between
