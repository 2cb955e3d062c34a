"""Tensor-parallel linear and embedding layers (nano-vllm style) with per-parameter weight loaders.

Every parameter carries `weight_loader(param, loaded_weight, shard_id=None)`, which copies this rank's
shard of a full (unsharded) HF tensor into it, and `shard_ids`, the shard ids a complete checkpoint
supplies for it ((None,) for an unpacked parameter). Loaders convert dtype and check shapes.
With tp_size == 1 no layer makes a collective call.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from swiftspec import kernels
from swiftspec.parallel.state import ParallelState

WeightLoader = Callable[..., None]


def _check_shape(dst: torch.Tensor, src: torch.Tensor) -> None:
    if dst.shape != src.shape:
        raise ValueError(f"shape mismatch: expected {tuple(dst.shape)}, checkpoint has {tuple(src.shape)}")


def _check_full_size(loaded: torch.Tensor, dim: int, full: int) -> None:
    """Reject a checkpoint tensor whose unsharded size along `dim` is not `full`."""
    if loaded.dim() <= dim or loaded.shape[dim] != full:
        raise ValueError(f"shape mismatch: expected size {full} in dim {dim}, checkpoint has {tuple(loaded.shape)}")


def default_weight_loader(param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None) -> None:
    """Copy a replicated (unsharded) tensor whole."""
    _check_shape(param.data, loaded_weight)
    param.data.copy_(loaded_weight)


def _shard_loader(dim: int, rank: int, full: int) -> WeightLoader:
    """Loader taking the rank-th equal slice of `dim` (size `full` in the checkpoint)."""

    def load(param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None) -> None:
        _check_full_size(loaded_weight, dim, full)
        size = param.shape[dim]
        default_weight_loader(param, loaded_weight.narrow(dim, rank * size, size))

    return load


def _new_param(
    shape: Sequence[int], dtype: torch.dtype, device: torch.device | str, loader: WeightLoader, shard_ids: tuple
) -> nn.Parameter:
    param = nn.Parameter(torch.empty(tuple(shape), dtype=dtype, device=device), requires_grad=False)
    param.weight_loader = loader
    param.shard_ids = shard_ids
    return param


def _divide(n: int, tp_size: int, what: str) -> int:
    if n % tp_size:
        raise ValueError(f"{what} ({n}) is not divisible by the tensor-parallel size {tp_size}")
    return n // tp_size


class LinearBase(nn.Module):
    """A y = x W^T (+ b) layer whose local weight is [out_local, in_local] in `self.weight`."""

    def __init__(
        self,
        in_local: int,
        out_local: int,
        *,
        bias: bool,
        parallel: ParallelState,
        dtype: torch.dtype,
        device: torch.device | str,
        shard_ids: tuple = (None,),
    ) -> None:
        super().__init__()
        self.parallel = parallel
        self.weight = _new_param((out_local, in_local), dtype, device, self.weight_loader, shard_ids)
        self.bias = _new_param((out_local,), dtype, device, self.bias_loader, shard_ids) if bias else None

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None) -> None:
        raise NotImplementedError

    def bias_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None) -> None:
        self.weight_loader(param, loaded_weight, shard_id)

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [T, in_local] -> [T, out_local], through the kernel dispatch point (a direct call:
        routing a packed weight through F.linear's __torch_function__ adds Python dispatch to every
        call; docs/bench/code-figures.md)."""
        return kernels.linear(x, self.weight, bias)


class ColumnParallelLinear(LinearBase):
    """Output features split across ranks; each rank returns its slice (no collective)."""

    def __init__(self, input_size: int, output_size: int, *, bias: bool, parallel: ParallelState = ParallelState(),
                 dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cpu") -> None:
        out_local = _divide(output_size, parallel.tp_size, "output size")
        super().__init__(input_size, out_local, bias=bias, parallel=parallel, dtype=dtype, device=device)
        self._load = _shard_loader(0, parallel.tp_rank, output_size)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None) -> None:
        self._load(param, loaded_weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] -> [T, out / tp]."""
        return self.matmul(x, self.bias)


class MergedColumnParallelLinear(LinearBase):
    """Several column-parallel outputs packed along dim 0 (gate_up: shard ids 0, 1), each split per rank."""

    def __init__(self, input_size: int, output_sizes: Sequence[int], *, bias: bool,
                 parallel: ParallelState = ParallelState(), dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str = "cpu") -> None:
        self.output_sizes = list(output_sizes)
        local = [_divide(n, parallel.tp_size, "output size") for n in self.output_sizes]
        super().__init__(input_size, sum(local), bias=bias, parallel=parallel, dtype=dtype, device=device,
                         shard_ids=tuple(range(len(local))))

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None) -> None:
        if shard_id not in range(len(self.output_sizes)):
            raise ValueError(f"unknown shard id {shard_id!r}")
        _check_full_size(loaded_weight, 0, self.output_sizes[shard_id])
        tp = self.parallel.tp_size
        offset = sum(self.output_sizes[:shard_id]) // tp
        size = self.output_sizes[shard_id] // tp
        dst = param.data.narrow(0, offset, size)
        src = loaded_weight.narrow(0, self.parallel.tp_rank * size, size)
        _check_shape(dst, src)
        dst.copy_(src)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] -> [T, sum(output_sizes) / tp], this rank's slices in shard order."""
        return self.matmul(x, self.bias)


class QKVParallelLinear(LinearBase):
    """Packed q, k, v projections (shard ids "q", "k", "v"). Query heads are split across ranks; KV heads
    too, or replicated when there are fewer KV heads than ranks, so each rank's queries see their KV head."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, *, bias: bool,
                 parallel: ParallelState = ParallelState(), dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str = "cpu") -> None:
        tp, rank = parallel.tp_size, parallel.tp_rank
        self.head_dim = head_dim
        self.total_heads, self.total_kv_heads = num_heads, num_kv_heads
        self.num_heads = _divide(num_heads, tp, "number of attention heads")
        if num_kv_heads >= tp:
            self.num_kv_heads = _divide(num_kv_heads, tp, "number of KV heads")
            self.kv_head_start = rank * self.num_kv_heads
        else:
            replicas = _divide(tp, num_kv_heads, "tensor-parallel size over KV heads")
            self.num_kv_heads = 1
            self.kv_head_start = rank // replicas
        out_local = (self.num_heads + 2 * self.num_kv_heads) * head_dim
        super().__init__(hidden_size, out_local, bias=bias, parallel=parallel, dtype=dtype, device=device,
                         shard_ids=("q", "k", "v"))

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None) -> None:
        d = self.head_dim
        q_size, kv_size = self.num_heads * d, self.num_kv_heads * d
        if shard_id == "q":
            _check_full_size(loaded_weight, 0, self.total_heads * d)
            offset, src_start, size = 0, self.parallel.tp_rank * q_size, q_size
        elif shard_id in ("k", "v"):
            _check_full_size(loaded_weight, 0, self.total_kv_heads * d)
            offset = q_size if shard_id == "k" else q_size + kv_size
            src_start, size = self.kv_head_start * d, kv_size
        else:
            raise ValueError(f"unknown shard id {shard_id!r}")
        dst = param.data.narrow(0, offset, size)
        src = loaded_weight.narrow(0, src_start, size)
        _check_shape(dst, src)
        dst.copy_(src)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] -> [T, (heads + 2 * kv_heads) * head_dim] (local heads: q, then k, then v)."""
        return self.matmul(x, self.bias)


class RowParallelLinear(LinearBase):
    """Input features split across ranks; partial outputs are summed with an all-reduce.
    The bias is replicated and added on rank 0 only, so it is counted once."""

    def __init__(self, input_size: int, output_size: int, *, bias: bool, parallel: ParallelState = ParallelState(),
                 dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cpu") -> None:
        in_local = _divide(input_size, parallel.tp_size, "input size")
        super().__init__(in_local, output_size, bias=bias, parallel=parallel, dtype=dtype, device=device)
        self._load = _shard_loader(1, parallel.tp_rank, input_size)
        self._adds_bias = parallel.tp_rank == 0

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None) -> None:
        self._load(param, loaded_weight)

    def bias_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None) -> None:
        default_weight_loader(param, loaded_weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in / tp] -> [T, out], summed over ranks."""
        y = self.matmul(x, self.bias if self._adds_bias else None)
        return self.parallel.all_reduce(y)


class VocabParallelEmbedding(nn.Module):
    """Vocabulary rows split across ranks (the last shard zero-padded when tp does not divide it).
    Each rank looks up the tokens it owns, zeroes the rest, and the all-reduce sums the rows."""

    def __init__(self, num_embeddings: int, embedding_dim: int, *, parallel: ParallelState = ParallelState(),
                 dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.parallel = parallel
        self.num_embeddings = num_embeddings
        self.rows_per_rank = -(-num_embeddings // parallel.tp_size)
        self.vocab_start = parallel.tp_rank * self.rows_per_rank
        self.weight = _new_param((self.rows_per_rank, embedding_dim), dtype, device, self.weight_loader, (None,))

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None) -> None:
        _check_full_size(loaded_weight, 0, self.num_embeddings)
        rows = max(0, min(self.rows_per_rank, self.num_embeddings - self.vocab_start))
        src = loaded_weight.narrow(0, self.vocab_start, rows)
        _check_shape(param.data[:rows], src)
        param.data[:rows].copy_(src)
        param.data[rows:].zero_()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [T] int64 -> [T, embedding_dim]."""
        if self.parallel.tp_size == 1:
            return F.embedding(tokens, self.weight)
        local = tokens - self.vocab_start  # [T]
        owned = (local >= 0) & (local < self.rows_per_rank)  # [T]
        rows = F.embedding(local * owned, self.weight) * owned.unsqueeze(-1)  # [T, dim]
        return self.parallel.all_reduce(rows)


class ParallelLMHead(VocabParallelEmbedding):
    """Output projection with the vocabulary split across ranks; the logits are all-gathered.
    Shares its weight with the embedding when the checkpoint ties them (same sharding)."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, dim] -> logits [T, num_embeddings] in the weight dtype."""
        logits = kernels.linear(hidden, self.weight)  # [T, rows_per_rank]
        if self.parallel.tp_size == 1:
            return logits
        return self.parallel.all_gather_last(logits)[:, : self.num_embeddings]
