"""Self-attention of one decoder layer: fused qkv -> RoPE at explicit positions -> cache write -> masked SDPA.

The mask decides everything about who sees whom, so the same code serves prefill (causal mask),
decode (one row) and a token tree (ancestor mask over a cached prefix).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from swiftspec.cache.kv_cache import KVCache
from swiftspec.model.args import ModelArgs
from swiftspec.model.layers import RopeAngles, apply_rope
from swiftspec.parallel.linear import QKVParallelLinear, RowParallelLinear
from swiftspec.parallel.state import ParallelState


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

    def forward(self, x: torch.Tensor, rope: RopeAngles, cache: KVCache, slots: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        """x [T, hidden], slots [T] int64, mask [T, S] bool (True = may attend) -> [T, hidden].

        Writes this call's K/V at `slots` first, so a token may attend to itself and to any other
        token of the same call; every slot it attends to must be < S = mask.shape[1].
        """
        num_tokens = x.shape[0]
        heads, kv_heads = self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x).view(num_tokens, heads + 2 * kv_heads, self.head_dim)
        # q and k are adjacent in the packed output: one rotation covers both
        qk = apply_rope(qkv[:, : heads + kv_heads], rope)  # [T, heads + kv_heads, D]
        q, k = qk.split((heads, kv_heads), dim=1)
        v = qkv[:, heads + kv_heads :]  # [T, kv_heads, D]
        cache.write(self.layer_idx, slots, k, v)
        kv = cache.view(self.layer_idx, mask.shape[1])  # [S, kv_heads, D] each
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), kv.k.transpose(0, 1), kv.v.transpose(0, 1), attn_mask=mask,
            enable_gqa=heads != kv_heads,
        )  # [heads, T, D]
        return self.o_proj(out.transpose(0, 1).reshape(num_tokens, heads * self.head_dim))
