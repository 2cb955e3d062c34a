"""Memory-bandwidth roofline: measured streaming-read bandwidth and the weight bytes each mode reads.

Single-stream decoding on a CPU is bound by reading weights. The bound of a mode is

    bytes per token = (target bytes + draft bytes * draft forwards per round) / acceptance length
    bound tok/s     = bandwidth / bytes per token

where "bytes" are the weights one forward reads, in the format the mode holds them: for our modes
every linear layer plus the LM head (from the shapes); for transformers every parameter but the
input embedding; for llama.cpp every GGUF tensor as stored but `token_embd`. Embedding lookups and
the KV cache are left out, so the bound is optimistic. For autoregressive modes the draft term is 0
and the acceptance length is 1. The bandwidth is the faster of two tests, before and after the runs.
The draft's reads count in full also for async mode: on one machine both models share the bandwidth.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from swiftspec.model.args import ModelArgs


@dataclass(frozen=True, slots=True)
class WeightBytes:
    """Weight bytes one forward of each model reads (draft 0 for autoregressive modes)."""

    target: int
    draft: int = 0


@dataclass(frozen=True, slots=True)
class Bound:
    """A mode's roofline: bytes per emitted token and the tok/s the bandwidth allows."""

    bytes_per_token: float
    tokens_per_s: float
    draft_forwards_per_round: float


def measure_bandwidth(threads: int, gib: float = 1.0, repeats: int = 10) -> float:
    """Best streaming-read bandwidth in bytes/s: torch.sum over a `gib` GiB float32 tensor.

    The best of several passes, since other work on the machine only ever slows a pass down.
    """
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        data = torch.ones(int(gib * (1 << 30)) // 4, dtype=torch.float32)
        data.sum()  # fault the pages in before timing
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            data.sum()
            best = min(best, time.perf_counter() - start)
        return data.numel() * 4 / best
    finally:
        torch.set_num_threads(saved)


def our_weight_bytes(args: ModelArgs, dtype: str, weights: str) -> int:
    """Bytes our engine reads per forward: weights in format `weights` ("bf16" = the working dtype)."""
    return args.weight_bytes(dtype, weights)


def gguf_weight_bytes(path: Path) -> int:
    """Bytes llama.cpp reads per forward of a GGUF: every tensor as stored except the token embedding,
    which counts once as the LM head when the file has no separate `output.weight` (tied)."""
    from gguf import GGUFReader

    tensors = {t.name: int(t.n_bytes) for t in GGUFReader(path).tensors}
    embed = tensors.pop("token_embd.weight", 0)
    return sum(tensors.values()) + (0 if "output.weight" in tensors else embed)


def bound(
    weights: WeightBytes,
    bandwidth: float,
    acceptance_length: float,
    draft_forwards_per_round: float = 0.0,
) -> Bound:
    """The roofline of one mode (see the module docstring)."""
    per_round = weights.target + weights.draft * draft_forwards_per_round
    per_token = per_round / max(acceptance_length, 1e-9)
    return Bound(bytes_per_token=per_token, tokens_per_s=bandwidth / per_token,
                 draft_forwards_per_round=draft_forwards_per_round)
