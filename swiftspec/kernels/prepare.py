"""In-place conversion of a model's linear layers to packed int8/int4 weights, or to wrapped bf16
weights served by the small-M bf16 kernel (CPU inference)."""

from __future__ import annotations

import torch
from torch import nn

from swiftspec.kernels import capability, cpu_ext
from swiftspec.kernels.packed import PackedWeight
from swiftspec.kernels.quant import quantize_int4, quantize_int8, wrap_bf16

FORMATS = ("bf16", "int8", "int4")
# Layers whose forward is y = F.linear(x, self.weight, bias) (matched on the class hierarchy, so
# kernels/ need not import parallel/): torch's Linear, swiftspec's LinearBase family, and the LM
# head.  VocabParallelEmbedding, the LM head's base class, is a lookup and is never converted.
LINEAR_CLASSES = frozenset({"Linear", "LinearBase", "ParallelLMHead"})


def is_linear(module: nn.Module) -> bool:
    """True if `module` is a linear layer whose 2-D weight can be packed."""
    w = getattr(module, "weight", None)
    if isinstance(w, PackedWeight) or w is None or w.dim() != 2 or not w.is_floating_point():
        return False
    return any(c.__name__ in LINEAR_CLASSES for c in type(module).__mro__)


def quantize_weight(w: torch.Tensor, fmt: str, group_size: int | None = None) -> PackedWeight:
    """Pack a dense [N, K] weight: "int8" per channel, "int4" group-wise (default group 128),
    "bf16" wrapped unchanged (the weight must already be bf16)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown weight format {fmt!r}; expected one of {FORMATS}")
    if fmt == "bf16":
        return wrap_bf16(w)
    if fmt == "int8":
        return quantize_int8(w, group_size)
    return quantize_int4(w, group_size or 128)


def quantize_linear_(module: nn.Module, fmt: str, group_size: int | None = None) -> nn.Module:
    """Replace module.weight ([N, K] Parameter) by its packed PackedWeight, in place.

    fmt "int8": per-channel; group_size is the activation K-block (default: largest of
    128/64/32 dividing K).  fmt "int4": group-wise, group_size in {32, 64, 128} (default 128).
    The module's own forward keeps calling F.linear(x, self.weight, bias): PackedWeight routes that
    call to swiftspec.kernels.linear.  A weight tied to another module (the embedding) stays
    there; only this module's reference is replaced.  The packed weight is not a Parameter, so it
    is not in state_dict() and not moved by .to(); convert after loading, on the target device."""
    qw = quantize_weight(module.weight.data, fmt, group_size)
    del module.weight  # drop the Parameter (the attribute, not a tied owner's)
    module.weight = qw
    return module


def quantize_model_(model: nn.Module, fmt: str, group_size: int | None = None, *,
                    lm_head: bool = True) -> list[str]:
    """Convert every linear layer of `model` in place; returns the converted module names.

    lm_head=False keeps the output projection (ParallelLMHead) in its original dtype.  The C++
    kernels are built here (once per machine, cached; about a minute) rather than in the first
    forward."""
    names = []
    for name, module in list(model.named_modules()):
        if not is_linear(module):
            continue
        if not lm_head and any(c.__name__ == "ParallelLMHead" for c in type(module).__mro__):
            continue
        quantize_linear_(module, fmt, group_size)
        names.append(name)
    if names:
        cpu_ext.load()  # build (or find) the kernels now, not during the first forward
    return names


def _bf16_kernel_applies(w: torch.Tensor) -> bool:
    return w.dtype == torch.bfloat16 and w.device.type == "cpu" and cpu_ext.available("bf16_linear")


def prepare_model_(model: nn.Module, fmt: str, *, lm_head: bool = True) -> list[str]:
    """Ready a loaded model's linear layers for `--weights fmt`, in place; returns their names.

    int8/int4: quantize_model_.  gguf: int8 for the linears still dense (the file's K-quant
    linears were packed as stored at load).  bf16: wrap each bf16 CPU weight for the small-M bf16 kernel when
    the small-M bf16 kernel runs here (weights on other devices or in other dtypes stay plain tensors)."""
    first = next(model.parameters(), None)
    if first is not None and first.device.type == "cpu":
        capability.warn_fallbacks()
    if fmt == "gguf":  # the linears not packed from the file's blocks (weights.gguf_native)
        return quantize_model_(model, "int8", lm_head=lm_head)
    if fmt != "bf16":
        return quantize_model_(model, fmt, lm_head=lm_head)
    if first is None or not _bf16_kernel_applies(first):
        return []
    return quantize_model_(model, "bf16", lm_head=lm_head)


def prepare_weight(w: torch.Tensor, fmt: str) -> torch.Tensor | PackedWeight:
    """One weight as prepare_model_ would ready it (a bf16 weight stays plain where the kernel does not apply)."""
    if fmt == "bf16" and not _bf16_kernel_applies(w):
        return w
    return quantize_weight(w, "int8" if fmt == "gguf" else fmt)
