"""The row-wise kernels (RMSNorm, SwiGLU activation; AVX2 and AVX-512, each test at every ISA
level this CPU has) against their torch references: bf16 results within one bf16 rounding step
(almost always equal), fp32 within a few ulps, every row independent of the others, and the
dispatch in `kernels`."""

from __future__ import annotations

import pytest
import torch

from swiftspec import kernels
from swiftspec.kernels import cpu_ext


@pytest.fixture
def rowwise_ext(isa_level: int):
    """The extension, with the process capped at each ISA level in turn (isa_level)."""
    if not cpu_ext.available("rowwise"):
        pytest.skip(f"no row-wise kernels at {cpu_ext.LEVEL_NAMES[isa_level]}")
    return cpu_ext.load()


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    """bf16: at most one rounding step apart and >= 99% equal; fp32: relative 1e-6."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        return
    g, w = got.float(), want.float()
    assert ((g - w).abs() <= w.abs() * 2.0**-7 + 1e-30).all()
    assert (got == want).float().mean() >= 0.99


SHAPES = [(1, 1536), (8, 896), (3, 100), (16, 17), (300, 256)]  # decode, draft, tails, prefill


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,n", SHAPES)
def test_rms_norm_matches_reference(rowwise_ext, dtype, rows: int, n: int) -> None:
    g = torch.Generator().manual_seed(rows * n)
    x = (torch.randn(rows, n, generator=g) * 3).to(dtype)
    w = torch.randn(n, generator=g).to(dtype)
    _close(cpu_ext.rms_norm(x, w, 1e-6), kernels.rms_norm_ref(x, w, 1e-6))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,n", SHAPES)
def test_silu_mul_matches_reference(rowwise_ext, dtype, rows: int, n: int) -> None:
    g = torch.Generator().manual_seed(rows + n)
    gate_up = (torch.randn(rows, 2 * n, generator=g) * 4).to(dtype)
    _close(cpu_ext.silu_mul(gate_up), kernels.swiglu_act_ref(gate_up))


def test_silu_mul_saturates_like_torch(rowwise_ext) -> None:
    # -88.5: exp(88.5) is finite although its 2^n is 2^128 (AVX2 builds 2^n in two halves)
    gate_up = torch.tensor([[-200.0, -90.0, -88.5, -30.0, 0.0, 30.0, 90.0, 200.0, -5.0] + [1.0] * 9])  # [1, 2 * 9]
    got = cpu_ext.silu_mul(gate_up)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, kernels.swiglu_act_ref(gate_up), rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_are_independent(rowwise_ext, dtype) -> None:
    """Row r of a batched call has the bits of a call on row r alone (tree = decode)."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(9, 1536, generator=g).to(dtype)
    w = torch.randn(1536, generator=g).to(dtype)
    gate_up = torch.randn(9, 2 * 1000, generator=g).to(dtype)
    norm, act = cpu_ext.rms_norm(x, w, 1e-6), cpu_ext.silu_mul(gate_up)
    for r in range(9):
        assert torch.equal(cpu_ext.rms_norm(x[r : r + 1], w, 1e-6), norm[r : r + 1])
        assert torch.equal(cpu_ext.silu_mul(gate_up[r : r + 1]), act[r : r + 1])


def test_strided_rows_and_leading_dims(rowwise_ext) -> None:
    g = torch.Generator().manual_seed(6)
    wide = torch.randn(4, 3, 96, generator=g).bfloat16()
    x = wide[..., :64]  # [4, 3, 64] with a row stride of 96
    w = torch.randn(64, generator=g).bfloat16()
    got = kernels.rms_norm(x, w, 1e-5)
    assert got.shape == x.shape
    _close(got.reshape(-1, 64), kernels.rms_norm_ref(x.reshape(-1, 64), w, 1e-5))


def test_dispatch(rowwise_ext) -> None:
    """CPU bf16/fp32 run the kernel; other dtypes (and a weight of another dtype) the reference."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 40, generator=g)
    w = torch.randn(40, generator=g)
    assert torch.equal(kernels.rms_norm(x, w, 1e-6), cpu_ext.rms_norm(x, w, 1e-6))
    assert torch.equal(kernels.rms_norm(x, w.double(), 1e-6), kernels.rms_norm_ref(x, w.double(), 1e-6))
    xh = x.half()
    assert torch.equal(kernels.rms_norm(xh, w.half(), 1e-6), kernels.rms_norm_ref(xh, w.half(), 1e-6))
    gate_up = torch.randn(3, 80, generator=g).bfloat16()
    assert torch.equal(kernels.swiglu_act(gate_up), cpu_ext.silu_mul(gate_up))
