"""Static, preallocated key/value cache of one sequence: slot-addressed writes, prefix views, slot moves.

A slot is a row index into the cache. The model writes each token's K/V at the slot it is given and
attends over the prefix [0, S) of slots; which slots hold which tokens is decided by the caller
(tree commit/compaction is built on `move`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class LayerKV:
    """Views (no copies) of one layer's cached keys and values over slots [0, length)."""

    k: torch.Tensor  # [length, num_kv_heads, head_dim]
    v: torch.Tensor  # [length, num_kv_heads, head_dim]


class KVCache:
    """K and V tensors of shape [num_layers, max_len, num_kv_heads, head_dim], allocated once."""

    def __init__(
        self,
        num_layers: int,
        max_len: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (num_layers, max_len, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [L, max_len, Hkv, D]
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # [L, max_len, Hkv, D]
        self.num_layers = num_layers
        self.max_len = max_len
        # per-layer views made once: indexing a layer costs a Python-level op per call otherwise
        self._k_layers = self.k.unbind(0)  # num_layers x [max_len, Hkv, D]
        self._v_layers = self.v.unbind(0)  # num_layers x [max_len, Hkv, D]

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v [T, Hkv, D] of layer `layer` at `slots` [T] int64 (distinct slots)."""
        self._k_layers[layer].index_copy_(0, slots, k)
        self._v_layers[layer].index_copy_(0, slots, v)

    def view(self, layer: int, length: int) -> LayerKV:
        """Keys and values of layer `layer` over slots [0, length), as views."""
        return LayerKV(k=self._k_layers[layer][:length], v=self._v_layers[layer][:length])

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy slots src [n] int64 to slots dst [n] int64 in every layer at once.

        All sources are gathered before any destination is written, so overlapping ranges
        (e.g. compacting slots [5, 9) onto [3, 7)) are correct. Destinations must be distinct.
        """
        for cache in (self.k, self.v):
            gathered = cache.index_select(1, src)  # [L, n, Hkv, D], a copy
            cache.index_copy_(1, dst, gathered)
