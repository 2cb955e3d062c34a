"""The packed-weight type that every format builds (int8/int4 in quant.py, GGUF K-quants in
kquant.py, GGUF blocks in qblock.py), its tiles of TILE_N output channels and the tile helpers the
formats share.  Imports no other kernels module, so the formats import it and not each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

TILE_N = 16  # output channels per tile: one 512-bit vector of fp32 accumulators

LinearFn = Callable[[torch.Tensor, "PackedWeight", "torch.Tensor | None"], torch.Tensor]


@dataclass(frozen=True, eq=False)
class PackedWeight:
    """A packed [N, K] weight (or a bf16 one wrapped as is); F.linear(x, qw, b) on it routes to
    swiftspec.kernels.linear (installed by kernels/dispatch.py through route_linear)."""

    fmt: str  # "int8" | "int4" | "bf16" | "q4k" | "q5k" | "q6k" (GGUF K-quants, kquant.py) | "q8_0" | "q5_0" | "q4_0" (qblock.py)
    shape: tuple[int, int]  # logical (N, K)
    group_size: int  # int4: K-group of d/mn; int8: activation K-block
    qweight: torch.Tensor  # uint8, layout in the format's module docstring; bf16: the [N, K] weight
    scale: torch.Tensor  # int8: fp32 [T * 16]; int4: fp16 [T, K/G, 16]; bf16: empty
    mins: torch.Tensor | None = None  # int4: fp16 [T, K/G, 16]; int8: None
    kblocks: object | None = None  # K-quants: kquant.KBlocks (high bits, sub-block scales and mins); q5_0: qblock.HighBits
    # The dispatch of F.linear on a PackedWeight: kernels.linear, which sits above every format
    # (it imports them), so it is handed down here once instead of imported from below (a cycle).
    _linear: ClassVar[LinearFn | None] = None

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    @property
    def nbytes(self) -> int:
        extra = 0 if self.mins is None else self.mins.numel() * self.mins.element_size()
        extra += 0 if self.kblocks is None else self.kblocks.nbytes
        return self.qweight.numel() * self.qweight.element_size() + self.scale.numel() * self.scale.element_size() + extra

    @classmethod
    def route_linear(cls, linear: LinearFn) -> None:
        """Make `linear` the function that F.linear calls on a PackedWeight (kernels/__init__.py does, once)."""
        cls._linear = staticmethod(linear)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        """Lets unmodified layers that call F.linear(x, weight, bias) run quantized."""
        if func is not F.linear or cls._linear is None:
            return NotImplemented
        params = {**dict(zip(("input", "weight", "bias"), args)), **(kwargs or {})}
        return cls._linear(params["input"], params["weight"], params.get("bias"))


def select_tiles(w: PackedWeight, tiles: torch.Tensor) -> PackedWeight | None:
    """Tiles [n] of an int8, int4 or bf16 packed weight as one of n * TILE_N channels (row j of
    tile i is channel i * TILE_N + j; a bf16 tile past the last row repeats it), or None for the
    formats without this tiling (GGUF blocks).  Each channel's output equals the whole weight's."""
    n, k = w.shape
    if w.fmt == "bf16":
        rows = (tiles[:, None] * TILE_N + torch.arange(TILE_N, device=tiles.device)).flatten().clamp_max(n - 1)
        return PackedWeight("bf16", (rows.numel(), k), 0, w.qweight[rows].contiguous(), w.scale)
    if w.fmt == "int4":
        return PackedWeight("int4", (tiles.numel() * TILE_N, k), w.group_size, w.qweight[tiles].contiguous(),
                            w.scale[tiles].contiguous(), w.mins[tiles].contiguous())
    if w.fmt == "int8":
        scale = w.scale.view(-1, TILE_N)[tiles].flatten()
        return PackedWeight("int8", (tiles.numel() * TILE_N, k), w.group_size, w.qweight[tiles].contiguous(), scale)
    return None


def num_tiles(n: int) -> int:
    """Tiles of TILE_N channels that hold n output channels (the last one zero-padded)."""
    return -(-n // TILE_N)


def pad_rows(a: np.ndarray, rows: int) -> torch.Tensor:
    """a [n, ...] zero-padded to `rows` rows (a whole number of tiles), as a tensor."""
    out = np.zeros((rows, *a.shape[1:]), dtype=a.dtype)
    out[: a.shape[0]] = a
    return torch.from_numpy(out)


def tile_fields(v: torch.Tensor, width: int) -> torch.Tensor:
    """Values v [T * 16, K] uint8 (< 2^width; width 4, 2 or 1) -> packed [T, K * width / 32, 16, 4]:
    byte i of a channel in group g holds k = 32 g / width + 4 f + i in its bits [width f, width (f + 1)):
    int4's nibbles (width 4), the 6-bit high pairs (2), the fifth bits (1)."""
    nf = 8 // width
    f = v.view(-1, TILE_N, v.shape[1] // (4 * nf), nf, 4)
    return sum(f[:, :, :, j] << (width * j) for j in range(nf)).permute(0, 2, 1, 3)


def untile_fields(b: torch.Tensor, width: int) -> torch.Tensor:
    """Inverse of tile_fields: packed [T, G, 16, 4] uint8 -> the values [T * 16, K]."""
    f = torch.stack([(b >> s) & ((1 << width) - 1) for s in range(0, 8, width)], dim=3)
    return f.permute(0, 2, 1, 3, 4).reshape(b.shape[0] * TILE_N, -1)
