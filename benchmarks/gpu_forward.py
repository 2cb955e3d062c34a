"""Per-forward latency for benchmarks/gpu_check.py (step 2): target and draft at 1 and 8 rows after a
prefix, eager and replaying CUDA graphs (runner/cuda_graph.py), and the floor under any forward: one
tiny op, timed with CUDA events on a GPU (perf_counter on the CPU)."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch
from gpu_pair import RandomModel

from swiftspec.runner.cuda_graph import GraphRunner
from swiftspec.runner.model_runner import ModelRunner

WARMUP_CALLS = 3


def time_ms(fn: Callable[[], object], iters: int, device: str) -> float:
    """Median milliseconds of fn() after warm-up: CUDA events on a GPU (the device's timeline, host
    gaps included), perf_counter on the CPU."""
    for _ in range(WARMUP_CALLS):
        fn()
    samples = []
    for _ in range(iters):
        if device.startswith("cuda"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            samples.append(1e3 * (time.perf_counter() - t))
    return statistics.median(samples)


def prefilled_runner(model: RandomModel, prefix: int, max_rows: int) -> ModelRunner:
    """A runner whose cache holds `prefix` tokens, with room for max_rows more."""
    runner = ModelRunner(model.model, prefix + max_rows + 8, max_nodes=max_rows)
    runner.extend([(7 * i + 3) % model.args.vocab_size for i in range(prefix)])
    return runner


def chain_call(runner: ModelRunner, rows: int, forward: Callable | None = None) -> Callable[[], torch.Tensor]:
    """One forward of `rows` chained tokens after the prefix (what a verification or a draft
    expansion runs), writing the slots just past it; forward: the runner's (default) or a GraphRunner's."""
    start, dev = runner.kv.prefix_len, runner.device
    tokens = (torch.arange(rows, device=dev) * 11 + 5) % runner.model.args.vocab_size  # [T]
    slots = torch.arange(start, start + rows, device=dev)  # [T]: also the positions
    mask = torch.cat([torch.ones(rows, start, dtype=torch.bool, device=dev),
                      torch.ones(rows, rows, dtype=torch.bool, device=dev).tril()], 1)  # [T, start + T]
    call = forward or runner.forward
    return lambda: call(tokens, slots, slots, mask)


def forward_latency(model: RandomModel, rows: list[int], prefix: int, iters: int) -> dict[str, float]:
    """{"eager T=n": ms, "graph T=n": ms} per row count (graphs on CUDA only)."""
    runner = prefilled_runner(model, prefix, max(rows))
    device = str(runner.device)
    out = {f"eager T={n}": time_ms(chain_call(runner, n), iters, device) for n in rows}
    if device.startswith("cuda"):
        graphs = GraphRunner(runner, tuple(rows)).capture()
        out |= {f"graph T={n}": time_ms(chain_call(runner, n, graphs.forward), iters, device) for n in rows}
    return out


def op_floor(device: str, iters: int) -> dict[str, float]:
    """What one forward cannot go below: a one-element add (CUDA events, so launch to completion on
    the device), the host's cost per launch over 1000 back-to-back adds, and on a GPU the replay of
    a CUDA graph that holds one add."""
    x = torch.zeros(1, device=device)
    out = {"tiny op ms": time_ms(lambda: x.add_(1), iters, device)}
    t = time.perf_counter()
    for _ in range(1000):
        x.add_(1)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    out["host us per launch (1000 back-to-back)"] = 1e3 * (time.perf_counter() - t)
    if device.startswith("cuda"):
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            x.add_(1)  # warm-up on a side stream, as capture asks
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(graph):
            x.add_(1)
        out["graph replay of one op ms"] = time_ms(graph.replay, iters, device)
    return out
