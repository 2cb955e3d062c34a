"""Whole-model forward times of the default pair at the row counts of decoding, verification and
draft expansion: the fused CPU decoder (kernels.cpu_decoder, one C++ call for all layers) against
the unfused forward (the same kernels called op by op from Python), interleaved per round.

Each call runs T new tokens (a chain) after a 300-token prefix, then the full LM head (the draft
engine uses a pruned one); the table reports the minimum over rounds.

Run: .venv/bin/python benchmarks/forward.py [--weights bf16,int8,int4] [--rounds 15] [--rows 1,4,8,16]
"""

from __future__ import annotations

import argparse
import time

import torch

from swiftspec import kernels
from swiftspec.config import EngineConfig, LoadConfig
from swiftspec.runner.model_runner import ModelRunner
from swiftspec.weights.loader import load_model

PREFIX = 300


def _call(runner: ModelRunner, rows: int):  # noqa: ANN202 - returns a closure
    """A forward of `rows` chained tokens after the prefix, writing the slots behind it."""
    start = runner.kv.prefix_len
    tokens = torch.arange(rows) + 500  # [T]
    slots = torch.arange(start, start + rows)  # [T]
    mask = torch.cat([torch.ones(rows, start, dtype=torch.bool), torch.ones(rows, rows, dtype=torch.bool).tril()], 1)
    return lambda: runner.forward(tokens, slots, slots, mask)


def measure(source: str, weights: str, rows: list[int], rounds: int) -> dict[tuple[int, bool], float]:
    """{(T, fused): best ms} for one model packed as `weights`."""
    model = load_model(source, LoadConfig(weights=weights)).model
    kernels.prepare_model_(model, weights)
    runner = ModelRunner(model, PREFIX + 64, max_nodes=16)
    runner.extend(list(range(100, 100 + PREFIX)))
    best: dict[tuple[int, bool], float] = {}
    for t in rows:
        call = _call(runner, t)
        for fused in (True, False):  # warm-up
            model.fuse_cpu_layers = fused
            call()
        for _ in range(rounds):
            for fused in (True, False):
                model.fuse_cpu_layers = fused
                start = time.perf_counter()
                call()
                ms = 1e3 * (time.perf_counter() - start)
                best[t, fused] = min(best.get((t, fused), ms), ms)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", default="bf16,int8,int4")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--rows", default="1,4,8,16")
    args = ap.parse_args()
    torch.set_num_threads(2)
    rows = [int(r) for r in args.rows.split(",")]
    cfg = EngineConfig()
    print(f"threads=2, prefix {PREFIX} tokens, min over {args.rounds} interleaved rounds; ms per forward + LM head")
    print("\n| model | weights | " + " | ".join(f"T={t} fused | T={t} unfused" for t in rows) + " |")
    print("|---|---|" + "---|---|" * len(rows))
    for name, source in (("1.5B", cfg.target), ("0.5B", cfg.draft)):
        for weights in args.weights.split(","):
            best = measure(source, weights, rows, args.rounds)
            cells = " | ".join(f"{best[t, True]:.1f} | {best[t, False]:.1f}" for t in rows)
            print(f"| {name} | {weights} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
