"""Prints the CMAKE_ARGS that build llama.cpp (llama-cpp-python) for this CPU's own features.

Never -march=native (GGML_NATIVE): it can enable instructions a VM traps, and AMX is always off
(some hosts advertise AMX tiles and raise SIGILL on them).  SWIFTSPEC_ISA caps the features as it
caps SwiftSpec's kernels, so `SWIFTSPEC_ISA=avx2` builds an AVX2-only peer on an AVX-512 host for
a like-for-like comparison.  Run: python tools/llamacpp_cmake_args.py
"""

from __future__ import annotations

import os
from pathlib import Path

LEVELS = ("avx2", "avx2-vnni", "avx512", "avx512-vnni", "avx512-bf16")  # SWIFTSPEC_ISA names, lowest first
# GGML option -> (/proc/cpuinfo flag, lowest SWIFTSPEC_ISA level that may use it)
OPTIONS = {
    "GGML_AVX": ("avx", "avx2"), "GGML_AVX2": ("avx2", "avx2"), "GGML_FMA": ("fma", "avx2"),
    "GGML_F16C": ("f16c", "avx2"), "GGML_BMI2": ("bmi2", "avx2"), "GGML_AVX512": ("avx512f", "avx512"),
    "GGML_AVX512_VBMI": ("avx512vbmi", "avx512"), "GGML_AVX512_VNNI": ("avx512_vnni", "avx512-vnni"),
    "GGML_AVX512_BF16": ("avx512_bf16", "avx512-bf16"), "GGML_AVX_VNNI": ("avx_vnni", "avx2-vnni"),
}
OFF = ("GGML_NATIVE", "GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cmake_args() -> str:
    flags = cpu_flags()
    cap = os.environ.get("SWIFTSPEC_ISA", "").strip().lower() or LEVELS[-1]
    if cap not in LEVELS:
        raise SystemExit(f"error: SWIFTSPEC_ISA={cap!r} is not one of {', '.join(LEVELS)}")
    allowed = LEVELS[: LEVELS.index(cap) + 1]
    on = {opt: flag in flags and level in allowed for opt, (flag, level) in OPTIONS.items()}
    return " ".join([f"-D{o}=OFF" for o in OFF] + [f"-D{o}={'ON' if v else 'OFF'}" for o, v in on.items()])


if __name__ == "__main__":
    print(cmake_args())
