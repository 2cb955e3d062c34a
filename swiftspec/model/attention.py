"""Self-attention of one decoder layer: fused qkv -> RoPE at explicit positions -> cache write -> masked SDPA.

The mask decides everything about who sees whom, so the same code serves prefill (causal mask),
decode (one row) and a token tree (ancestor mask over a cached prefix).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from swiftspec import kernels
from swiftspec.cache.kv_cache import KVCache
from swiftspec.model.args import ModelArgs
from swiftspec.model.layers import RopeAngles, apply_rope
from swiftspec.parallel.linear import QKVParallelLinear, RowParallelLinear
from swiftspec.parallel.state import ParallelState


@dataclass(frozen=True, slots=True)
class AttentionInputs:
    """What every layer's attention needs from one forward call; built once by the Transformer."""

    rope: RopeAngles  # rotation of each of the T tokens
    slots: torch.Tensor  # [T] int64: cache slots receiving this call's K/V
    row_mask: torch.Tensor  # [group * T, S] bool: the caller's [T, S] mask, repeated per query head of a KV group

    @classmethod
    def build(cls, rope: RopeAngles, slots: torch.Tensor, mask: torch.Tensor, group: int) -> "AttentionInputs":
        """mask [T, S] bool (True = may attend); group = query heads per KV head on this rank."""
        return cls(rope=rope, slots=slots, row_mask=mask if group == 1 else mask.repeat(group, 1))


class Attention(nn.Module):
    """Grouped-query attention over this rank's heads, reading and writing layer `layer_idx` of the cache."""

    def __init__(self, args: ModelArgs, layer_idx: int, parallel: ParallelState,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.qkv_proj = QKVParallelLinear(
            args.hidden_size, args.head_dim, args.num_heads, args.num_kv_heads, bias=args.qkv_bias,
            parallel=parallel, dtype=dtype, device=device,
        )
        self.o_proj = RowParallelLinear(
            args.num_heads * args.head_dim, args.hidden_size, bias=args.o_bias, parallel=parallel, dtype=dtype,
            device=device,
        )
        self.num_heads = self.qkv_proj.num_heads  # local to this rank
        self.num_kv_heads = self.qkv_proj.num_kv_heads  # local to this rank
        self.head_dim = args.head_dim

    def forward(self, x: torch.Tensor, inputs: AttentionInputs, cache: KVCache) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden].

        Writes this call's K/V at inputs.slots first, so a token may attend to itself and to any
        other token of the same call; every attended slot must be < S = row_mask.shape[1].
        """
        num_tokens = x.shape[0]
        heads, kv_heads = self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x).view(num_tokens, heads + 2 * kv_heads, self.head_dim)
        if kernels.use_triton(qkv):
            return self.o_proj(self._fused_attention(qkv, inputs, cache).reshape(num_tokens, heads * self.head_dim))
        # q and k are adjacent in the packed output: one rotation covers both
        qk = apply_rope(qkv[:, : heads + kv_heads], inputs.rope)  # [T, heads + kv_heads, D]
        q, k = qk.split((heads, kv_heads), dim=1)
        v = qkv[:, heads + kv_heads :]  # [T, kv_heads, D]
        cache.write(self.layer_idx, inputs.slots, k, v)
        kv = cache.view(self.layer_idx, inputs.row_mask.shape[1])  # [S, kv_heads, D] each
        out = kernels.attention(q, kv.k, kv.v, inputs.row_mask)  # [T, heads, D]
        return self.o_proj(out.reshape(num_tokens, heads * self.head_dim))

    def _fused_attention(self, qkv: torch.Tensor, inputs: AttentionInputs, cache: KVCache) -> torch.Tensor:
        """qkv [T, heads + 2 * kv_heads, D] -> [T, heads, D] on CUDA with Triton: keys are rotated
        here and cached rotated, queries are rotated inside kernels.tree_attention."""
        heads, kv_heads = self.num_heads, self.num_kv_heads
        k = apply_rope(qkv[:, heads : heads + kv_heads], inputs.rope)  # [T, kv_heads, D]
        cache.write(self.layer_idx, inputs.slots, k, qkv[:, heads + kv_heads :])
        kv = cache.view(self.layer_idx, cache.max_len)  # [max_len, kv_heads, D]; the mask bounds the reads
        mask = inputs.row_mask[: qkv.shape[0]]  # [T, S]: the first block of the per-group repeat
        rope = inputs.rope
        return kernels.tree_attention(qkv[:, :heads], kv.k, kv.v, mask, rope.cos[:, 0], rope.sin[:, 0])

