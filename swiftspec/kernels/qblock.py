"""GGUF block weights run as stored: Q8_0, Q5_0 and Q4_0 blocks of 32 k repacked (losslessly) for
the C++ kernel in csrc/qblock_*.cpp, their dequantization and the kernel's torch reference.

A channel's block of 32 k is w[k] = d * q[k], d fp16 and q a signed integer: Q8_0 stores d and 32
int8 q (34 bytes); Q5_0 d, the fifth bits (4 bytes) and 16 bytes of nibbles of u = q + 16 (22
bytes); Q4_0 d and the nibbles of u = q + 8 (18 bytes).  In fp32 d * q is exact (at most 11 + 8
significant bits), the product gguf.quants.dequantize forms, so ``dequantize_q`` returns the
file's values bit for bit.

Packed layout (T = ceil(N / 16) tiles of 16 channels, padded channels zero; see csrc/qblock.h):
``scale`` (d) fp16 [T, K/32, 16], and
- "q8_0": ``qweight`` the int8 q as bytes, uint8 [T, K/4, 16, 4] (4 consecutive k of a channel,
  the int8 format's order).  8.5 bits per weight, the file's.
- "q5_0", "q4_0": ``qweight`` the low 4 bits of u = q + 16 / q + 8 as int4's nibbles, uint8
  [T, K/8, 16, 4]; q5_0's ``kblocks.qh`` bit 4 of u, uint8 [T, K/32, 16, 4] (packed.tile_fields).
  5.5 and 4.5 bits per weight, the file's.
A fused linear takes the widest part's format (q4_0 < q5_0 < q8_0): the same q, another offset.

The kernel quantizes activations to int8 per 32 k (``quantize_act_ref(x, 32)``) and sums the
integer products exactly; ``quant_ref.quant_linear_a8_ref`` (group_size 32) is that math in torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from swiftspec.kernels import cpu_ext
from swiftspec.kernels.kquant import RawPart
from swiftspec.kernels.packed import TILE_N, PackedWeight, num_tiles, pad_rows, tile_fields, untile_fields

BLOCK = 32  # k per block: one fp16 scale
TYPES = ("Q8_0", "Q5_0", "Q4_0")  # the GGUF types held here
BLOCK_BYTES = {"Q8_0": 34, "Q5_0": 22, "Q4_0": 18}  # bytes per block in the file
BITS = {"Q8_0": 8, "Q5_0": 5, "Q4_0": 4}
FMTS = {8: "q8_0", 5: "q5_0", 4: "q4_0"}
OFFSET = {5: 16, 4: 8}  # u = q + OFFSET, unsigned
CHUNK_ROWS = 4096  # rows decoded at a time: bounds the temporaries


@dataclass(frozen=True)
class HighBits:
    """q5_0's part of a PackedWeight beyond qweight (nibbles) and scale (d)."""

    qh: torch.Tensor  # uint8 [T, K/32, 16, 4]

    @property
    def nbytes(self) -> int:
        return self.qh.numel()


def decode(raw: np.ndarray, qtype: str, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """raw: `rows` rows of a qtype tensor's blocks -> (q [rows, K] int8 signed, d [rows, K/32] fp16)."""
    blk = np.ascontiguousarray(raw).reshape(-1, BLOCK_BYTES[qtype])
    d = blk[:, :2].copy().view(np.float16).reshape(rows, -1)
    if qtype == "Q8_0":
        return blk[:, 2:].copy().view(np.int8).reshape(rows, -1), d
    qs = blk[:, -16:]
    u = np.concatenate([qs & 15, qs >> 4], axis=1)  # element l < 16: low nibble of byte l, else high of l - 16
    if qtype == "Q5_0":  # element l: bit l of the little-endian 32-bit qh
        u |= np.unpackbits(blk[:, 2:6], axis=1, bitorder="little") << 4
    q = u.astype(np.int8) - np.int8(OFFSET[BITS[qtype]])
    return q.reshape(rows, -1), d


def dequantize_blocks(raw: np.ndarray, qtype: str, dtype: torch.dtype) -> torch.Tensor:
    """raw: rows of blocks [rows, K/32 * block bytes] -> the [rows, K] weight in dtype: gguf-py's
    fp32 values bit for bit, rounded once to dtype.  In C++ where this process has loaded the
    kernels (csrc/qblock_dequant.cpp, rows in parallel: ~3x faster), else in numpy, CHUNK_ROWS rows
    at a time (the same values)."""
    ext = cpu_ext.loaded()
    if ext is not None and dtype in (torch.float32, torch.bfloat16, torch.float16):
        # the file's bytes are copied once: a read-only memory map makes no tensor
        return ext.qblock_dequantize(torch.from_numpy(np.array(raw, dtype=np.uint8)), BITS[qtype], dtype)
    return dequantize_blocks_np(raw, qtype, dtype)


def dequantize_blocks_np(raw: np.ndarray, qtype: str, dtype: torch.dtype) -> torch.Tensor:
    """dequantize_blocks in numpy."""
    rows = len(raw)
    k = raw.shape[1] // BLOCK_BYTES[qtype] * BLOCK
    out = torch.empty(rows, k, dtype=dtype)
    for r0 in range(0, rows, CHUNK_ROWS):
        q, d = decode(raw[r0 : r0 + CHUNK_ROWS], qtype, min(CHUNK_ROWS, rows - r0))
        w = np.multiply(q.reshape(len(q), -1, BLOCK), d.astype(np.float32)[..., None], dtype=np.float32)
        out[r0 : r0 + len(q)] = torch.from_numpy(w.reshape(len(q), k))
    return out


@dataclass
class Tiles:
    """One chunk's tiles in the packed layout (module docstring); qh is empty but for 5 bits."""

    q: torch.Tensor
    qh: torch.Tensor
    d: torch.Tensor


def _pack_chunk(q: np.ndarray, d: np.ndarray, bits: int) -> Tiles:
    """Rows of one chunk (a multiple of 16, or the last) -> its tiles."""
    tn = num_tiles(q.shape[0]) * TILE_N
    k = q.shape[1]
    d_t = pad_rows(d, tn).view(-1, TILE_N, k // BLOCK).permute(0, 2, 1)
    if bits == 8:
        q_t = pad_rows(q, tn).view(torch.uint8).view(-1, TILE_N, k // 4, 4).permute(0, 2, 1, 3)
        return Tiles(q_t, torch.empty(0, dtype=torch.uint8), d_t)
    u = pad_rows((q + OFFSET[bits]).astype(np.uint8), tn)
    qh = tile_fields(u >> 4, 1) if bits == 5 else torch.empty(0, dtype=torch.uint8)
    return Tiles(tile_fields(u & 15, 4), qh, d_t)


def from_gguf(parts: list[RawPart], k: int) -> PackedWeight:
    """Q8_0 / Q5_0 / Q4_0 tensors stacked along N (a fused qkv / gate_up, or one tensor) -> a
    PackedWeight of shape (sum of rows, k) in the widest part's format.  Every part but the last
    must have a multiple of 16 rows (tiles never straddle parts)."""
    if any(len(p.raw) % TILE_N for p in parts[:-1]):
        raise ValueError("from_gguf: fused parts must have multiples of 16 rows")
    bits = max(BITS[p.qtype] for p in parts)
    tiles = []
    for part in parts:
        rows = np.asarray(part.raw).reshape(len(part.raw), -1)
        for r0 in range(0, len(rows), CHUNK_ROWS):
            chunk = rows[r0 : r0 + CHUNK_ROWS]
            tiles.append(_pack_chunk(*decode(chunk, part.qtype, len(chunk)), bits))
    q, qh, d = (torch.cat([getattr(t, f) for t in tiles]).contiguous() for f in ("q", "qh", "d"))
    shape = (sum(len(p.raw) for p in parts), k)
    return PackedWeight(FMTS[bits], shape, BLOCK, q, d, kblocks=HighBits(qh) if bits == 5 else None)


def dequantize_q(qw: PackedWeight) -> torch.Tensor:
    """The fp32 [N, K] weight: d * q per block, the file's values bit for bit."""
    n, k = qw.shape
    t = qw.qweight.shape[0]
    if qw.fmt == "q8_0":
        q = qw.qweight.view(torch.int8).permute(0, 2, 1, 3).reshape(t * TILE_N, k).float()
    else:
        u = untile_fields(qw.qweight, 4)
        if qw.fmt == "q5_0":
            u = u | (untile_fields(qw.kblocks.qh, 1) << 4)
        q = u.float() - OFFSET[5 if qw.fmt == "q5_0" else 4]
    d = qw.scale.permute(0, 2, 1).reshape(t * TILE_N, -1).float().repeat_interleave(BLOCK, 1)
    return (d * q)[:n]
