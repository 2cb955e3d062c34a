"""JIT build (once, cached on disk) and call wrappers of the C++ CPU kernels: the quantized
int8/int4 linear, the small-M bf16 linear, the layout-invariant masked attention and the
row-wise RMSNorm and SwiGLU activation.

The extension is compiled with torch.utils.cpp_extension.load into
``$SWIFTSPEC_CACHE/torch_ext/<python+torch version>-<source digest>/`` (default cache: ~/.cache/swiftspec):
one directory per source tree and place, so two checkouts (or versions) never rebuild over each other.  If it
cannot be built or the CPU lacks AVX2/FMA/F16C, ``load()`` warns once and returns None, and callers
use the torch reference instead.

ISA levels: 1 avx2 (AVX2 + FMA + F16C), 2 avx2-vnni (+ AVX-VNNI), 3 avx512 (AVX2 + AVX-512
F/BW/VL/DQ), 4 avx512-vnni, 5 avx512-bf16; each a superset of the one below, except that an AVX-512
CPU need not have AVX-VNNI (Zen 4, Skylake-SP).  The process runs at the best level this CPU
supports at or below the cap ``SWIFTSPEC_ISA`` (a level name), read once; each kernel then runs its
best path at that level (``kernel_paths()``), so an AVX-512 machine can run and test every lower path.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
import warnings
from pathlib import Path
from types import ModuleType

import torch

from swiftspec.errors import UserError
from swiftspec.kernels.packed import PackedWeight

_CSRC = Path(__file__).parent / "csrc"
MAX_SMALL_ROWS = 16  # kMaxSmallRows in glue.h; larger calls (prefill) go to the prefill paths
# Only ISA-neutral flags: the kernel files select their own ISA with #pragma GCC target, so the
# glue runs on any x86-64 (never -march=native: it can enable instructions the VM traps, e.g. AMX).
_CFLAGS = ["-O3", "-fopenmp", "-std=c++17", "-Wall", "-Wno-unused-function"]
LEVELS = {"none": 0, "avx2": 1, "avx2-vnni": 2, "avx512": 3, "avx512-vnni": 4, "avx512-bf16": 5}
LEVEL_NAMES = {v: k for k, v in LEVELS.items()}
ISA_ENV = "SWIFTSPEC_ISA"
STALE_LOCK_S = 900  # a build lock older than this belongs to a killed build
OPS = ("quant_linear", "bf16_linear", "attention", "rowwise", "gguf_blocks")

_EMPTY = torch.empty(0)  # placeholder for the scale tensors a format does not use
_KQUANT_BITS = {"q4k": 4, "q5k": 5, "q6k": 6}
_QBLOCK_BITS = {"q8_0": 8, "q5_0": 5, "q4_0": 4}
_state: dict[str, object] = {}  # "ext": the module (None after a failed build); "level", "paths"


def cache_dir() -> Path:
    """Root of SwiftSpec's on-disk cache (env SWIFTSPEC_CACHE, default ~/.cache/swiftspec)."""
    return Path(os.environ.get("SWIFTSPEC_CACHE", Path.home() / ".cache" / "swiftspec"))


def build_dir() -> Path:
    digest = hashlib.sha1(str(_CSRC.resolve()).encode())  # torch rebuilds when the source paths change
    for path in sorted(p for p in _CSRC.iterdir() if p.suffix in (".cpp", ".h")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    tag = f"py{sys.version_info[0]}{sys.version_info[1]}-torch{torch.__version__}-{digest.hexdigest()[:12]}"
    return cache_dir() / "torch_ext" / tag.replace("+", "_")


def _build() -> ModuleType:
    from torch.utils.cpp_extension import load

    if not sys.platform.startswith("linux") or os.uname().machine not in ("x86_64", "AMD64"):
        raise RuntimeError(f"kernels target x86-64 Linux, not {sys.platform}/{os.uname().machine}")
    out = build_dir()
    out.mkdir(parents=True, exist_ok=True)
    _wait_for_build(out / "lock")
    sources = sorted(str(p) for p in _CSRC.glob("*.cpp"))
    ext = load(name="swiftspec_kernels", sources=sources, extra_cflags=_CFLAGS, extra_ldflags=["-fopenmp"],
               extra_include_paths=[str(_CSRC)], build_directory=str(out), verbose=False)
    if ext.detect_level() == 0:
        raise RuntimeError("CPU lacks AVX2/FMA/F16C")
    return ext


def _building_in(build: Path) -> bool:
    """True if a process runs in the build directory (ninja and the compiler do while building)."""
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and Path(os.readlink(proc / "cwd")) == build:
                return True
        except OSError:
            continue
    return False


def _wait_for_build(lock: Path) -> None:
    """Wait while another process builds here; a lock left by a killed build is cleared instead
    (torch's own wait would never end)."""
    while lock.exists():
        _clear_stale_lock(lock)
        time.sleep(1.0)


def _clear_stale_lock(lock: Path) -> None:
    """torch's JIT build waits forever on the lock file of a build that was killed (Ctrl-C during
    the first start): a lock older than a minute with no compiler running in the build directory,
    or older than STALE_LOCK_S in any case, is dead."""
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return
    if age > STALE_LOCK_S or (age > 60 and not _building_in(lock.parent.resolve())):
        lock.unlink(missing_ok=True)
        warnings.warn(f"swiftspec: removed the stale build lock {lock}", RuntimeWarning, stacklevel=3)


def load() -> ModuleType | None:
    """The compiled extension, building it on first use; None (warned once) if unavailable."""
    if "ext" not in _state:
        try:
            _state["ext"] = _build()
        except Exception as e:  # noqa: BLE001 - any build failure means "use the reference"
            lines = str(e).strip().splitlines() or [type(e).__name__]
            reason = next((ln for ln in lines if "error:" in ln), lines[0]).strip()[:200]
            warnings.warn(f"swiftspec: CPU kernels unavailable ({reason}); using the slower torch reference",
                          RuntimeWarning, stacklevel=2)
            _state["ext"] = None
    return _state["ext"]


def loaded() -> ModuleType | None:
    """The extension if this process has loaded it already, else None: never builds it (a load
    for another device need not compile CPU kernels)."""
    return _state.get("ext")  # type: ignore[return-value]


def take_thread_count() -> None:
    """Make this thread's first parallel call of the kernels now (parallel/cores.take_thread_count)."""
    ext = load()
    if ext is not None:
        ext.take_thread_count()


def detected_level() -> int:
    """The best ISA level this CPU runs (0 where the kernels are unavailable)."""
    ext = load()
    return int(ext.detect_level()) if ext is not None else 0


def supported_levels() -> list[int]:
    """The ISA levels this CPU runs, lowest first (empty where the kernels are unavailable)."""
    ext = load()
    if ext is None:
        return []
    return [lv for lv in sorted(LEVELS.values()) if lv > 0 and ext.level_supported(lv)]


def level_cap() -> int:
    """The cap SWIFTSPEC_ISA sets (a name of LEVELS; unset: no cap)."""
    name = os.environ.get(ISA_ENV, "").strip().lower()
    if not name:
        return max(LEVELS.values())
    if name not in LEVELS:
        raise UserError(f"{ISA_ENV}={name!r} is not an ISA level; use one of {', '.join(LEVELS)}")
    return LEVELS[name]


def level() -> int:
    """The ISA level this process runs its kernels at: the best one this CPU supports at or below
    SWIFTSPEC_ISA, fixed once read (0: none)."""
    if "level" not in _state:
        cap = level_cap()
        _state["level"] = max([lv for lv in supported_levels() if lv <= cap], default=0)
    return int(_state["level"])


def isa() -> str:
    """Name of the ISA level the kernels run at here ("none" if unavailable)."""
    return LEVEL_NAMES[level()]


def kernel_paths(at_level: int | None = None) -> dict[str, int]:
    """{op: the ISA level whose code it runs} at a level (default: this process's); 0 = torch."""
    lvl = level() if at_level is None else at_level
    if lvl == 0:
        return dict.fromkeys(OPS, 0)
    if at_level is None:
        if "paths" not in _state:
            _state["paths"] = dict(load().kernel_paths(lvl))
        return dict(_state["paths"])
    return dict(load().kernel_paths(lvl))


def available(op: str) -> bool:
    """True if op (one of OPS) has a C++ path at this process's ISA level."""
    return kernel_paths()[op] > 0


def _lvl(at_level: int | None) -> int:
    return level() if at_level is None else at_level


def _built() -> ModuleType:
    """The extension, or RuntimeError when it could not be built (callers check available() first)."""
    ext = _state.get("ext") or load()
    if ext is None:
        raise RuntimeError("swiftspec CPU kernels are unavailable")
    return ext


def _rows(x: torch.Tensor, k: int) -> torch.Tensor:
    """x [..., K] as a [M, K] view (or copy) with unit stride along K, as the kernels take it."""
    x2 = x if x.dim() == 2 else x.reshape(-1, k)
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def quant_linear(x: torch.Tensor, qw: PackedWeight, bias: torch.Tensor | None = None,
                 at_level: int | None = None) -> torch.Tensor:
    """y [..., N] = x [..., K] @ W^T (+ bias) with the C++ kernels; x bf16 or fp32 on CPU.

    at_level: the ISA level to run at (default: this process's; tests pass each lower one)."""
    ext, lvl = _built(), _lvl(at_level)
    n, k = qw.shape
    x2 = _rows(x, k)
    if qw.fmt in _KQUANT_BITS:
        kb = qw.kblocks
        y = ext.kquant_linear(x2, qw.qweight, kb.qh, kb.sc, kb.mm, qw.scale, qw.mins, bias,
                              _KQUANT_BITS[qw.fmt], n, k, lvl)
    elif qw.fmt in _QBLOCK_BITS:
        qh = qw.kblocks.qh if qw.fmt == "q5_0" else _EMPTY
        y = ext.qblock_linear(x2, qw.qweight, qh, qw.scale, bias, _QBLOCK_BITS[qw.fmt], n, k, lvl)
    elif qw.fmt == "int4":
        y = ext.quant_linear(x2, qw.qweight, _EMPTY, qw.scale, qw.mins, bias, True, n, k, qw.group_size, lvl)
    else:
        y = ext.quant_linear(x2, qw.qweight, qw.scale, _EMPTY, _EMPTY, bias, False, n, k, qw.group_size, lvl)
    return y if x.dim() == 2 else y.view(*x.shape[:-1], n)


def int4_fit(groups: torch.Tensor) -> torch.Tensor:
    """quant.int4_fit_ref's search in C++ (the same rule, the same result on every CPU; plain
    x86-64 code, so it runs whenever the extension loads).  groups [G, n] fp32 -> [G, 2] (d, mn)."""
    return _built().int4_fit(groups.float().contiguous())


def int4_quantize(w: torch.Tensor, group_size: int) -> PackedWeight:
    """A dense CPU weight [N, K] (fp32 or bf16; other dtypes go through fp32) -> its int4 weight in
    quant.py's layout: int4_fit's search, then the levels and their packing, per tile of 16
    channels in parallel (csrc/int4_quantize.cpp; the bytes of quant.py's torch path)."""
    if w.dtype not in (torch.float32, torch.bfloat16):
        w = w.float()
    q, d, mn = _built().int4_quantize(w.contiguous(), group_size)
    return PackedWeight("int4", tuple(w.shape), group_size, q, d, mn)


def bf16_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                at_level: int | None = None) -> torch.Tensor:
    """y [..., N] = x [..., K] @ w [N, K]^T (+ bias), bf16, at most MAX_SMALL_ROWS rows of x.

    Each row's result is independent of the other rows (see csrc/bf16_gemm_*.cpp)."""
    y = _built().bf16_linear(_rows(x, w.shape[1]), w, bias, _lvl(at_level))
    return y if x.dim() == 2 else y.view(*x.shape[:-1], w.shape[0])


def bf16_prefill(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                 at_level: int | None = None) -> torch.Tensor:
    """y [..., N] = x [..., K] @ w [N, K]^T (+ bias), bf16, for more than MAX_SMALL_ROWS rows of x
    (prompt prefill) where torch has no native bf16 matmul: the C++ AVX2 GEMM on widened fp32
    panels, fp32 accumulation (not bitwise equal to bf16_linear's small-M result).  Fewer rows
    run bf16_linear's kernel."""
    y = _built().bf16_linear(_rows(x, w.shape[1]), w, bias, _lvl(at_level))
    return y if x.dim() == 2 else y.view(*x.shape[:-1], w.shape[0])


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                     at_level: int | None = None) -> torch.Tensor:
    """q [T, H, D] (rotated) over slots [0, S) of k, v [S_max, Hkv, D] with mask [T, S] bool ->
    [T, H, D], scale 1/sqrt(D).  The result depends only on the ordered set of attended slots."""
    mask = mask if mask.stride(-1) == 1 else mask.contiguous()
    return _built().masked_attention(q, k, v, mask, q.shape[-1] ** -0.5, _lvl(at_level))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, at_level: int | None = None) -> torch.Tensor:
    """x [..., n] / rms(x) * weight [n] with the rounding of kernels.rowwise.rms_norm_ref."""
    y = _built().rms_norm(_rows(x, x.shape[-1]), weight, eps, _lvl(at_level))
    return y.view(x.shape)


def silu_mul(gate_up: torch.Tensor, at_level: int | None = None) -> torch.Tensor:
    """gate_up [M, 2I] (gate columns first) -> silu(gate) * up [M, I], rounded as swiglu_act_ref."""
    return _built().silu_mul(_rows(gate_up, gate_up.shape[-1]), _lvl(at_level))
