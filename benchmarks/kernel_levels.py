"""The quantized linears at each ISA level this CPU runs, in one process (issue 15).

ms per set of the four Qwen2.5-Coder-1.5B linear shapes (one call each) for every (format, level,
M), with random weights: int4/int8 (group 128) and random GGUF blocks run as stored (q4k, q5k,
q6k, q8_0, q5_0, q4_0).  COPIES copies of every weight are cycled so each call streams its weights
from DRAM; the (format, level) cells are interleaved within each round, so host noise hits them
alike; the table keeps the minimum.  --shape N,K times that one shape instead of the set.

Run: .venv/bin/python benchmarks/kernel_levels.py [--formats int4,int8,q4k,q6k]
         [--levels avx2,avx2-vnni,avx512-bf16] [--ms 1,4,8,16] [--rounds 15] [--threads 2] [--shape N,K]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch

from swiftspec import kernels
from swiftspec.kernels import capability, cpu_ext, kquant, qblock
from swiftspec.testing.tiny import random_kquant_blocks

SHAPES = [(1536, 1536), (256, 1536), (8960, 1536), (1536, 8960)]  # (N, K): q|o, k|v, gate|up, down
COPIES = 6  # x ~30 M weights per set: more than the L3 in every format


def random_qblocks(n: int, k: int, qtype: str, seed: int) -> np.ndarray:
    """[n, k/32 * block bytes] random Q8_0 / Q5_0 / Q4_0 blocks with fp16 scales in [1e-4, 1.1e-3]."""
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, size=(n * k // 32, qblock.BLOCK_BYTES[qtype]), dtype=np.uint8)
    b[:, :2] = (rng.random((len(b), 1)) * 1e-3 + 1e-4).astype(np.float16).view(np.uint8)
    return b.reshape(n, -1)


def make(fmt: str, n: int, k: int, seed: int) -> kernels.PackedWeight:
    qtype = fmt.upper().replace("K", "_K")
    if qtype in kquant.TYPES:
        return kquant.from_gguf([kquant.RawPart(random_kquant_blocks(n, k, qtype, seed), qtype)], k)
    if qtype in qblock.TYPES:
        return qblock.from_gguf([kquant.RawPart(random_qblocks(n, k, qtype, seed), qtype)], k)
    w = (torch.randn(n, k) * 0.02).to(torch.bfloat16)
    return kernels.quantize_int8(w) if fmt == "int8" else kernels.quantize_int4(w, 128)


def time_cells(formats: list[str], levels: list[int], ms: list[int], rounds: int, shapes: list) -> dict:
    """Minimum seconds per set for each (format, level, M)."""
    weights = {f: [[make(f, n, k, c) for n, k in shapes] for c in range(COPIES)] for f in formats}
    xs = {(m, k): torch.randn(m, k).to(torch.bfloat16) for m in ms for k in {k for _, k in shapes}}
    best: dict[tuple[str, int, int], float] = {}
    calls = 0
    for rnd in range(rounds + 1):  # round 0 warms up
        for m in ms:
            for f in formats:
                for lv in levels:
                    calls += 1
                    t0 = time.perf_counter()
                    for (_, k), w in zip(shapes, weights[f][calls % COPIES]):
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
    ap.add_argument("--shape", default=None, help="N,K: time this one shape instead of the set")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    levels = ([cpu_ext.LEVELS[name] for name in args.levels.split(",")] if args.levels
              else cpu_ext.supported_levels())
    formats, ms = args.formats.split(","), [int(m) for m in args.ms.split(",")]
    shapes = [tuple(int(v) for v in args.shape.split(","))] if args.shape else SHAPES
    best = time_cells(formats, levels, ms, args.rounds, shapes)
    what = f"ms per {shapes[0][0]}x{shapes[0][1]} call" if args.shape else "ms per set of the four linears"
    print(f"{capability.cpu_model()}, {args.threads} threads, {what}")
    print("| format | M | " + " | ".join(cpu_ext.LEVEL_NAMES[lv] for lv in levels) + " |")
    print("|---|---|" + "---|" * len(levels))
    for f in formats:
        for m in ms:
            print(f"| {f} | {m} | " + " | ".join(f"{best[f, lv, m] * 1e3:.2f}" for lv in levels) + " |")


if __name__ == "__main__":
    main()
