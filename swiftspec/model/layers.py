"""Building blocks of the decoder: RMSNorm (and Gemma's 1 + w form), rotary embedding (with Llama-3,
linear and YaRN scaling), the SwiGLU MLP and Gemma's GeGLU."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
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


class GemmaRMSNorm(RMSNorm):
    """Gemma's x / rms(x) * (1 + weight), all in float32 and rounded once at the end (its weight is
    stored as in HF checkpoints: zero means identity)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., dim] -> [..., dim]."""
        normed = F.rms_norm(x.float(), self.weight.shape, eps=self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """Inverse frequencies [head_dim / 2] float32, following HF's rope_init functions."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    if scaling.kind == "yarn":
        return _yarn_inv_freq(head_dim, theta, scaling)
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


def _yarn_inv_freq(dim: int, theta: float, s: RopeScaling) -> torch.Tensor:
    """YaRN (NTK-by-parts), as transformers' _compute_yarn_parameters: dimensions rotating more than
    beta_fast times over the original context keep their frequency, those rotating fewer than
    beta_slow times are divided by factor, a linear ramp in between."""

    def correction_dim(rotations: float) -> float:
        return dim * math.log(s.original_max_position / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no singular ramp
    pos_freqs = theta ** (torch.arange(0, dim, 2).float() / dim)  # [dim / 2]
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)  # [dim / 2]
    keep = 1 - ramp  # share of the unscaled (extrapolated) frequency
    return (1.0 / (s.factor * pos_freqs)) * (1 - keep) + (1.0 / pos_freqs) * keep


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
        self.attention_factor = scaling.attention_factor if scaling.kind == "yarn" else 1.0
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
        cos, sin = angles.cos(), angles.sin()
        if self.attention_factor != 1.0:  # YaRN scales cos and sin, in float32 (as HF does)
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        cos, sin = cos.to(self.dtype), sin.to(self.dtype)
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


class GeGLU(SwiGLU):
    """Gemma's MLP: down(gelu_tanh(gate(x)) * up(x)), gate and up packed as in SwiGLU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]."""
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # [T, intermediate / tp] each
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)
