"""GGUF block weights run as stored: Q8_0 blocks of 32 k repacked (losslessly) for the C++ kernel in
csrc/qblock_*.cpp, their dequantization and the kernel's torch reference.

A channel's block of 32 k is w[k] = d * q[k], d fp16 and q a signed integer: Q8_0 stores d and 32
int8 q (34 bytes).  In fp32 d * q is exact (at most 11 + 8 significant bits), the product
gguf.quants.dequantize forms, so ``dequantize_q`` returns the file's values bit for bit.

Packed layout (T = ceil(N / 16) tiles of 16 channels, padded channels zero; see csrc/qblock.h):
"q8_0": ``qweight`` the int8 q as bytes, uint8 [T, K/4, 16, 4] (4 consecutive k of a channel, the
int8 format's order); ``scale`` (d) fp16 [T, K/32, 16].  Bytes per weight: 8.5, the file's.

The kernel quantizes activations to int8 per 32 k (``quantize_act_ref(x, 32)``) and sums the
integer products exactly; ``quant.quant_linear_a8_ref`` (group_size 32) is that math in torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from swiftspec.kernels.kquant import RawPart
from swiftspec.kernels.quant import TILE_N, PackedWeight, _tiles

BLOCK = 32  # k per block: one fp16 scale
TYPES = ("Q8_0",)  # the GGUF types held here
BLOCK_BYTES = {"Q8_0": 34}  # bytes per block in the file
CHUNK_ROWS = 4096  # rows decoded at a time: bounds the temporaries


@dataclass
class Decoded:
    """Blocks of rows decoded to integers: q [rows, K] int8 (signed), d [rows, K/32] fp16."""

    bits: int  # 8
    q: np.ndarray
    d: np.ndarray


def decode(raw: np.ndarray, qtype: str, rows: int) -> Decoded:
    """raw: `rows` rows of a Q8_0 tensor's blocks -> their integers."""
    blk = np.ascontiguousarray(raw).reshape(-1, BLOCK_BYTES[qtype])
    d = blk[:, :2].copy().view(np.float16).reshape(rows, -1)
    return Decoded(8, blk[:, 2:].copy().view(np.int8).reshape(rows, -1), d)


def dequantize_blocks(raw: np.ndarray, qtype: str, dtype: torch.dtype) -> torch.Tensor:
    """raw: rows of blocks [rows, K/32 * block bytes] -> the [rows, K] weight in dtype: gguf-py's
    fp32 values bit for bit, rounded once to dtype; decoded CHUNK_ROWS rows at a time."""
    rows = len(raw)
    k = raw.shape[1] // BLOCK_BYTES[qtype] * BLOCK
    out = torch.empty(rows, k, dtype=dtype)
    for r0 in range(0, rows, CHUNK_ROWS):
        dec = decode(raw[r0 : r0 + CHUNK_ROWS], qtype, min(CHUNK_ROWS, rows - r0))
        n = len(dec.q)
        w = np.multiply(dec.q.reshape(n, -1, BLOCK), dec.d.astype(np.float32)[..., None], dtype=np.float32)
        out[r0 : r0 + n] = torch.from_numpy(w.reshape(n, k))
    return out


def _pad_rows(a: np.ndarray, rows: int) -> torch.Tensor:
    out = np.zeros((rows, *a.shape[1:]), dtype=a.dtype)
    out[: a.shape[0]] = a
    return torch.from_numpy(out)


def _pack_chunk(dec: Decoded) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of one chunk (a multiple of 16, or the last) -> its q and d tiles."""
    tn = _tiles(dec.q.shape[0]) * TILE_N
    q, d = _pad_rows(dec.q, tn).view(torch.uint8), _pad_rows(dec.d, tn)
    k = q.shape[1]
    return q.view(-1, TILE_N, k // 4, 4).permute(0, 2, 1, 3), d.view(-1, TILE_N, k // BLOCK).permute(0, 2, 1)


def from_gguf(parts: list[RawPart], k: int) -> PackedWeight:
    """Q8_0 tensors stacked along N (a fused qkv / gate_up, or one tensor) -> a "q8_0"
    PackedWeight of shape (sum of rows, k).  Every part but the last must have a multiple of 16
    rows (tiles never straddle parts)."""
    if any(len(p.raw) % TILE_N for p in parts[:-1]):
        raise ValueError("from_gguf: fused parts must have multiples of 16 rows")
    q, d = [], []
    for part in parts:
        rows = np.asarray(part.raw).reshape(len(part.raw), -1)
        for r0 in range(0, len(rows), CHUNK_ROWS):
            chunk = rows[r0 : r0 + CHUNK_ROWS]
            qt, dt = _pack_chunk(decode(chunk, part.qtype, len(chunk)))
            q.append(qt)
            d.append(dt)
    shape = (sum(len(p.raw) for p in parts), k)
    return PackedWeight("q8_0", shape, BLOCK, torch.cat(q).contiguous(), torch.cat(d).contiguous())


def dequantize_q(qw: PackedWeight) -> torch.Tensor:
    """The fp32 [N, K] weight: d * q per block, the file's values bit for bit."""
    n, k = qw.shape
    t = qw.qweight.shape[0]
    q = qw.qweight.view(torch.int8).permute(0, 2, 1, 3).reshape(t * TILE_N, k).float()
    d = qw.scale.permute(0, 2, 1).reshape(t * TILE_N, -1).float().repeat_interleave(BLOCK, 1)
    return (d * q)[:n]
