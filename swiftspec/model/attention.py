"""Self-attention of one decoder layer: fused qkv -> RoPE at explicit positions -> cache write -> masked SDPA.

The mask decides everything about who sees whom, so the same code serves prefill (causal mask),
decode (one row) and a token tree (ancestor mask over a cached prefix).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

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
        # q and k are adjacent in the packed output: one rotation covers both
        qk = apply_rope(qkv[:, : heads + kv_heads], inputs.rope)  # [T, heads + kv_heads, D]
        q, k = qk.split((heads, kv_heads), dim=1)
        v = qkv[:, heads + kv_heads :]  # [T, kv_heads, D]
        cache.write(self.layer_idx, inputs.slots, k, v)
        kv = cache.view(self.layer_idx, inputs.row_mask.shape[1])  # [S, kv_heads, D] each
        out = grouped_attention(q, kv.k, kv.v, inputs.row_mask)  # [T, heads, D]
        return self.o_proj(out.reshape(num_tokens, heads * self.head_dim))


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, row_mask: torch.Tensor) -> torch.Tensor:
    """Masked softmax attention of q [T, heads, D] over k, v [S, kv_heads, D] -> [T, heads, D].
    row_mask [group * T, S] bool is the [T, S] mask repeated per group member (AttentionInputs.build).

    Query head h reads KV head h // group (HF's repeat_kv order). The `group` query heads that
    share a KV head are stacked as extra query rows ([kv_heads, group * T, D]), so each KV head is
    streamed once per call instead of once per query head: SDPA on CPU costs per (batch*head) pass.
    """
    num_tokens, heads, head_dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    rows = q.view(num_tokens, kv_heads, group, head_dim).permute(1, 2, 0, 3)  # [kv_heads, group, T, D]
    rows = rows.reshape(kv_heads, group * num_tokens, head_dim)  # row i * T + t: head h * group + i, token t
    # 4-D inputs select the CPU flash kernel; 3-D ones fall back to the math path (fp32 copies of K/V)
    out = F.scaled_dot_product_attention(
        rows[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], attn_mask=row_mask
    )[0]  # [kv_heads, group * T, D]
    out = out.view(kv_heads, group, num_tokens, head_dim).permute(2, 0, 1, 3)  # [T, kv_heads, group, D]
    return out.reshape(num_tokens, heads, head_dim)
