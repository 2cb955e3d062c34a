"""Tensor parallelism: placement state, collectives and the parallel linear/embedding layers."""

from swiftspec.parallel.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from swiftspec.parallel.state import ParallelState

__all__ = [
    "ColumnParallelLinear",
    "MergedColumnParallelLinear",
    "ParallelLMHead",
    "ParallelState",
    "QKVParallelLinear",
    "RowParallelLinear",
    "VocabParallelEmbedding",
]
