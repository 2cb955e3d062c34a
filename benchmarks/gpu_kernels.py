"""GPU microbenchmark of swiftspec's CUDA path (issue 8, part 4): Triton tree attention against the
torch reference (RoPE + SDPA with a boolean mask), fused SwiGLU against matmul + activation, and a
draft/verify-sized model step with and without CUDA graphs.

Shapes are one tensor-parallel rank of the paper's models (Llama-3-70B / Qwen2-72B at TP 8: 8 query
heads, 1 KV head, head_dim 128, I = 3584) plus an 8B-sized rank at TP 1; T and M are the draft width
and verify batch (1, 8, 16). The step benchmark uses a random-weight Qwen2.5-0.5B-shaped model (the
default draft). Times are medians of CUDA-event timings after warm-up, in microseconds.

Run: python benchmarks/gpu_kernels.py [--quick] [--iters 50]   (about a minute on an H200; exits 0 with a
message where CUDA or Triton is missing)
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from swiftspec import kernels
from swiftspec.kernels import triton_support
from swiftspec.kernels.swiglu import swiglu_act_ref, swiglu_act_triton, swiglu_triton
from swiftspec.kernels.tree_attention import tree_attention_ref, tree_attention_triton

# name -> (query heads, kv heads, head_dim) of one rank
ATTENTION_SHAPES = {"70B-tp8": (8, 1, 128), "8B-tp1": (32, 8, 128)}
# name -> (hidden, intermediate) of one rank
MLP_SHAPES = {"70B-tp8": (8192, 3584), "8B-tp1": (4096, 14336)}
DTYPE = torch.bfloat16


@dataclass(frozen=True, slots=True)
class Timing:
    """One row of a table: what was timed and the median microseconds of each implementation."""

    label: str
    micros: dict[str, float]


def time_us(fn: Callable[[], object], iters: int) -> float:
    """Median CUDA-event time of fn() in microseconds, after three warm-up calls."""
    for _ in range(3):
        fn()
    samples = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(samples)


def attention_rows(iters: int, quick: bool) -> list[Timing]:
    """Triton tree attention vs the reference, live S and a static S padded to 8192 (graph layout)."""
    rows = []
    for name, (heads, kv_heads, head_dim) in ATTENTION_SHAPES.items():
        for num_tokens in (1, 8) if quick else (1, 8, 16):
            for live, width in ((1024, 1024), (4096, 4096), (1024, 8192)):
                args = _attention_args(num_tokens, heads, kv_heads, head_dim, live, width)
                times = {"sdpa-ref": time_us(lambda: tree_attention_ref(*args), iters),
                         "triton": time_us(lambda: tree_attention_triton(*args), iters)}
                rows.append(Timing(f"{name} T={num_tokens} live={live} S={width}", times))
    return rows


def _attention_args(num_tokens: int, heads: int, kv_heads: int, head_dim: int, live: int,
                    width: int) -> list[torch.Tensor]:
    """q, caches [width, Hkv, D], a mask whose rows see the first `live` slots, cos, sin."""
    dev = "cuda"
    q = torch.randn(num_tokens, heads, head_dim, device=dev, dtype=DTYPE)
    k, v = (torch.randn(width, kv_heads, head_dim, device=dev, dtype=DTYPE) for _ in range(2))
    mask = torch.zeros(num_tokens, width, dtype=torch.bool, device=dev)
    mask[:, :live] = True
    angles = torch.rand(num_tokens, head_dim // 2, device=dev) * 6.28
    cos = torch.cat([angles.cos()] * 2, -1).to(DTYPE)
    sin = torch.cat([-angles.sin(), angles.sin()], -1).to(DTYPE)
    return [q, k, v, mask, cos, sin]


def swiglu_rows(iters: int, quick: bool) -> list[Timing]:
    """Fused SwiGLU vs cuBLAS matmul + torch activation and cuBLAS + Triton activation."""
    rows = []
    for name, (hidden, inter) in MLP_SHAPES.items():
        weight = torch.randn(2 * inter, hidden, device="cuda", dtype=DTYPE) * hidden**-0.5
        for num_rows in (1, 8) if quick else (1, 8, 16):
            x = torch.randn(num_rows, hidden, device="cuda", dtype=DTYPE)
            times = {"linear+torch-act": time_us(lambda: swiglu_act_ref(F.linear(x, weight)), iters),
                     "linear+triton-act": time_us(lambda: swiglu_act_triton(F.linear(x, weight)), iters),
                     "fused-triton": time_us(lambda: swiglu_triton(x, weight), iters)}
            rows.append(Timing(f"{name} M={num_rows}", times))
    return rows


def step_rows(iters: int, quick: bool) -> list[Timing]:
    """One forward of n tree tokens over a 1000-token prefix: eager vs replaying a CUDA graph."""
    from swiftspec.runner.cuda_graph import GraphRunner
    from swiftspec.runner.model_runner import ModelRunner

    runner = ModelRunner(_draft_sized_model(), 2048, max_nodes=64)
    runner.extend(list(range(1000)))
    buckets = (1, 8) if quick else (1, 8, 16)
    graphs = GraphRunner(runner, buckets).capture()
    rows = []
    for n in buckets:
        tokens = torch.arange(n, device="cuda")
        slots = torch.arange(1000, 1000 + n, device="cuda")
        mask = torch.ones(n, 1000 + n, dtype=torch.bool, device="cuda")
        times = {"eager": time_us(lambda: runner.forward(tokens, slots, slots, mask), iters),
                 "cuda-graph": time_us(lambda: graphs.forward(tokens, slots, slots, mask), iters)}
        rows.append(Timing(f"0.5B-shaped n={n}", times))
    return rows


def _draft_sized_model() -> torch.nn.Module:
    """A Qwen2.5-0.5B-shaped decoder with random bf16 weights on the GPU."""
    from swiftspec.model import ModelArgs, Transformer

    args = ModelArgs(arch="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24,
                     num_heads=14, num_kv_heads=2, head_dim=64, rope_theta=1e6, qkv_bias=True,
                     tie_word_embeddings=True, max_position_embeddings=32768)
    model = Transformer(args, dtype=DTYPE, device="cuda")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02)
    return model.eval()


def print_table(title: str, rows: list[Timing]) -> None:
    """A fixed-width table: one column per implementation, plus the speed-up of the last over the first."""
    names = list(rows[0].micros)
    print(f"\n{title} (median us)")
    print(f"{'case':<38}" + "".join(f"{n:>20}" for n in names) + f"{'speed-up':>10}")
    for row in rows:
        cells = "".join(f"{row.micros[n]:>20.1f}" for n in names)
        print(f"{row.label:<38}{cells}{row.micros[names[0]] / row.micros[names[-1]]:>9.2f}x")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=50, help="timed calls per case (median reported)")
    ap.add_argument("--quick", action="store_true", help="fewer cases (T, M and buckets 1 and 8 only)")
    opts = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_kernels: no CUDA device here; nothing to measure (run it on a GPU machine).")
        return 0
    if not triton_support.available():
        print("gpu_kernels: Triton is not installed (pip install triton); nothing to measure.")
        return 0
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"Triton dispatch on CUDA: {kernels.use_triton(torch.empty(0, device='cuda'))}")
    print_table("tree attention, bf16", attention_rows(opts.iters, opts.quick))
    print_table("SwiGLU gate_up + activation, bf16", swiglu_rows(opts.iters, opts.quick))
    print_table("model step (draft-sized), bf16", step_rows(opts.iters, opts.quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
