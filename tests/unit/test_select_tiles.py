"""kernels.select_tiles: a few tiles of a packed weight score their channels exactly as the whole
weight does (the pruned draft head's extension relies on it)."""

from __future__ import annotations

import pytest
import torch

from swiftspec import kernels
from swiftspec.kernels.packed import TILE_N


@pytest.mark.parametrize("fmt", ["int4", "int8", "bf16"])
def test_selected_tiles_give_the_whole_weights_outputs(fmt: str) -> None:
    torch.manual_seed(0)
    n, k = 8 * TILE_N + 5, 256  # a ragged last tile
    w = kernels.prepare_weight(torch.randn(n, k).to(torch.bfloat16) * 0.05, fmt)
    x = torch.randn(3, k).to(torch.bfloat16)
    tiles = torch.tensor([0, 3, 8])  # 8: the ragged tile
    part = kernels.select_tiles(w, tiles)
    assert part.shape == (tiles.numel() * TILE_N, k)
    whole, got = kernels.linear(x, w), kernels.linear(x, part)
    channels = (tiles[:, None] * TILE_N + torch.arange(TILE_N)).flatten()
    real = channels < n
    assert torch.equal(got[:, real], whole[:, channels[real]])


def test_formats_without_the_tiling_are_not_selected() -> None:
    w = kernels.PackedWeight("q4k", (32, 256), 0, torch.zeros(1, dtype=torch.uint8), torch.empty(0))
    assert kernels.select_tiles(w, torch.tensor([0])) is None
