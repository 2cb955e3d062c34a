"""What the CPU kernels can do on this machine: the capability report behind `swiftspec info`,
the bench's machine record, and the one-time warning of a mode that falls back to torch."""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from swiftspec.kernels import cpu_ext

# The CPU flags (as /proc/cpuinfo names them) that decide an ISA level, lowest level first.
FEATURES = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16",
            "avx_vnni", "amx_tile")
OP_WORDS = {
    "quant_linear": "int8/int4 linear",
    "bf16_linear": "bf16 linear (<= 16 rows)",
    "attention": "masked attention (<= 16 rows)",
    "rowwise": "RMSNorm, SwiGLU, RoPE + cache store",
    "gguf_blocks": "GGUF Q8_0/Q5_0/Q4_0/Q5_K linear",
}


@dataclass(frozen=True, slots=True)
class Capability:
    """The kernels' view of this machine."""

    cpu: str
    features: list[str]  # the FEATURES this CPU reports
    detected_level: str  # the best ISA level the CPU runs
    level: str  # the level in use: detected, capped by SWIFTSPEC_ISA
    cap: str | None  # SWIFTSPEC_ISA as set, or None
    paths: dict[str, str]  # op -> the ISA path it runs, or "torch" (reference fallback)
    threads: int

    def to_json(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        cap = f" (capped by {cpu_ext.ISA_ENV}={self.cap})" if self.cap else ""
        rows = [f"cpu: {self.cpu}", f"features: {' '.join(self.features) or 'none of ' + ', '.join(FEATURES)}",
                f"isa level: {self.level}{cap}; this CPU runs up to {self.detected_level}",
                f"threads: {self.threads}", "kernels:"]
        width = max(len(w) for w in OP_WORDS.values())
        for op, words in OP_WORDS.items():
            path = self.paths[op]
            rows.append(f"  {words:<{width}}  {path}{'  (fallback: slow)' if path == 'torch' else ''}")
        rows.append(f"  {'prefill (> 16 rows)':<{width}}  {prefill_words(self.paths)}")
        if "amx_tile" in self.features:
            rows.append("note: AMX is reported but never used (some VMs trap AMX tiles)")
        return rows


def prefill_words(paths: dict[str, str]) -> str:
    """How long calls (prompt prefill) run their bf16 linears and attention here."""
    bf16 = "oneDNN bf16" if paths["bf16_linear"] == "avx512-bf16" else "fp32 GEMM on widened weights"
    ours = paths["attention"] != "torch" and prefill_attention_ours(cpu_ext.LEVELS[paths["attention"]])
    return f"bf16 linear: {bf16}; attention: {'the masked attention kernel' if ours else 'torch SDPA'}"


def prefill_attention_ours(attention_path: int) -> bool:
    """Whether calls of more than MAX_SMALL_ROWS rows (prefill) run the C++ masked attention, whose
    path is attention_path, rather than torch's SDPA: where that path is AVX-512 and the CPU is not
    Intel's.  SDPA runs MKL's GEMMs, whose fast code is Intel-only: on an AMD EPYC (Zen 5, 2
    threads) MKL's sgemm ran at 41 GMAC/s where oneDNN's bf16 GEMM ran at 359, and a 256-row chunk
    after 2,500 keys took 30.1 ms a layer in SDPA, 21.1 in the kernel (docs/bench/long-context.md).
    The AVX2 path is the slower one (36.0 ms); Intel CPUs keep SDPA (not measured against it)."""
    return attention_path >= cpu_ext.LEVELS["avx512"] and cpu_vendor() != "GenuineIntel"


@functools.cache
def cpu_vendor() -> str:
    """The CPU's vendor id from /proc/cpuinfo ("GenuineIntel", "AuthenticAMD"; "unknown" elsewhere)."""
    return _cpuinfo("vendor_id") or "unknown"


def _cpuinfo(field: str) -> str | None:
    """The value of /proc/cpuinfo's first `field` line (None where there is none, or no such file)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_flags() -> set[str]:
    return set((_cpuinfo("flags") or "").split())


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ("unknown" elsewhere)."""
    return _cpuinfo("model name") or "unknown"


def capability() -> Capability:
    """This process's capability report (builds the kernels on first use)."""
    flags = cpu_flags()
    paths = {op: cpu_ext.LEVEL_NAMES[lv] if lv else "torch" for op, lv in cpu_ext.kernel_paths().items()}
    cap = os.environ.get(cpu_ext.ISA_ENV) or None
    return Capability(cpu=cpu_model(), features=[f for f in FEATURES if f in flags],
                      detected_level=cpu_ext.LEVEL_NAMES[cpu_ext.detected_level()], level=cpu_ext.isa(),
                      cap=cap, paths=paths, threads=torch.get_num_threads())


@functools.cache
def warn_fallbacks() -> None:
    """Says once per process, on stderr, which kernels of a CPU model fall back to torch here."""
    slow = [OP_WORDS[op] for op, lv in cpu_ext.kernel_paths().items() if lv == 0]
    if slow:
        print(f"swiftspec: the {', '.join(slow)} kernels run on the torch reference at ISA level {cpu_ext.isa()} "
              "(slow, and speculative greedy output may differ from ar at near-ties)", file=sys.stderr)
