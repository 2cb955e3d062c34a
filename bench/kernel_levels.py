"""The quantized linears at each ISA level this CPU runs, in one process (issue 15).

ms per set of the four Qwen2.5-Coder-1.5B linear shapes (one call each) for every (format, level,
M), with random weights: int4/int8 (group 128) and random GGUF Q4_K/Q6_K blocks.  COPIES copies of
every weight are cycled so each call streams its weights from DRAM; the (format, level) cells are
interleaved within each round, so host noise hits them alike; the table keeps the minimum.

Run: .venv/bin/python bench/kernel_levels.py [--formats int4,int8,q4k,q6k]
         [--levels avx2,avx2-vnni,avx512-bf16] [--ms 1,4,8,16] [--rounds 15] [--threads 2]
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from swiftspec import kernels
from swiftspec.kernels import capability, cpu_ext, kquant
from swiftspec.weights.tiny import random_kquant_blocks

SHAPES = [(1536, 1536), (256, 1536), (8960, 1536), (1536, 8960)]  # (N, K): q|o, k|v, gate|up, down
COPIES = 6  # x ~30 M weights per set: more than the L3 in every format


def make(fmt: str, n: int, k: int, seed: int) -> kernels.PackedWeight:
    if fmt in ("q4k", "q6k"):
        qtype = "Q4_K" if fmt == "q4k" else "Q6_K"
        return kquant.from_gguf([kquant.RawPart(random_kquant_blocks(n, k, qtype, seed), qtype)], k)
    w = (torch.randn(n, k) * 0.02).to(torch.bfloat16)
    return kernels.quantize_int8(w) if fmt == "int8" else kernels.quantize_int4(w, 128)


def time_cells(formats: list[str], levels: list[int], ms: list[int], rounds: int) -> dict:
    """Minimum seconds per set for each (format, level, M)."""
    weights = {f: [[make(f, n, k, c) for n, k in SHAPES] for c in range(COPIES)] for f in formats}
    xs = {(m, k): torch.randn(m, k).to(torch.bfloat16) for m in ms for k in {k for _, k in SHAPES}}
    best: dict[tuple[str, int, int], float] = {}
    calls = 0
    for rnd in range(rounds + 1):  # round 0 warms up
        for m in ms:
            for f in formats:
                for lv in levels:
                    calls += 1
                    t0 = time.perf_counter()
                    for (_, k), w in zip(SHAPES, weights[f][calls % COPIES]):
                        cpu_ext.quant_linear(xs[m, k], w, at_level=lv)
                    if rnd:
                        best[f, lv, m] = min(best.get((f, lv, m), math.inf), time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--formats", default="int4,int8,q4k,q6k")
    ap.add_argument("--levels", default=None, help="level names (default: every level this CPU runs)")
    ap.add_argument("--ms", default="1,4,8,16")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    levels = ([cpu_ext.LEVELS[name] for name in args.levels.split(",")] if args.levels
              else cpu_ext.supported_levels())
    formats, ms = args.formats.split(","), [int(m) for m in args.ms.split(",")]
    best = time_cells(formats, levels, ms, args.rounds)
    print(f"{capability.cpu_model()}, {args.threads} threads, ms per set of the four linears")
    print("| format | M | " + " | ".join(cpu_ext.LEVEL_NAMES[lv] for lv in levels) + " |")
    print("|---|---|" + "---|" * len(levels))
    for f in formats:
        for m in ms:
            print(f"| {f} | {m} | " + " | ".join(f"{best[f, lv, m] * 1e3:.2f}" for lv in levels) + " |")


if __name__ == "__main__":
    main()
