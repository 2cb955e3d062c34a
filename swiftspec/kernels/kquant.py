"""GGUF K-quant weights run as stored: Q4_K, Q5_K and Q6_K super-blocks repacked (losslessly) for
the C++ kernels in csrc/kquant_*.cpp, their dequantization and the kernel's torch reference.

A channel's super-block of 256 k is w[k] = d * sc[j] * q[k] + dm * mm[j] for k in sub-block j:
- Q4_K ("q4k", 4 bits, 8 sub-blocks of 32): q in 0..15, sc and mm the 6-bit scale and min,
  d the block scale, dm = -dmin.
- Q5_K ("q5k", 5 bits): Q4_K with q in 0..31.  A Q4_K tensor fused with a Q5_K one is held as 5 bits.
- Q6_K ("q6k", 6 bits, 16 sub-blocks of 16): w = d * sc * (q - 32), i.e. q in 0..63, sc the int8
  scale, dm = -32 d, mm = sc.  A Q4_K or Q5_K tensor fused with a Q6_K one (a qkv projection) is
  written in this layout too: its sub-blocks split in two halves with equal sc and mm, dm = -dmin.
In fp32 these are the products gguf.quants.dequantize forms, exactly (d * sc has at most 18
significant bits, times q at most 24), so ``dequantize`` returns the file's values bit for bit.

Packed layout (T = ceil(N / 16) tiles of 16 channels, padded channels zero; see csrc/kquant.h):
``qweight`` the low 4 bits of q, uint8 [T, K/8, 16, 4] as int4's nibbles; ``kblocks.qh`` the high
2 bits (6-bit), uint8 [T, K/16, 16, 4], or the fifth bit (5-bit), uint8 [T, K/32, 16, 4];
``kblocks.sc`` and ``kblocks.mm`` int8
[T, K/(2 sub), 16, 2] (sub-block pairs side by side; a pure Q6_K weight shares one tensor for
both); ``scale`` (d) and ``mins`` (dm) fp16 [T, K/256, 16].  Bytes per weight: 4.625 (q4k), 6.625
(q6k; 7.125 for a fused one holding Q4_K or Q5_K rows), 5.625 (q5k).

The kernel quantizes activations to int8 per 256 k (``quantize_act_ref(x, 256)``) and sums the
integer products exactly; ``quant_ref.quant_linear_a8_ref`` (group_size 256) is that math in torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from swiftspec.kernels import cpu_ext
from swiftspec.kernels.packed import TILE_N, PackedWeight, num_tiles, pad_rows, tile_fields, untile_fields

SUPER_K = 256
TYPES = ("Q4_K", "Q5_K", "Q6_K")  # the GGUF types held here
Q4K_BYTES, Q5K_BYTES, Q6K_BYTES = 144, 176, 210  # bytes per super-block in the file
BLOCK_BYTES = {"Q4_K": Q4K_BYTES, "Q5_K": Q5K_BYTES, "Q6_K": Q6K_BYTES}
BITS = {"Q4_K": 4, "Q5_K": 5, "Q6_K": 6}
FMTS = {4: "q4k", 5: "q5k", 6: "q6k"}
CHUNK_ROWS = 4096  # rows decoded at a time: bounds the temporaries


@dataclass(frozen=True)
class KBlocks:
    """The K-quant parts of a PackedWeight beyond qweight (low nibbles), scale (d), mins (dm)."""

    qh: torch.Tensor  # uint8 [T, K/16, 16, 4] (6-bit) or empty
    sc: torch.Tensor  # int8 [T, K/(2 sub), 16, 2]
    mm: torch.Tensor  # int8 [T, K/(2 sub), 16, 2]; pure Q6_K: sc itself

    @property
    def nbytes(self) -> int:
        parts = (self.qh, self.sc) if self.mm is self.sc else (self.qh, self.sc, self.mm)
        return sum(t.numel() * t.element_size() for t in parts)


@dataclass
class Decoded:
    """Super-blocks of rows decoded to integers: q [rows, K] uint8, sc and mm [rows, K/sub] int8
    (sub = 32 for 4 and 5 bits, 16 for 6), d and dm [rows, K/256] fp16."""

    bits: int
    q: np.ndarray
    sc: np.ndarray
    mm: np.ndarray
    d: np.ndarray
    dm: np.ndarray


def _decode_4or5(raw: np.ndarray, rows: int, bits: int) -> Decoded:
    """raw: a Q4_K (blocks of 144 bytes) or Q5_K (176: the fifth bits before the nibbles) tensor's
    bytes, rows x K/256 blocks -> its integers."""
    blk = np.ascontiguousarray(raw).reshape(-1, Q4K_BYTES if bits == 4 else Q5K_BYTES)
    d, dmin = blk[:, 0:2].copy().view(np.float16), blk[:, 2:4].copy().view(np.float16)
    s = blk[:, 4:16].reshape(-1, 3, 4)
    a, b, c = s[:, 0], s[:, 1], s[:, 2]  # sub-blocks 0-3 low 6 bits, 4-7 split (gguf get_scale_min)
    sc = np.concatenate([a & 63, (c & 15) | ((a >> 2) & 48)], axis=1)
    mn = np.concatenate([b & 63, (c >> 4) | ((b >> 2) & 48)], axis=1)
    qs = blk[:, -128:].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    q = (qs & 15).reshape(-1, 8, 32)  # 64-k chunk c: sub-block 2c low nibbles, 2c + 1 high
    if bits == 5:  # element l of sub-block j: bit j of qh[l]
        q = q | (((blk[:, 16:48, None] >> np.arange(8, dtype=np.uint8)) & 1).transpose(0, 2, 1) << 4)
    dm = -dmin
    return Decoded(bits, q.reshape(rows, -1), sc.astype(np.int8).reshape(rows, -1),
                   mn.astype(np.int8).reshape(rows, -1), d.reshape(rows, -1), dm.reshape(rows, -1))


def decode_q6k(raw: np.ndarray, rows: int) -> Decoded:
    """raw: a Q6_K tensor's bytes (rows x K/256 blocks of 210) -> its integers."""
    blk = np.ascontiguousarray(raw).reshape(-1, Q6K_BYTES)
    ql = blk[:, :128].reshape(-1, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    ql = (ql & 15).reshape(-1, 2, 4, 32)  # [half, quarter, l]: k = 128 half + 32 quarter + l
    qh = blk[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    q = (ql | ((qh & 3) << 4)).reshape(rows, -1)
    sc = blk[:, 192:208].copy().view(np.int8)
    d = blk[:, 208:210].copy().view(np.float16)
    dm = d.astype(np.float32) * -32.0
    if not np.isfinite(dm.astype(np.float16)).all():
        raise ValueError("Q6_K block scale too large for the packed -32 d (fp16)")
    sc = sc.reshape(rows, -1)
    return Decoded(6, q, sc, sc, d.reshape(rows, -1),
                   dm.astype(np.float16).reshape(rows, -1))


def widen(dec: Decoded, bits: int) -> Decoded:
    """A decode in the layout of `bits` >= its own (6: sub-blocks of 16): same values, for fusing
    with a wider type."""
    if dec.bits == bits:
        return dec
    if bits == 5:
        return Decoded(5, dec.q, dec.sc, dec.mm, dec.d, dec.dm)
    return Decoded(6, dec.q, dec.sc.repeat(2, axis=1), dec.mm.repeat(2, axis=1), dec.d, dec.dm)


def decode(raw: np.ndarray, qtype: str, rows: int) -> Decoded:
    """qtype one of TYPES; raw holds `rows` rows of blocks."""
    return decode_q6k(raw, rows) if qtype == "Q6_K" else _decode_4or5(raw, rows, BITS[qtype])


def dequantize_blocks(raw: np.ndarray, qtype: str, dtype: torch.dtype) -> torch.Tensor:
    """raw: rows of K-quant blocks [rows, K/256 * block bytes] -> the [rows, K] weight in dtype.

    The fp32 values are gguf.quants.dequantize's, bit for bit (the same exact products and one
    rounding, module docstring), then rounded once to dtype.  Decoded CHUNK_ROWS rows at a time:
    no fp32 copy of the whole tensor is made."""
    rows = len(raw)
    k = raw.shape[1] // BLOCK_BYTES[qtype] * SUPER_K
    out = torch.empty(rows, k, dtype=dtype)
    for r0 in range(0, rows, CHUNK_ROWS):
        dec = decode(raw[r0 : r0 + CHUNK_ROWS], qtype, min(CHUNK_ROWS, rows - r0))
        out[r0 : r0 + len(dec.q)] = _decoded_weight(dec)
    return out


def _decoded_weight(dec: Decoded) -> torch.Tensor:
    """Decoded rows -> their fp32 weight [rows, K]: (d * sc) * q + dm * mm per sub-block.  In numpy
    (one thread, temporaries freed back to the system): torch's threads keep theirs."""
    rows, k = dec.q.shape
    sub = k // dec.sc.shape[1]
    d, dm = (np.repeat(v.astype(np.float32), SUPER_K // sub, axis=1) for v in (dec.d, dec.dm))
    w = np.multiply(dec.q.reshape(rows, k // sub, sub), (d * dec.sc)[..., None], dtype=np.float32)
    w += (dm * dec.mm)[..., None]
    return torch.from_numpy(w.reshape(rows, k))


@dataclass
class Packed:
    """One chunk's tiles in the packed layout (module docstring); qh is empty for 4 bits."""

    q: torch.Tensor
    qh: torch.Tensor
    sc: torch.Tensor
    mm: torch.Tensor
    d: torch.Tensor
    dm: torch.Tensor


def _pack_chunk(dec: Decoded) -> Packed:
    """Rows of one chunk (a multiple of 16, or the last) -> its tiles."""
    tn = num_tiles(dec.q.shape[0]) * TILE_N
    q, sc, mm = pad_rows(dec.q, tn), pad_rows(dec.sc, tn), pad_rows(dec.mm, tn)
    d, dm = pad_rows(dec.d, tn), pad_rows(dec.dm, tn)
    nib = tile_fields(q & 15, 4)
    qh = tile_fields(q >> 4, dec.bits - 4) if dec.bits != 4 else torch.empty(0, dtype=torch.uint8)
    sc_t, mm_t = (v.view(-1, TILE_N, v.shape[1] // 2, 2).permute(0, 2, 1, 3) for v in (sc, mm))
    d_t, dm_t = (v.view(-1, TILE_N, v.shape[1]).permute(0, 2, 1) for v in (d, dm))
    return Packed(nib, qh, sc_t, mm_t, d_t, dm_t)


def pack(parts: list[Decoded], shape: tuple[int, int]) -> PackedWeight:
    """Decoded row chunks (in row order, every chunk but the last a multiple of 16 rows; all of one
    bits, see widen) -> a "q4k" / "q5k" / "q6k" PackedWeight of logical shape (N, K)."""
    bits = parts[0].bits
    if any(p.bits != bits for p in parts):
        raise ValueError("pack: chunks of mixed bits; widen the 4-bit ones first")
    packed = [_pack_chunk(p) for p in parts]

    def cat(field: str) -> torch.Tensor:
        return torch.cat([getattr(p, field) for p in packed]).contiguous()

    sc = cat("sc")
    mm = sc if all(p.mm is p.sc for p in parts) else cat("mm")
    qh = cat("qh") if bits != 4 else packed[0].qh
    return PackedWeight(FMTS[bits], shape, SUPER_K, cat("q"), cat("d"), cat("dm"), KBlocks(qh, sc, mm))


@dataclass(frozen=True)
class RawPart:
    """Rows of a GGUF K-quant tensor: its raw bytes [rows, K/256 * block bytes] and type name."""

    raw: np.ndarray
    qtype: str  # a GGUF type name: one of TYPES here, of qblock.TYPES there


def from_gguf(parts: list[RawPart], k: int) -> PackedWeight:
    """K-quant tensors stacked along N (a fused qkv / gate_up, or one tensor) -> PackedWeight of
    shape (sum of rows, k), in the format of the widest part ("q4k" < "q5k" < "q6k"; the others
    widened).  Every part but the last must have a multiple of 16 rows (tiles never straddle parts)."""
    bits = max(BITS[p.qtype] for p in parts)
    if any(len(p.raw) % TILE_N for p in parts[:-1]):
        raise ValueError("from_gguf: fused parts must have multiples of 16 rows")

    ext = cpu_ext.load()
    if ext is not None:  # one pass in C++ (csrc/kquant_repack.cpp): the bytes of the numpy path below
        return _repacked(ext, parts, k, bits)
    chunks = []
    for part in parts:
        rows = np.asarray(part.raw).reshape(len(part.raw), -1)
        for r0 in range(0, len(rows), CHUNK_ROWS):
            chunk = rows[r0 : r0 + CHUNK_ROWS]
            dec = decode(chunk, part.qtype, len(chunk))
            chunks.append(widen(dec, bits))
    return pack(chunks, (sum(len(p.raw) for p in parts), k))


def _repacked(ext, parts: list[RawPart], k: int, bits: int) -> PackedWeight:  # ext: cpu_ext.load()
    """from_gguf by the C++ repack.  The file's bytes are copied once (a read-only memory map makes
    no tensor), one part at a time."""
    raws = [torch.from_numpy(np.array(p.raw, dtype=np.uint8).reshape(len(p.raw), -1)) for p in parts]
    try:
        q, qh, sc, mm, d, dm = ext.kquant_repack(raws, [BITS[p.qtype] for p in parts], k, bits)
    except RuntimeError as e:  # a Q6_K block scale that fp16 cannot hold at -32 d, as decode_q6k says
        raise ValueError(str(e).splitlines()[0]) from None
    if all(p.qtype == "Q6_K" for p in parts):  # a pure Q6_K weight shares one tensor for sc and mm
        mm = sc
    return PackedWeight(FMTS[bits], (sum(len(p.raw) for p in parts), k), SUPER_K, q, d, dm, KBlocks(qh, sc, mm))


def dequantize_k(qw: PackedWeight) -> torch.Tensor:
    """The fp32 [N, K] weight: (d * sc) * q + dm * mm, the file's values bit for bit."""
    n = qw.shape[0]
    kb, t = qw.kblocks, qw.qweight.shape[0]
    q = untile_fields(qw.qweight, 4)
    if qw.fmt != "q4k":  # the high bits: 2 per k (q6k) or 1 (q5k)
        q = q | (untile_fields(kb.qh, 2 if qw.fmt == "q6k" else 1) << 4)
    sub = 16 if qw.fmt == "q6k" else 32
    sc, mm = (v.permute(0, 2, 1, 3).reshape(t * TILE_N, -1).float().repeat_interleave(sub, 1) for v in (kb.sc, kb.mm))
    d, dm = (v.permute(0, 2, 1).reshape(t * TILE_N, -1).float().repeat_interleave(SUPER_K, 1)
             for v in (qw.scale, qw.mins))
    return ((d * sc) * q.float() + dm * mm)[:n]

