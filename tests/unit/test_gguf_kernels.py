"""GGUF K-quant weights (Q4_K, Q5_K, Q6_K) run as stored (kernels/kquant.py, csrc/kquant_*.cpp).

- Packing is lossless: dequantize(packed) equals gguf.quants.dequantize of the blocks, bit for bit;
  so does dequantize_blocks (the blocks straight to a dense tensor), rounded once to its dtype;
  fp16 block scales at their extremes (Q4_K, Q5_K) too.
- The kernel equals quant_linear_a8_ref (the file's weights x the kernel's int8 activations per
  256 k) within fp32 rounding: |y - ref| <= 1e-5 * (|xd| @ |W|^T) (+ one bf16 ulp for bf16 out).
- A row's result is the same bits at every M (row invariance), at every ISA level.
Blocks are random bytes with sane fp16 block scales: every bit pattern of scales and quants occurs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from swiftspec.kernels import cpu_ext, kquant
from swiftspec.kernels.quant_ref import dequantize, quant_linear_a8_ref, quantize_act_ref
from swiftspec.testing.tiny import random_kquant_blocks as random_blocks

gguf_quants = pytest.importorskip("gguf.quants")
from gguf import GGMLQuantizationType  # noqa: E402


def file_weights(parts: list[kquant.RawPart], k: int) -> torch.Tensor:
    mats = [gguf_quants.dequantize(p.raw, GGMLQuantizationType[p.qtype]).reshape(len(p.raw), k) for p in parts]
    return torch.from_numpy(np.concatenate(mats))


CASES = {  # name: ([(rows, qtype)], K)
    "q4k": ([(40, "Q4_K")], 512),
    "q6k": ([(33, "Q6_K")], 768),
    "q4k-ragged": ([(21, "Q4_K")], 256),
    "fused-mixed": ([(32, "Q4_K"), (16, "Q4_K"), (19, "Q6_K")], 512),
    "q5k": ([(35, "Q5_K")], 768),
    "fused-q4k-q5k": ([(32, "Q4_K"), (23, "Q5_K")], 256),
    "fused-q5k-q6k": ([(16, "Q5_K"), (32, "Q4_K"), (9, "Q6_K")], 512),
}


def make(case: str, seed: int = 0) -> tuple[list[kquant.RawPart], int]:
    spec, k = CASES[case]
    return [kquant.RawPart(random_blocks(n, k, qt, seed + i), qt) for i, (n, qt) in enumerate(spec)], k


@pytest.mark.parametrize("case", list(CASES))
def test_packing_is_lossless(case):
    parts, k = make(case)
    qw = kquant.from_gguf(parts, k)
    assert qw.fmt == kquant.FMTS[max(kquant.BITS[p.qtype] for p in parts)]
    assert torch.equal(dequantize(qw), file_weights(parts, k))


@pytest.mark.parametrize("case", list(CASES))
def test_the_cpp_repack_writes_the_numpy_packing(ext, case, monkeypatch):
    """csrc/kquant_repack.cpp (the packing wherever the extension loads) writes every packed
    stream byte for byte as the numpy decode and pack (without it); a pure Q6_K weight shares sc."""
    parts, k = make(case, seed=11)
    fast = kquant.from_gguf(parts, k)
    monkeypatch.setattr(cpu_ext, "load", lambda: None)
    slow = kquant.from_gguf(parts, k)
    assert (fast.fmt, fast.shape, fast.group_size) == (slow.fmt, slow.shape, slow.group_size)
    for name in ("qweight", "scale", "mins"):
        assert torch.equal(getattr(fast, name), getattr(slow, name)), name
    for name in ("qh", "sc", "mm"):
        a, b = getattr(fast.kblocks, name), getattr(slow.kblocks, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert (fast.kblocks.mm is fast.kblocks.sc) == (slow.kblocks.mm is slow.kblocks.sc)


@pytest.mark.parametrize("qtype,rows,k", [("Q4_K", 37, 512), ("Q5_K", 29, 512), ("Q6_K", 21, 768)])
def test_dequantize_blocks_is_gguf_pys(qtype, rows, k, monkeypatch):
    monkeypatch.setattr(kquant, "CHUNK_ROWS", 16)  # several chunks, the last one short
    part = kquant.RawPart(random_blocks(rows, k, qtype, seed=rows), qtype)
    want = file_weights([part], k)
    assert torch.equal(kquant.dequantize_blocks(part.raw, qtype, torch.float32), want)
    assert torch.equal(kquant.dequantize_blocks(part.raw, qtype, torch.bfloat16), want.bfloat16())


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K"])
def test_edge_scales_are_exact(qtype):
    """d and dmin at fp16's extremes (largest, smallest subnormal, zero, negative) stay exact."""
    raw = random_blocks(24, 512, qtype, seed=9)
    edges = np.array([65504.0, -65504.0, 2.0**-24, -(2.0**-24), 2.0**-14, 0.0, -0.0, 1.0], dtype=np.float16)
    blk = raw.reshape(-1, kquant.BLOCK_BYTES[qtype])
    blk[:, 0:4] = np.stack([np.resize(edges, len(blk)), np.resize(edges[::-1], len(blk))], 1).view(np.uint8)
    part = kquant.RawPart(raw, qtype)
    want = file_weights([part], 512)
    assert torch.equal(dequantize(kquant.from_gguf([part], 512)), want)
    assert torch.equal(kquant.dequantize_blocks(raw, qtype, torch.float32), want)


def test_bytes_per_weight():
    for qtype, bpw in (("Q4_K", 4.625), ("Q5_K", 5.625), ("Q6_K", 6.625)):
        qw = kquant.from_gguf([kquant.RawPart(random_blocks(64, 1024, qtype), qtype)], 1024)
        assert qw.nbytes * 8 / (64 * 1024) == bpw


def _bound(x: torch.Tensor, qw, dtype: torch.dtype) -> torch.Tensor:
    q, s = quantize_act_ref(x.float(), 256)
    xd = (q.view(len(x), -1, 256) * s[..., None]).view(len(x), -1)
    bound = 1e-5 * (xd.abs() @ dequantize(qw).abs().T) + 1e-30
    return bound



@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_matches_reference_every_m(ext, isa_level, case, dtype):
    parts, k = make(case, seed=3)
    qw = kquant.from_gguf(parts, k)
    x = torch.randn(16, k).to(dtype)
    bias = torch.randn(qw.shape[0])
    full = cpu_ext.quant_linear(x, qw, bias)
    for m in range(1, 17):
        y = cpu_ext.quant_linear(x[:m], qw, bias)
        ref = quant_linear_a8_ref(x[:m], qw, bias).float()
        tol = _bound(x[:m], qw, dtype)
        if dtype == torch.bfloat16:
            tol = tol + ref.abs() * 2.0**-7
        assert ((y.float() - ref).abs() <= tol).all(), (m, (y.float() - ref).abs().max())
        assert torch.equal(y, full[:m]), f"row results depend on M={m}"


def test_levels_agree_bitwise(ext):
    """Same integer sums and fp32 operations on every path: the same bits at every level."""
    for case in ("fused-mixed", "q5k"):
        parts, k = make(case, seed=5)
        qw = kquant.from_gguf(parts, k)
        x = torch.randn(7, k)
        outs = [cpu_ext.quant_linear(x, qw, at_level=lv) for lv in cpu_ext.supported_levels()]
        assert all(torch.equal(outs[0], o) for o in outs[1:])


def test_large_m_and_strided_rows(ext):
    parts, k = make("q4k", seed=7)
    qw = kquant.from_gguf(parts, k)
    x = torch.randn(40, 2 * k)[:, ::2]  # non-unit stride: the wrapper makes it contiguous
    y = cpu_ext.quant_linear(x, qw)
    assert torch.equal(y[:16], cpu_ext.quant_linear(x[:16].contiguous(), qw))
    ref = quant_linear_a8_ref(x.contiguous(), qw)
    assert ((y - ref).abs() <= _bound(x, qw, torch.float32)).all()
