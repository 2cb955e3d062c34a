"""JIT build (once, cached on disk) and call wrappers of the C++ CPU kernels: the quantized
int8/int4 linear, the small-M bf16 linear, the layout-invariant masked attention and the
row-wise RMSNorm and SwiGLU activation.

The extension is compiled with torch.utils.cpp_extension.load into
``$SWIFTSPEC_CACHE/torch_ext/<python+torch version>/`` (default cache: ~/.cache/swiftspec).  If it
cannot be built or the CPU has neither AVX-512 VNNI nor AVX2, ``load()`` warns once and returns
None, and callers use the torch reference instead.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from types import ModuleType

import torch

from swiftspec.kernels.quant import QuantWeight

_CSRC = Path(__file__).parent / "csrc"
_SOURCES = ("quant_linear.cpp", "qgemm_avx512.cpp", "qgemm_avx2.cpp", "bf16_gemm_avx512.cpp",
            "attention_avx512.cpp", "rowwise_avx512.cpp", "decoder_cpu.cpp")
MAX_SMALL_ROWS = 16  # kMaxBf16Rows in quant_linear.cpp; larger calls (prefill) go to oneDNN and SDPA
# Only ISA-neutral flags: the kernel files select their own ISA with #pragma GCC target, so the
# glue runs on any x86-64 (never -march=native: it can enable instructions the VM traps, e.g. AMX).
_CFLAGS = ["-O3", "-fopenmp", "-std=c++17", "-Wall", "-Wno-unused-function"]
ISA_NAMES = {0: "none", 1: "avx2", 2: "avx512-vnni"}

_EMPTY = torch.empty(0)  # placeholder for the scale tensors a format does not use
_state: dict[str, object] = {}  # "ext": the module (None after a failed build); has_bf16/has_avx512


def cache_dir() -> Path:
    """Root of SwiftSpec's on-disk cache (env SWIFTSPEC_CACHE, default ~/.cache/swiftspec)."""
    return Path(os.environ.get("SWIFTSPEC_CACHE", Path.home() / ".cache" / "swiftspec"))


def build_dir() -> Path:
    tag = f"py{sys.version_info[0]}{sys.version_info[1]}-torch{torch.__version__}".replace("+", "_")
    return cache_dir() / "torch_ext" / tag


def _build() -> ModuleType:
    from torch.utils.cpp_extension import load

    if not sys.platform.startswith("linux") or os.uname().machine not in ("x86_64", "AMD64"):
        raise RuntimeError(f"kernels target x86-64 Linux, not {sys.platform}/{os.uname().machine}")
    out = build_dir()
    out.mkdir(parents=True, exist_ok=True)
    ext = load(name="swiftspec_qlinear", sources=[str(_CSRC / s) for s in _SOURCES],
               extra_cflags=_CFLAGS, extra_ldflags=["-fopenmp"], build_directory=str(out),
               verbose=False)
    if ext.detect_isa() == 0:
        raise RuntimeError("CPU has neither AVX-512 VNNI nor AVX2+FMA+F16C")
    return ext


def load() -> ModuleType | None:
    """The compiled extension, building it on first use; None (warned once) if unavailable."""
    if "ext" not in _state:
        try:
            _state["ext"] = _build()
        except Exception as e:  # noqa: BLE001 - any build failure means "use the reference"
            lines = str(e).strip().splitlines() or [type(e).__name__]
            reason = next((ln for ln in lines if "error:" in ln), lines[0]).strip()[:200]
            warnings.warn(f"swiftspec: quantized CPU kernels unavailable ({reason}); "
                          "using the slower torch reference", RuntimeWarning, stacklevel=2)
            _state["ext"] = None
    return _state["ext"]


def isa() -> str:
    """Name of the ISA path the kernels run on here ("none" if unavailable)."""
    ext = load()
    return ISA_NAMES[ext.detect_isa()] if ext is not None else "none"


def _built() -> ModuleType:
    """The extension, or RuntimeError when it could not be built (callers check has_* first)."""
    ext = _state.get("ext") or load()
    if ext is None:
        raise RuntimeError("swiftspec CPU kernels are unavailable")
    return ext


def _rows(x: torch.Tensor, k: int) -> torch.Tensor:
    """x [..., K] as a [M, K] view (or copy) with unit stride along K, as the kernels take it."""
    x2 = x if x.dim() == 2 else x.reshape(-1, k)
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def quant_linear(x: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None = None,
                 isa_level: int = 0) -> torch.Tensor:
    """y [..., N] = x [..., K] @ W^T (+ bias) with the C++ kernels; x bf16 or fp32 on CPU.

    isa_level: 0 = best available, 1 = force AVX2, 2 = force AVX-512 (tests use this)."""
    ext = _built()
    n, k = qw.shape
    x2 = _rows(x, k)
    if qw.fmt == "int4":
        y = ext.quant_linear(x2, qw.qweight, _EMPTY, qw.scale, qw.mins, bias, True, n, k, qw.group_size, isa_level)
    else:
        y = ext.quant_linear(x2, qw.qweight, qw.scale, _EMPTY, _EMPTY, bias, False, n, k, qw.group_size, isa_level)
    return y if x.dim() == 2 else y.view(*x.shape[:-1], n)


def has_bf16() -> bool:
    """True if the extension is built and this CPU has AVX-512 BF16 (the small-M bf16 kernel)."""
    if "bf16" not in _state:
        ext = load()
        _state["bf16"] = ext is not None and ext.has_bf16()
    return bool(_state["bf16"])


def bf16_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y [..., N] = x [..., K] @ w [N, K]^T (+ bias), bf16, at most MAX_SMALL_ROWS rows of x.

    Each row's result is independent of the other rows (see csrc/bf16_gemm_avx512.cpp)."""
    y = _built().bf16_linear(_rows(x, w.shape[1]), w, bias)
    return y if x.dim() == 2 else y.view(*x.shape[:-1], w.shape[0])


def has_avx512() -> bool:
    """True if the extension is built and this CPU runs its AVX-512 kernels other than the linears
    (masked attention, RMSNorm, SwiGLU activation)."""
    if "avx512" not in _state:
        ext = load()
        _state["avx512"] = ext is not None and ext.detect_isa() == 2
    return bool(_state["avx512"])


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q [T, H, D] (rotated) over slots [0, S) of k, v [S_max, Hkv, D] with mask [T, S] bool ->
    [T, H, D], scale 1/sqrt(D).  The result depends only on the ordered set of attended slots."""
    return _built().masked_attention(q, k, v, mask if mask.stride(-1) == 1 else mask.contiguous(), q.shape[-1] ** -0.5)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., n] / rms(x) * weight [n] with the rounding of kernels.rowwise.rms_norm_ref."""
    y = _built().rms_norm(_rows(x, x.shape[-1]), weight, eps)
    return y.view(x.shape)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [M, 2I] (gate columns first) -> silu(gate) * up [M, I], rounded as swiglu_act_ref."""
    return _built().silu_mul(_rows(gate_up, gate_up.shape[-1]))
