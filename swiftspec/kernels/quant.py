"""Weight-only int8/int4 packing for the CPU linear kernels (and bf16 wrapping), their
dequantization and the int4 search's torch reference.

Layouts (T = ceil(N / 16) tiles of 16 output channels; padded channels are zero):
- int8: per-channel symmetric, w ~= scale[n] * q, q in [-127, 127].  ``qweight`` is uint8
  [T, Kp/4, 16, 4] holding q + 128: one 64-byte vector is 16 channels x 4 consecutive k, the
  operand order of vpdpbusd.  K is zero-padded to Kp, a multiple of ``group_size`` (the K-block
  over which the kernel quantizes activations).
- int4: group-wise asymmetric, w ~= d[n, g] * q + mn[n, g], q in [0, 15] (llama.cpp's Q4_1).
  Each group's (d, mn) is searched as llama.cpp's K-quants do (csrc/int4_fit.cpp,
  or its torch twin ``int4_fit_ref`` without the extension), not taken from the group's min and max.
  ``qweight`` is uint8 [T, K/8, 16, 4]: byte i of a channel's 4 bytes holds k = 8s + i in its low
  and k = 8s + 4 + i in its high nibble, so one shift + mask gives two vpdpbusd operands.
  ``scale`` (d) and ``mins`` (mn) are fp16 [T, K/G, 16].

The kernel quantizes each activation row to int8 per K-block (scale = amax / 127, round half to
even) and sums exactly in int32 (vpdpbusd does 64 multiply-adds per instruction; fp32 FMA does 16,
too few to keep M = 8..16 rows bandwidth-bound).  ``quant_linear_a8_ref`` reproduces that math,
``quant_linear_ref`` is the ideal x @ dequant(W)^T (both in quant_ref.py, for every format); how far
apart they are: docs/bench/code-figures.md.
A row's result never depends on the other rows of the batch.

- bf16: not quantized.  ``qweight`` is the model's own bf16 [N, K] weight (shared storage, e.g.
  with a tied embedding); the wrapper only routes CPU calls to the bf16 kernels (small-M, and prefill below AVX-512 BF16).
"""

from __future__ import annotations

from typing import Callable

import torch

from swiftspec.kernels import cpu_ext
from swiftspec.kernels.packed import TILE_N, PackedWeight, num_tiles

BLOCKS = (128, 64, 32)  # supported K-blocks (int8 activation block / int4 group size)
CHUNK_ROWS = 8192  # rows quantized at a time (a multiple of TILE_N): bounds fp32 temporaries


def _check_weight(w: torch.Tensor) -> None:
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"expected a 2-D floating weight, got {tuple(w.shape)} {w.dtype}")


def quantize_int8(w: torch.Tensor, block: int | None = None) -> PackedWeight:
    """Per-output-channel symmetric int8.  w: [N, K]; block: activation K-block (default: the
    largest of 128/64/32 that divides K, else 32 with K zero-padded)."""
    _check_weight(w)
    n, k = w.shape
    if block is None:
        block = next((b for b in BLOCKS if k % b == 0), 32)
    if block not in BLOCKS:
        raise ValueError(f"int8 block must be one of {BLOCKS}, got {block}")
    kp, t = -(-k // block) * block, num_tiles(n)
    packed = torch.empty(t, kp // 4, TILE_N, 4, dtype=torch.uint8)
    scales = torch.zeros(t * TILE_N, dtype=torch.float32)
    for r0 in range(0, n, CHUNK_ROWS):
        wc = w[r0 : r0 + CHUNK_ROWS].detach().float().cpu()  # [rows, K]
        scale = wc.abs().amax(dim=1) / 127.0
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = torch.zeros(num_tiles(wc.shape[0]) * TILE_N, kp, dtype=torch.int16)
        q[: wc.shape[0], :k] = torch.round(wc / scale[:, None]).clamp_(-127, 127).to(torch.int16)
        q = (q + 128).to(torch.uint8).view(-1, TILE_N, kp // 4, 4).permute(0, 2, 1, 3)
        packed[r0 // TILE_N : r0 // TILE_N + q.shape[0]] = q
        scales[r0 : r0 + wc.shape[0]] = scale
    return PackedWeight("int8", (n, k), block, packed, scales)


INT4_GRIDS = 21  # candidate grids of the int4 search: 15 + c steps over the range, c = -1.0 .. 1.0
INT4_MIN_MAX = 10  # c = 0: the grid of min-max rounding, where the search starts


def _int4_error(sums: torch.Tensor, d: torch.Tensor, m: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
    """Weighted squared error of d * q + m against x, from the grid's sums (w q, w q^2, w q x) and
    the group's (w, w x, w x^2), each [3, G] float64."""
    wl, wll, wlx = sums
    sw, swx, swxx = stats
    return swxx - 2 * d * wlx - 2 * m * swx + d * d * wll + 2 * d * m * wl + m * m * sw


INT4_FIT_CHUNK = 1024  # groups searched at a time: ~20 passes over each chunk stay in cache


def int4_fit_ref(groups: torch.Tensor) -> torch.Tensor:
    """Each group's int4 (d, mn) by search, in torch: groups [G, n] fp32 -> [G, 2] fp32.

    The rule of csrc/int4_fit.cpp (llama.cpp's make_qkx2_quants with a free offset): for each
    candidate grid q = clamp(round((x - lo) * (15 + c) / (hi - lo)), 0, 15), fit (d, mn) by least
    squares weighted by rms(x) + |x|, and keep the fit of least weighted error, starting from
    min-max rounding.  Sums run in another order than the C++ one, so a near-tie may go the other way."""
    return torch.cat([_int4_fit_chunk(groups[i : i + INT4_FIT_CHUNK])
                      for i in range(0, groups.shape[0], INT4_FIT_CHUNK)]) if groups.shape[0] else torch.zeros(0, 2)


def _int4_fit_chunk(groups: torch.Tensor) -> torch.Tensor:
    x = groups.float()
    lo, hi = x.amin(1), x.amax(1)  # [G]
    span = hi - lo
    flat = ~(span > 0)
    span = torch.where(flat, torch.ones_like(span), span)
    w = (x.double().pow(2).mean(1).sqrt().float()[:, None] + x.abs())  # [G, n]
    wd, xd = w.double(), x.double()
    stats = torch.stack((wd.sum(1), (wd * xd).sum(1), (wd * xd * xd).sum(1)))  # [3, G]

    def grid(top: float) -> torch.Tensor:  # [3, G]: the sums of the grid of top steps over the range
        q = ((x - lo[:, None]) * (top / span)[:, None]).clamp(0, 15).round()  # [G, n]
        a = (w * q).double()
        return torch.stack((a.sum(1), (a * q.double()).sum(1), (a * xd).sum(1)))

    grids = [grid(14.0 + c / 10) for c in range(INT4_GRIDS)]
    best_d, best_m = (span / 15).double(), lo.double()
    best_e = _int4_error(grids[INT4_MIN_MAX], best_d, best_m, stats)
    for sums in grids:
        wl, wll, wlx = sums
        det = stats[0] * wll - wl * wl
        safe = torch.where(det > 0, det, torch.ones_like(det))
        d, m = (stats[0] * wlx - wl * stats[1]) / safe, (wll * stats[1] - wl * wlx) / safe
        e = _int4_error(sums, d, m, stats)
        take = (det > 0) & (d > 0) & (e < best_e)
        best_e, best_d, best_m = (torch.where(take, a, b) for a, b in ((e, best_e), (d, best_d), (m, best_m)))
    best_d = torch.where(flat, torch.zeros_like(best_d), best_d)
    return torch.stack((best_d, best_m), 1).float()


def quantize_int4(w: torch.Tensor, group_size: int = 128) -> PackedWeight:
    """Group-wise asymmetric int4 (w ~= d * q + mn, q in 0..15).  w: [N, K], K % group_size == 0.
    Each group's (d, mn) is the int4 search's, rounded to fp16; conversion (prepare.py) packs with
    this.  The C++ quantizer where the extension is built (csrc/int4_quantize.cpp: the same bits
    on every CPU), else the same steps in torch with int4_fit_ref (whose sums run in another
    order, so a near-tie may go the other way)."""
    _check_weight(w)
    k = w.shape[1]
    if group_size not in BLOCKS or k % group_size:
        raise ValueError(f"int4 needs group_size in {BLOCKS} dividing K={k}, got {group_size}")
    if cpu_ext.load() is not None:
        packed = cpu_ext.int4_quantize(w.detach().cpu(), group_size)
    else:
        packed = quantize_int4_torch(w, group_size, int4_fit_ref)
    if not (torch.isfinite(packed.scale).all() and torch.isfinite(packed.mins).all()):
        raise ValueError("int4 scales overflow fp16; the weight has values beyond +-65504")
    return packed


def quantize_int4_torch(w: torch.Tensor, group_size: int, fit: Callable[[torch.Tensor], torch.Tensor]) -> PackedWeight:
    """quantize_int4's steps in torch with the group search `fit` ([G, n] fp32 -> [G, 2] (d, mn))."""
    n, k = w.shape
    t, ng = num_tiles(n), k // group_size
    packed = torch.empty(t, k // 8, TILE_N, 4, dtype=torch.uint8)
    d_all = torch.zeros(t * TILE_N, ng, dtype=torch.float16)
    m_all = torch.zeros(t * TILE_N, ng, dtype=torch.float16)
    for r0 in range(0, n, CHUNK_ROWS):
        g = w[r0 : r0 + CHUNK_ROWS].detach().float().cpu().contiguous().view(-1, ng, group_size)
        rows = g.shape[0]
        dm = fit(g.view(-1, group_size)).view(rows, ng, 2)
        d16, m16 = dm[..., 0].half(), dm[..., 1].half()  # [rows, K/G]
        d, m = d16.float()[..., None], m16.float()[..., None]
        q = g.sub(m).div_(torch.where(d > 0, d, 1.0)).round_().masked_fill_(d <= 0, 0.0).clamp_(0, 15)  # in place
        qp = torch.zeros(num_tiles(rows) * TILE_N, k, dtype=torch.uint8)
        qp[:rows] = q.view(rows, k).to(torch.uint8)
        qp = qp.view(-1, TILE_N, k // 8, 2, 4)  # k = 8 s + 4 h + i
        nibbles = (qp[:, :, :, 0] | (qp[:, :, :, 1] << 4)).permute(0, 2, 1, 3)  # [tiles, K/8, 16, 4]
        packed[r0 // TILE_N : r0 // TILE_N + nibbles.shape[0]] = nibbles
        d_all[r0 : r0 + rows], m_all[r0 : r0 + rows] = d16, m16
    d_t, m_t = (v.view(t, TILE_N, ng).permute(0, 2, 1).contiguous() for v in (d_all, m_all))
    return PackedWeight("int4", (n, k), group_size, packed, d_t, m_t)


def wrap_bf16(w: torch.Tensor) -> PackedWeight:
    """A bf16 [N, K] weight (kept as is, storage shared) for the small-M bf16 kernel."""
    _check_weight(w)
    if w.dtype != torch.bfloat16 or w.stride(-1) != 1:
        raise ValueError(f"bf16 wrapping needs a row-major bf16 weight, got {w.dtype}")
    return PackedWeight("bf16", tuple(w.shape), 0, w.detach(), torch.empty(0))


def dequantize_int(qw: PackedWeight) -> torch.Tensor:
    """The fp32 [N, K] weight of an int8, int4 or (wrapped) bf16 PackedWeight."""
    n, k = qw.shape
    if qw.fmt == "bf16":
        return qw.qweight.float()
    t = qw.qweight.shape[0]
    if qw.fmt == "int8":
        q = qw.qweight.permute(0, 2, 1, 3).reshape(t * TILE_N, -1).float() - 128.0
        return (q * qw.scale[:, None])[:n, :k]
    b = qw.qweight
    q = torch.stack([b & 15, b >> 4], dim=3)  # [T, K/8, 16, 2, 4]
    q = q.permute(0, 2, 1, 3, 4).reshape(t * TILE_N, k).float()

    def per_k(v: torch.Tensor) -> torch.Tensor:  # [T, K/G, 16] -> [T*16, K]
        return v.permute(0, 2, 1).reshape(t * TILE_N, -1).float().repeat_interleave(qw.group_size, 1)

    return (per_k(qw.scale) * q + per_k(qw.mins))[:n]
