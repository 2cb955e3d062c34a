"""Tree attention: masked GQA of new tokens over a cache layer, with RoPE of q inside the kernel.

`tree_attention_ref` (plain torch, the CPU path) and `tree_attention_triton` share one signature:

    q        [T, H, D]       queries of the T new tokens, NOT rotated (pre-RoPE)
    k_cache  [S_max, Hkv, D] one layer's keys, already rotated when they were written (each key is
                             rotated once, at write time, instead of once per reading query)
    v_cache  [S_max, Hkv, D] one layer's values
    mask     [T, S] bool     True = row t may attend to slot s; only slots [0, S) are read, so S may
                             be anything up to S_max (a CUDA graph pads it to S_max)
    cos, sin [T, D]          RoPE of each token in the half-split layout of model.layers.RopeAngles
                             (sin carries the sign: -sin on the first half, +sin on the second)
    -> out   [T, H, D]       in q's dtype; query head h reads KV head h // (H / Hkv) (HF order)

The mask may be non-square (T draft leaves against prefix + tree slots). A row with no True entry
gives zeros from the kernel (and from torch 2.13's CPU SDPA; other SDPA backends may give NaN);
the engines never produce one.

Kernel: one program per (KV head, block of query rows, KV split). The `group` query heads of a KV
head are stacked as extra rows (row r = token r // group, head kvh * group + r % group), so each K/V
tile is loaded once for the whole group. A program runs an online softmax over its KV range in
BLOCK_N tiles and skips tiles the mask hides from all its rows (with S padded to S_max that keeps
the cost proportional to the live slots). With several splits, each writes a normalised partial
output and its log-sum-exp, and a second small kernel merges the splits (flash-decoding).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from swiftspec.kernels.triton_support import cdiv, jit, next_power_of_2

tl = None  # triton.language, bound by triton_support.jit when a kernel here is first built

BLOCK_N = 64  # KV slots per tile
MAX_SPLITS = 32  # also the combine kernel's lane count, so it compiles once
LOG2E = 1.4426950408889634


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


def tree_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, mask: torch.Tensor,
                       cos: torch.Tensor, sin: torch.Tensor, *, num_splits: int | None = None) -> torch.Tensor:
    """The plain-torch definition (module docstring for shapes): rotate q as model.layers.apply_rope
    does, then grouped_attention over slots [0, S). num_splits only tunes the kernel."""
    q = q * cos[:, None] + q.roll(q.shape[-1] // 2, dims=-1) * sin[:, None]  # [T, H, D]
    length = mask.shape[1]
    group = q.shape[1] // k_cache.shape[1]
    row_mask = mask if group == 1 else mask.repeat(group, 1)  # [group * T, S]
    return grouped_attention(q, k_cache[:length], v_cache[:length], row_mask)


def tree_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, mask: torch.Tensor,
                          cos: torch.Tensor, sin: torch.Tensor, *, num_splits: int | None = None) -> torch.Tensor:
    """The Triton kernel (module docstring for shapes). num_splits: KV splits (default: enough
    programs to fill the GPU). Needs D a power of two and unit stride along D in every input."""
    num_tokens, heads, head_dim = q.shape
    kv_heads, length = k_cache.shape[1], mask.shape[1]
    group = heads // kv_heads
    rows = num_tokens * group  # stacked query rows per KV head
    block_m = max(16, min(64, next_power_of_2(rows)))
    row_blocks = cdiv(rows, block_m)
    kv_blocks = max(1, cdiv(length, BLOCK_N))
    splits = min(num_splits or _default_splits(q.device, kv_heads * row_blocks, kv_blocks), kv_blocks, MAX_SPLITS)
    per_split = cdiv(kv_blocks, splits) * BLOCK_N  # slots per split, whole tiles
    splits = cdiv(max(length, 1), per_split)
    out = q.new_empty((num_tokens, heads, head_dim))  # [T, H, D] contiguous
    # one split writes the output itself; several write fp32 partials that _combine_kernel merges
    partial = out[None] if splits == 1 else q.new_empty((splits, num_tokens, heads, head_dim), dtype=torch.float32)
    lse = q.new_empty((splits, num_tokens, heads), dtype=torch.float32)  # log2-sum-exp2 of each split
    mask_u8 = mask.view(torch.uint8)  # [T, S], the same bytes
    jit(_tree_attn_kernel, ("T", "S", "kv_per_split", "stride_mt"))[(kv_heads, row_blocks, splits)](
        q, k_cache, v_cache, mask_u8, cos, sin, partial, lse,
        num_tokens, length, group, per_split, LOG2E / math.sqrt(head_dim),
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        mask_u8.stride(0), cos.stride(0), sin.stride(0),
        HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=BLOCK_N,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    if splits > 1:
        jit(_combine_kernel, ("rows", "splits"))[(num_tokens * heads,)](
            partial, lse, out, num_tokens * heads, splits, HEAD_DIM=head_dim, SPLITS=MAX_SPLITS,
        )
    return out


def _tree_attn_kernel(
    Q, K, V, Mask, Cos, Sin, Out, Lse,  # Out [splits, T, H, D] and Lse [splits, T, H], contiguous
    T, S, group, kv_per_split, qk_scale,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_mt, stride_ct, stride_st,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Program (KV head, row block, split): online softmax of its rows over its KV slot range."""
    kvh, split = tl.program_id(0), tl.program_id(2)
    heads = tl.num_programs(0) * group
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] stacked (token, member) rows
    row_ok = (rows < T * group)[:, None]  # [BLOCK_M, 1]
    tok = (rows // group)[:, None]  # [BLOCK_M, 1]
    head = kvh * group + (rows % group)[:, None]  # [BLOCK_M, 1]
    dim = tl.arange(0, HEAD_DIM)[None, :]  # [1, D]
    # RoPE in registers: q * cos + rotate_half(q) * sin, the partner lane is (d + D/2) mod D
    q_ptr = Q + tok * stride_qt + head * stride_qh
    q = tl.load(q_ptr + dim, mask=row_ok, other=0.0).to(tl.float32)
    q_partner = tl.load(q_ptr + (dim + HEAD_DIM // 2) % HEAD_DIM, mask=row_ok, other=0.0).to(tl.float32)
    cos = tl.load(Cos + tok * stride_ct + dim, mask=row_ok, other=0.0).to(tl.float32)
    sin = tl.load(Sin + tok * stride_st + dim, mask=row_ok, other=0.0).to(tl.float32)
    q = ((q * cos + q_partner * sin) * qk_scale).to(K.dtype.element_ty)  # [BLOCK_M, D], log2 units
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    start = split * kv_per_split
    end = tl.minimum(start + kv_per_split, S)
    for n0 in range(start, end, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)  # [BLOCK_N] slots
        col_ok = cols[:, None] < end  # [BLOCK_N, 1]
        seen = tl.load(Mask + tok * stride_mt + cols[None, :], mask=row_ok & (cols[None, :] < end), other=0) != 0
        if tl.max(seen.to(tl.int32)) > 0:  # skip tiles that no row of this block may see
            k = tl.load(K + cols[:, None] * stride_kt + kvh * stride_kh + dim, mask=col_ok, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # [BLOCK_M, BLOCK_N]
            s = tl.where(seen, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that have seen nothing yet
            p = tl.exp2(s - m_use[:, None])
            alpha = tl.exp2(m_i - m_use)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(V + cols[:, None] * stride_vt + kvh * stride_vh + dim, mask=col_ok, other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m_i = m_new
    l_use = tl.where(l_i == 0.0, 1.0, l_i)  # a row that saw nothing yields zeros
    out_row = (split * T + tok) * heads + head  # [BLOCK_M, 1] row of [splits * T * H, D]
    tl.store(Out + out_row * HEAD_DIM + dim, (acc / l_use[:, None]).to(Out.dtype.element_ty), mask=row_ok)
    lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log2(l_use))  # [BLOCK_M]
    tl.store(Lse + tl.reshape(out_row, [BLOCK_M]), lse, mask=tl.reshape(row_ok, [BLOCK_M]))


def _combine_kernel(Part, Lse, Out, rows, splits, HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr):
    """Program r merges row r of [T * H] over the splits: weights exp2(lse_s - max lse)."""
    row = tl.program_id(0)
    split = tl.arange(0, SPLITS)  # [SPLITS]
    lse = tl.load(Lse + split * rows + row, mask=split < splits, other=float("-inf"))
    top = tl.max(lse, 0)
    weight = tl.exp2(lse - tl.where(top == float("-inf"), 0.0, top))  # [SPLITS], 0 for empty splits
    dim = tl.arange(0, HEAD_DIM)
    part = tl.load(Part + (split * rows + row)[:, None] * HEAD_DIM + dim[None, :],
                   mask=(split < splits)[:, None], other=0.0)  # [SPLITS, D]
    total = tl.sum(weight, 0)
    out = tl.sum(part * weight[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(Out + row * HEAD_DIM + dim, out.to(Out.dtype.element_ty))


@functools.cache
def _sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (1 elsewhere: the interpreter runs serially)."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def _default_splits(device: torch.device, grid_rows: int, kv_blocks: int) -> int:
    """KV splits so that about one program per SM runs, at least two KV tiles per split."""
    wanted = cdiv(_sm_count(device), grid_rows)
    return max(1, min(MAX_SPLITS, wanted, kv_blocks // 2))
