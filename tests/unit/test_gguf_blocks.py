"""GGUF block weights run as stored (kernels/qblock.py, csrc/qblock_*.cpp): Q8_0, Q5_0, Q4_0.

- Packing is lossless: dequantize(packed) and dequantize_blocks equal gguf.quants.dequantize of the
  blocks bit for bit, edge values included (fp16 scales at their extremes, subnormal, zero and
  negative; every byte of q, Q8_0's -128 included), and so is a fused linear of mixed types.
- The kernel equals quant_linear_a8_ref (the file's weights x the kernel's int8 activations per
  32 k) within fp32 rounding: |y - ref| <= 1e-5 * (|xd| @ |W|^T) (+ one bf16 ulp for bf16 out), at
  every M from 1 to 16 and at 40 rows (prefill-sized), for K not a multiple of 256 too.
- A row's result is the same bits at every M (row invariance), at every ISA level.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from swiftspec.kernels import cpu_ext, qblock
from swiftspec.kernels.kquant import RawPart
from swiftspec.kernels.quant_ref import dequantize, quant_linear_a8_ref, quantize_act_ref

gguf_quants = pytest.importorskip("gguf.quants")
from gguf import GGMLQuantizationType  # noqa: E402

EDGE_SCALES = [65504.0, -65504.0, 2.0**-24, -(2.0**-24), 2.0**-14, 0.0, -0.0, 1.0]  # fp16 extremes


def random_blocks(qtype: str, n: int, k: int, seed: int = 0, edges: bool = False) -> np.ndarray:
    """[n, k/32 * block bytes] random blocks (every byte of q occurs) with fp16 scales of either
    sign in [1e-4, 1.1e-3], or with edges, the scales of EDGE_SCALES in turn."""
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, size=(n * k // 32, qblock.BLOCK_BYTES[qtype]), dtype=np.uint8)
    if edges:
        d = np.resize(np.array(EDGE_SCALES), len(b))
    else:
        d = (rng.random(len(b)) * 1e-3 + 1e-4) * rng.choice([-1.0, 1.0], len(b))
    b[:, :2] = d.astype(np.float16).reshape(-1, 1).view(np.uint8)
    return b.reshape(n, -1)


def file_weights(parts: list[RawPart], k: int) -> torch.Tensor:
    mats = [gguf_quants.dequantize(p.raw, GGMLQuantizationType[p.qtype]).reshape(len(p.raw), k) for p in parts]
    return torch.from_numpy(np.concatenate(mats))


CASES = {  # name: ([(rows, qtype)], K)
    "q8_0": ([(40, "Q8_0")], 512),
    "q8_0-k96": ([(21, "Q8_0")], 96),
    "q8_0-fused": ([(32, "Q8_0"), (16, "Q8_0"), (19, "Q8_0")], 160),
    "q4_0": ([(33, "Q4_0")], 288),
    "q5_0": ([(26, "Q5_0")], 224),
    "fused-q4_0-q5_0": ([(16, "Q4_0"), (32, "Q5_0"), (7, "Q4_0")], 96),
    "fused-q4_0-q8_0": ([(16, "Q4_0"), (11, "Q8_0")], 64),
}
FMT = {"Q8_0": "q8_0", "Q5_0": "q5_0", "Q4_0": "q4_0"}


def make(case: str, seed: int = 0) -> tuple[list[RawPart], int]:
    spec, k = CASES[case]
    return [RawPart(random_blocks(qt, n, k, seed + i), qt) for i, (n, qt) in enumerate(spec)], k


@pytest.mark.parametrize("case", list(CASES))
def test_packing_is_lossless(case):
    parts, k = make(case)
    qw = qblock.from_gguf(parts, k)
    assert qw.fmt == qblock.FMTS[max(qblock.BITS[p.qtype] for p in parts)]
    assert torch.equal(dequantize(qw), file_weights(parts, k))


@pytest.mark.parametrize("qtype", list(FMT))
def test_edge_values_and_dequantize_blocks(qtype, monkeypatch):
    monkeypatch.setattr(qblock, "CHUNK_ROWS", 16)  # several chunks, the last one short
    part = RawPart(random_blocks(qtype, 37, 256, seed=1, edges=True), qtype)
    want = file_weights([part], 256)
    assert torch.equal(dequantize(qblock.from_gguf([part], 256)), want)
    cpu_ext.load()  # dequantize_blocks runs the C++ decode once the kernels are loaded
    for dequantize_blocks in (qblock.dequantize_blocks, qblock.dequantize_blocks_np):  # C++, numpy
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            assert torch.equal(dequantize_blocks(part.raw, qtype, dtype), want.to(dtype)), (dequantize_blocks, dtype)


def test_bytes_per_weight():
    for qtype, bpw in (("Q8_0", 8.5), ("Q5_0", 5.5), ("Q4_0", 4.5)):
        qw = qblock.from_gguf([RawPart(random_blocks(qtype, 64, 1024), qtype)], 1024)
        assert qw.nbytes * 8 / (64 * 1024) == bpw


def _bound(x: torch.Tensor, qw) -> torch.Tensor:
    q, s = quantize_act_ref(x.float(), 32)
    xd = (q.view(len(x), -1, 32) * s[..., None]).view(len(x), -1)
    return 1e-5 * (xd.abs() @ dequantize(qw).abs().T) + 1e-30



@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_matches_reference_every_m(ext, isa_level, case, dtype):
    parts, k = make(case, seed=3)
    qw = qblock.from_gguf(parts, k)
    x = (torch.randn(40, k) * torch.rand(40, 1) * 4).to(dtype)
    bias = torch.randn(qw.shape[0])
    full = cpu_ext.quant_linear(x, qw, bias)
    for m in [*range(1, 17), 40]:
        y = cpu_ext.quant_linear(x[:m], qw, bias)
        ref = quant_linear_a8_ref(x[:m], qw, bias).float()
        tol = _bound(x[:m], qw) + ref.abs() * 2.0**-21  # + the fp32 rounding of the sum with the bias
        if dtype == torch.bfloat16:
            tol = tol + ref.abs() * 2.0**-7
        assert ((y.float() - ref).abs() <= tol).all(), (m, (y.float() - ref).abs().max())
        assert torch.equal(y, full[:m]), f"row results depend on M={m}"


def test_levels_agree_bitwise(ext):
    """Every level runs the AVX2 path (qblock_linear_path): the same bits at every level."""
    for case in CASES:
        parts, k = make(case, seed=5)
        qw = qblock.from_gguf(parts, k)
        x = torch.randn(7, k)
        outs = [cpu_ext.quant_linear(x, qw, at_level=lv) for lv in cpu_ext.supported_levels()]
        assert all(torch.equal(outs[0], o) for o in outs[1:])
