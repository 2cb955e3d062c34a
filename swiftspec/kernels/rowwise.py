"""Plain-torch references of the row-wise CPU kernels (csrc/rowwise_avx2.cpp, rowwise_avx512.cpp): RMSNorm.

The SwiGLU activation's reference is swiglu_act_ref in swiglu.py."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., n] / rms(x) * weight [n]: normalized in float32 and cast back before the weight,
    as HF does."""
    return F.rms_norm(x.float(), weight.shape, eps=eps).to(x.dtype) * weight
