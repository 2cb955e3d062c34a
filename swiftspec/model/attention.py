"""Self-attention of one decoder layer: fused qkv -> RoPE at explicit positions -> cache write -> masked SDPA.

The mask decides everything about who sees whom, so the same code serves prefill (causal mask),
decode (one row) and a token tree (ancestor mask over a cached prefix).  A sliding-window layer
keeps only each row's last `window` attended slots (sliding_mask).  Llama/Qwen2 layers run the
kernels (C++ on CPU, Triton on CUDA); a layer with q/k norms, a non-default scale, soft-capping or
a second RoPE (Qwen3, Gemma) runs `_featured`, whose soft-capped scores are computed in torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from swiftspec import kernels
from swiftspec.cache.kv_cache import KVCache
from swiftspec.model.args import ModelArgs
from swiftspec.model.layers import GemmaRMSNorm, RMSNorm, RopeAngles, apply_rope
from swiftspec.parallel.linear import QKVParallelLinear, RowParallelLinear
from swiftspec.parallel.state import ParallelState


@dataclass(frozen=True, slots=True)
class AttentionInputs:
    """What every layer's attention needs from one forward call; built once by the Transformer."""

    rope: RopeAngles  # rotation of each of the T tokens
    slots: torch.Tensor  # [T] int64: cache slots receiving this call's K/V
    row_mask: torch.Tensor  # [group * T, S] bool: the caller's [T, S] mask, repeated per query head of a KV group
    window_mask: torch.Tensor | None = None  # [group * T, S] bool: row_mask of the sliding layers, if some slide
    local_rope: RopeAngles | None = None  # Gemma 3: the sliding layers' rotation

    @classmethod
    def build(cls, rope: RopeAngles, slots: torch.Tensor, mask: torch.Tensor, group: int, *,
              window_mask: torch.Tensor | None = None, local_rope: RopeAngles | None = None) -> "AttentionInputs":
        """mask, window_mask [T, S] bool (True = may attend); group = query heads per KV head on this rank."""
        return cls(rope=rope, slots=slots, row_mask=_repeat(mask, group),
                   window_mask=None if window_mask is None else _repeat(window_mask, group), local_rope=local_rope)


def _repeat(mask: torch.Tensor, group: int) -> torch.Tensor:
    return mask if group == 1 else mask.repeat(group, 1)


def sliding_mask(mask: torch.Tensor, window: int) -> torch.Tensor:
    """mask [T, S] bool -> the mask keeping only each row's last `window` attended slots.

    That is HF's sliding window (a query sees keys less than `window` positions back, itself
    included) because every caller keeps a row's attended slots in position order: the prefix in
    order, then tree nodes whose ancestors sit at lower slots (cache/tree_kv.py)."""
    if window >= mask.shape[1]:
        return mask
    after = mask.flip(-1).cumsum(-1).flip(-1)  # [T, S]: attended slots at or after each slot
    return mask & (after <= window)


def softcap_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float,
                      cap: float) -> torch.Tensor:
    """Gemma 2's attention: softmax(cap * tanh(q k^T * scale / cap)) v in float32, for q [T, H, D],
    k, v [S, Hkv, D] and mask [T, S] bool -> [T, H, D] (no kernel soft-caps, so this is torch)."""
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)  # [S, H, D]: query head h reads KV head h // group
    v = v.float().repeat_interleave(group, dim=1)  # [S, H, D]
    scores = torch.einsum("thd,shd->hts", q.float(), k) * scale  # [H, T, S]
    scores = torch.tanh(scores / cap) * cap
    probs = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)  # [H, T, S]
    return torch.einsum("hts,shd->thd", probs, v).to(q.dtype)


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
        self.plain = args.plain
        self.slides = args.slides(layer_idx)
        self.local = self.slides and args.local_rope_theta is not None  # Gemma 3's sliding layers
        self.softcap = args.attn_softcap
        self.scale = (args.query_pre_attn_scalar or args.head_dim) ** -0.5
        self.qk_norm = args.qk_norm
        if args.qk_norm:
            norm = GemmaRMSNorm if args.gemma else RMSNorm
            self.q_norm = norm(args.head_dim, args.rms_norm_eps, dtype, device)
            self.k_norm = norm(args.head_dim, args.rms_norm_eps, dtype, device)

    def forward(self, x: torch.Tensor, inputs: AttentionInputs, cache: KVCache) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden].

        Writes this call's K/V at inputs.slots first, so a token may attend to itself and to any
        other token of the same call; every attended slot must be < S = row_mask.shape[1].
        """
        num_tokens = x.shape[0]
        heads, kv_heads = self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x).view(num_tokens, heads + 2 * kv_heads, self.head_dim)
        if not self.plain:
            return self.o_proj(self._featured(qkv, inputs, cache).reshape(num_tokens, heads * self.head_dim))
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

    def _featured(self, qkv: torch.Tensor, inputs: AttentionInputs, cache: KVCache) -> torch.Tensor:
        """qkv [T, heads + 2 * kv_heads, D] -> [T, heads, D] for Qwen3 and Gemma layers: q/k norms
        before RoPE, the layer's own RoPE and window, the scale, and soft-capping where set."""
        num_tokens, heads, kv_heads = qkv.shape[0], self.num_heads, self.num_kv_heads
        q, k, v = qkv.split((heads, kv_heads, kv_heads), dim=1)  # [T, heads | kv_heads, D]
        if self.qk_norm:
            q = self.q_norm(q.reshape(-1, self.head_dim)).view(num_tokens, heads, self.head_dim)
            k = self.k_norm(k.reshape(-1, self.head_dim)).view(num_tokens, kv_heads, self.head_dim)
        rope = inputs.local_rope if self.local else inputs.rope
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        cache.write(self.layer_idx, inputs.slots, k, v)
        row_mask = inputs.window_mask if self.slides and inputs.window_mask is not None else inputs.row_mask
        kv = cache.view(self.layer_idx, row_mask.shape[1])  # [S, kv_heads, D] each
        if self.softcap is not None:
            return softcap_attention(q, kv.k, kv.v, row_mask[:num_tokens], self.scale, self.softcap)
        if self.scale != self.head_dim**-0.5:  # the kernels scale by head_dim ** -0.5
            q = q * (self.scale * math.sqrt(self.head_dim))
        return kernels.attention(q, kv.k, kv.v, row_mask)  # [T, heads, D]

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

