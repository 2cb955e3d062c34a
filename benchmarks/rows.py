"""The target's whole forward at every row count (issue 54): ms for T rows (decode 1, verification
2-16, prefill chunks 64-512) after a prefix of 200 and of 3k tokens, beside the bandwidth roofline
(the weight bytes one forward reads at this host's measured read bandwidth) and the int8 compute
roof (T x the linears' multiply-adds at the measured vpdpbusd peak; AVX-512 VNNI hosts only).

Each call runs T chained tokens at the next slots and the LM head over all T rows (verification's
shape; prefill's chunks, T > 16, take the last row's only), with the mask a prefill call gets (keys
padded to whole ModelRunner KEY_BLOCKs).  Rounds interleave the row counts; the table keeps the
minimum.  The ISA level is this process's (SWIFTSPEC_ISA caps it): run once per level.

Run: .venv/bin/python benchmarks/rows.py [--rows 1,2,4,8,16,64,256,512] [--contexts 200,3000] [--rounds 5]
     SWIFTSPEC_ISA=avx2 .venv/bin/python benchmarks/rows.py
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import tempfile
import time

import torch

from swiftspec.config import EngineConfig, LoadConfig
from swiftspec.kernels import PackedWeight, cpu_ext
from swiftspec.parallel.linear import LinearBase, ParallelLMHead
from swiftspec.runner.load import load_target
from swiftspec.runner.model_runner import MIN_PREFILL_ROWS, ModelRunner

PEAK_SRC = pathlib.Path(__file__).with_name("isa_peak.cpp")


def read_bandwidth(gib: float = 1.0) -> float:
    """Bytes per second that a sum over a buffer far larger than the caches reads (best of 5)."""
    buf = torch.ones(int(gib * (1 << 30)) // 4, dtype=torch.float32)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - start)
    return buf.nbytes / best


def int8_peak() -> float | None:
    """vpdpbusd multiply-adds per second on 2 cores (benchmarks/isa_peak.cpp), or None where the
    CPU has no AVX-512 VNNI (the program would not run) or no compiler."""
    if "avx512_vnni" not in pathlib.Path("/proc/cpuinfo").read_text():
        return None
    exe = pathlib.Path(tempfile.mkdtemp()) / "isa_peak"
    try:
        subprocess.run(["g++", "-O2", "-Wno-ignored-attributes", "-o", str(exe), str(PEAK_SRC)], check=True)
        out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    line = next(line for line in out.splitlines() if line.startswith("vpdpbusd"))  # "... = N GMAC/s per core"
    return 2 * float(line.split("=")[1].split()[0]) * 1e9  # both cores keep the clock (isa_peak.cpp)


def linear_stats(model: torch.nn.Module) -> tuple[int, int, int]:
    """(weight bytes, multiply-adds per row of the layers' linears, of the LM head)."""
    nbytes, macs = 0, [0, 0]
    for m in model.modules():
        if isinstance(m, (LinearBase, ParallelLMHead)):
            w = m.weight
            nbytes += w.nbytes if isinstance(w, PackedWeight) else w.numel() * w.element_size()
            macs[isinstance(m, ParallelLMHead)] += w.shape[0] * w.shape[1]
    return nbytes, macs[0], macs[1]


def _call(runner: ModelRunner, start: int, rows: int):  # noqa: ANN202 - returns a closure
    tokens = torch.arange(rows) + 500  # [T]
    slots = torch.arange(start, start + rows)  # [T]
    mask = runner.prefix_mask(start, rows)  # [T, S]: a prefill call's keys in whole key blocks
    last = torch.tensor([rows - 1]) if rows >= MIN_PREFILL_ROWS else None  # prefill: the last row's logits
    return lambda: runner.forward(tokens, slots, slots, mask, rows=last)


def measure(runner: ModelRunner, context: int, rows: list[int], rounds: int) -> dict[int, float]:
    """{T: best ms} after a prefix of `context` tokens."""
    runner.kv.reset()
    runner.extend([100 + i % 5000 for i in range(context)])
    calls = {t: _call(runner, context, t) for t in rows}
    for call in calls.values():
        call()
    best: dict[int, float] = {}
    for _ in range(rounds):
        for t, call in calls.items():
            start = time.perf_counter()
            call()
            best[t] = min(best.get(t, float("inf")), 1e3 * (time.perf_counter() - start))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,4,8,16,64,256,512")
    ap.add_argument("--contexts", default="200,3000")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(2)
    rows = [int(r) for r in args.rows.split(",")]
    contexts = [int(c) for c in args.contexts.split(",")]
    loaded = load_target(EngineConfig().target, LoadConfig(weights="gguf"))
    runner = ModelRunner(loaded.model, max(contexts) + max(rows), max_nodes=1)  # whole key blocks: cache_slots
    nbytes, macs, head_macs = linear_stats(loaded.model)
    level = cpu_ext.LEVEL_NAMES[cpu_ext.level()]
    # the vpdpbusd roof bounds the AVX-512 VNNI kernels only (lower levels run other instructions)
    bandwidth, peak = read_bandwidth(), int8_peak() if cpu_ext.level() >= cpu_ext.LEVELS["avx512-vnni"] else None
    print(f"target {EngineConfig().target} (gguf), ISA level {level}, 2 threads, min over {args.rounds} rounds")
    print(f"linears and LM head: {nbytes / 1e9:.2f} GB, {macs / 1e9:.2f} + {head_macs / 1e9:.2f} GMAC per row; "
          f"read bandwidth {bandwidth / 1e9:.1f} GB/s; " + (f"int8 peak {peak / 1e9:.0f} GMAC/s" if peak else "int8 peak: n/a (below avx512-vnni)"))
    head_rows = [t if t < MIN_PREFILL_ROWS else 1 for t in rows]  # rows the LM head runs over
    roof = [max(nbytes / bandwidth, (t * macs + h * head_macs) / peak if peak else 0.0) * 1e3
            for t, h in zip(rows, head_rows)]
    print("\n| context | " + " | ".join(f"T={t}" for t in rows) + " |")
    print("|---|" + "---|" * len(rows))
    print("| roof ms | " + " | ".join(f"{r:.1f}" for r in roof) + " |")
    for context in contexts:
        best = measure(runner, context, rows, args.rounds)
        print(f"| {context} ms | " + " | ".join(f"{best[t]:.1f}" for t in rows) + " |", flush=True)
        print(f"| {context} / T=1 | " + " | ".join(f"{best[t] / best[rows[0]]:.2f}" for t in rows) + " |", flush=True)


if __name__ == "__main__":
    main()
