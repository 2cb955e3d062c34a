"""Packed int8/int4 linear kernels: packing, the C++ extension against its references, dispatch,
fallback, and model conversion.

Tolerances (the kernel quantizes each x row to int8 per K-block, then sums exactly in int32):
- against quant_linear_a8_ref (the same math in torch): |y - ref| <= 2e-5 * (|xd| @ |W|^T), the
  fp32 summation-order bound for K <= 512, plus one bf16 ulp (2^-7 |ref|) for bf16 outputs;
- against quant_linear_ref (exact x @ dequant(W)^T): relative Frobenius error <= 2e-2 (activation
  quantization: about 0.7% for Gaussian rows).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from swiftspec import kernels
from swiftspec.kernels import cpu_ext
from swiftspec.kernels.quant import int4_fit_ref, quantize_int4_torch
from swiftspec.kernels.quant_ref import dequantize, quant_linear_a8_ref, quant_linear_ref, quantize_act_ref


@pytest.fixture(scope="module")
def isa_levels(ext) -> list[int]:
    """Every ISA path this CPU can run (the AVX2 path is forced on AVX-512 machines too)."""
    return cpu_ext.supported_levels()


def _quantize(fmt: str, w: torch.Tensor, group: int | None) -> kernels.PackedWeight:
    return kernels.quantize_int8(w, group) if fmt == "int8" else kernels.quantize_int4(w, group)


def _check_a8(y: torch.Tensor, x: torch.Tensor, qw: kernels.PackedWeight, bias: torch.Tensor | None,
              w: torch.Tensor) -> None:
    """y against the kernel's math in torch; w = dequantize(qw) (passed in: it is reused)."""
    q, s = quantize_act_ref(x, qw.group_size)
    xd = (q.view(x.shape[0], -1, qw.group_size) * s[..., None]).view(x.shape[0], -1)[:, : qw.shape[1]]
    ref = xd @ w.T + (0.0 if bias is None else bias)
    ref = ref.to(x.dtype).float()
    tol = 2e-5 * (xd.abs() @ w.abs().T) + 1e-30
    if x.dtype == torch.bfloat16:
        tol = tol + ref.abs() * 2.0**-7  # one bf16 ulp
    assert y.dtype == x.dtype and y.shape == ref.shape
    assert ((y.float() - ref).abs() <= tol).all(), (y.float() - ref).abs().max()


@pytest.mark.parametrize("fmt,n,k,group", [
    ("int8", 37, 256, None), ("int8", 16, 100, None), ("int8", 100, 192, 64), ("int8", 33, 96, 32),
    ("int4", 37, 256, 32), ("int4", 100, 192, 64), ("int4", 17, 384, 128),
])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_extension_matches_references(isa_levels, fmt, n, k, group, dtype) -> None:
    torch.manual_seed(n * k)
    w, bias = torch.randn(n, k), torch.randn(n)
    qw = _quantize(fmt, w, group)
    wd = dequantize(qw)
    for m in range(1, 17):
        x = torch.randn(m, k).to(dtype)
        b = bias if m % 2 else None
        exact = x.float() @ wd.T + (0.0 if b is None else b)  # quant_linear_ref before its cast
        for level in isa_levels:
            y = cpu_ext.quant_linear(x, qw, b, level)
            _check_a8(y, x, qw, b, wd)
            assert (y.float() - exact).norm() <= 2e-2 * exact.norm()


@pytest.mark.parametrize("fmt,group", [("int8", 128), ("int8", 32), ("int4", 128), ("int4", 32)])
def test_avx2_and_avx_vnni_paths_agree_bitwise(ext, fmt, group) -> None:
    """vpdpbusd (AVX-VNNI) and vpmaddubsw + vpmaddwd (AVX2) form the same exact int32 sums, and
    the fp32 steps after them are the same: the same bits at every row count."""
    vnni = cpu_ext.LEVELS["avx2-vnni"]
    if not ext.level_supported(vnni):
        pytest.skip("this CPU has no AVX-VNNI")
    torch.manual_seed(3)
    qw = _quantize(fmt, torch.randn(100, 384), group)
    for m in (1, 2, 3, 8, 16):
        x = torch.randn(m, 384).to(torch.bfloat16)
        assert torch.equal(cpu_ext.quant_linear(x, qw, at_level=cpu_ext.LEVELS["avx2"]),
                           cpu_ext.quant_linear(x, qw, at_level=vnni)), m


def test_packing_roundtrip() -> None:
    torch.manual_seed(0)
    w = torch.randn(40, 256) * 0.05 + 0.01
    q8 = kernels.quantize_int8(w)
    assert ((dequantize(q8) - w).abs() <= 0.5001 * q8.scale[:40, None]).all()
    for group in (32, 64, 128):
        q4 = kernels.quantize_int4(w, group)
        d, m = (v.permute(0, 2, 1).reshape(-1, 256 // group)[:40].float().repeat_interleave(group, 1)
                for v in (q4.scale, q4.mins))
        inside = (w >= m - 0.5 * d) & (w <= m + 15.5 * d)  # the search may clip a group's extremes
        assert ((dequantize(q4) - w).abs() <= 0.5001 * d + 1e-6)[inside].all()
        assert torch.equal(dequantize(q4), d * ((w - m) / d).round().clamp(0, 15) + m)
        assert q4.qweight.numel() == 48 * 256 // 2  # N padded to 3 tiles of 16, two values a byte


def _int4_error(groups: torch.Tensor, dm: torch.Tensor, weighted: bool) -> torch.Tensor:
    """Per group: the (weighted) squared error of the fp16 fit, each value rounded to its nearest level."""
    d, m = dm[:, :1].half().float(), dm[:, 1:].half().float()
    q = torch.where(d > 0, ((groups - m) / torch.where(d > 0, d, 1.0)).round(), 0.0).clamp(0, 15)
    w = groups.pow(2).mean(1, keepdim=True).sqrt() + groups.abs() if weighted else 1.0
    return (w * (d * q + m - groups) ** 2).sum(1)


@pytest.mark.parametrize("n", [32, 64, 128])
def test_int4_fit_beats_min_max_rounding_on_every_cpu_the_same_way(ext, n) -> None:
    """The searched (d, mn) of each group errs less than min-max rounding (weighted, as searched;
    and plainly, on average); the C++ search equals its torch twin up to summation order, and a
    flat group gets d = 0.  Conversion packs with the C++ search."""
    torch.manual_seed(n)
    groups = torch.cat([torch.randn(3000, n) * torch.rand(3000, 1),  # Gaussian groups of mixed scale
                        torch.randn(1000, n).pow(3),  # heavy tails: outliers the search may clip
                        torch.rand(1000, n) - 0.3,  # uniform, off centre
                        torch.full((2, n), 0.25)])  # flat
    fit, ref = cpu_ext.int4_fit(groups), int4_fit_ref(groups)
    lo, hi = groups.amin(1, keepdim=True), groups.amax(1, keepdim=True)
    min_max = torch.cat(((hi - lo) / 15, lo), 1)
    for dm in (fit, ref):
        assert (_int4_error(groups, dm, True) <= _int4_error(groups, min_max, True) * 1.002 + 1e-9).all()
        assert _int4_error(groups, dm, False).mean() < 0.92 * _int4_error(groups, min_max, False).mean()
    same = ((fit - ref).abs() <= 1e-4 * ref.abs() + 1e-7).all(1)
    assert same.float().mean() > 0.99
    assert torch.equal(fit[-2:], torch.tensor([[0.0, 0.25], [0.0, 0.25]]))
    w = groups[:16 * (len(groups) // 16)].reshape(-1, 4 * n)
    qw = kernels.quantize_weight(w, "int4", n)
    assert torch.equal(qw.scale.permute(0, 2, 1).reshape(-1), fit[: qw.scale.numel(), 0].half())  # conversion runs the C++ fit


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cpp_int4_quantizer_writes_the_torch_packing(ext, dtype) -> None:
    """csrc/int4_quantize.cpp packs the bytes of quant.py's torch steps run with the same (C++)
    group search: ragged channels (a part-filled last tile), flat groups (d = 0), an evenly spaced
    group, every group size, bf16 and fp32 weights."""
    torch.manual_seed(7)
    for n, k, group in ((37, 256, 32), (16, 128, 64), (100, 384, 128)):
        w = torch.randn(n, k) * torch.rand(n, 1)
        w[3, :group] = 0.5  # a flat group
        w[5, group : 2 * group] = torch.arange(group) / 2.0  # evenly spaced values
        w = w.to(dtype)
        packed = kernels.quantize_int4(w, group)
        want = quantize_int4_torch(w, group, cpu_ext.int4_fit)
        assert all(torch.equal(getattr(packed, f), getattr(want, f)) for f in ("qweight", "scale", "mins")), (n, k, group)


@pytest.mark.parametrize("fmt", ["int4", "int8"])
def test_rows_are_independent_of_batch_and_threads(isa_levels, fmt) -> None:
    """At every ISA level, a row's output is bitwise the same alone, in any batch (any row pass),
    any thread count."""
    torch.manual_seed(1)
    qw = _quantize(fmt, torch.randn(520, 256), 64)
    x = torch.randn(37, 256).to(torch.bfloat16)
    threads = torch.get_num_threads()
    for level in isa_levels:
        try:
            torch.set_num_threads(1)
            alone = torch.cat([cpu_ext.quant_linear(x[i : i + 1], qw, at_level=level) for i in range(37)])
            torch.set_num_threads(2)
            batched = cpu_ext.quant_linear(x, qw, at_level=level)
            prefix = [cpu_ext.quant_linear(x[:m], qw, at_level=level) for m in (2, 3, 5, 8, 16)]
        finally:
            torch.set_num_threads(threads)
        assert torch.equal(alone, batched), level
        assert all(torch.equal(p, batched[: p.shape[0]]) for p in prefix), level
    if fmt == "int8":
        return
    _check_a8(batched, x, qw, None, dequantize(qw))
    ref = quant_linear_a8_ref(x, qw).float()  # the published reference of the kernel's math
    assert ((batched.float() - ref).abs() <= 1e-3 + ref.abs() * 2.0**-7).all()


def test_strided_3d_and_zero_inputs(ext) -> None:
    torch.manual_seed(2)
    qw = kernels.quantize_int8(torch.randn(24, 64))
    wide = torch.randn(5, 100)
    x = wide[:, :64]  # row stride 100
    assert torch.equal(cpu_ext.quant_linear(x, qw), cpu_ext.quant_linear(x.contiguous(), qw))
    x3 = torch.randn(2, 3, 64).to(torch.bfloat16)
    assert torch.equal(kernels.linear(x3, qw), cpu_ext.quant_linear(x3.reshape(6, 64), qw).view(2, 3, 24))
    bias = torch.randn(24)
    assert torch.equal(cpu_ext.quant_linear(torch.zeros(2, 64), qw, bias), bias.expand(2, 24))


def test_dispatch(ext) -> None:
    torch.manual_seed(3)
    w, x = torch.randn(32, 64), torch.randn(4, 64)
    assert torch.equal(kernels.linear(x, w), F.linear(x, w))
    qw = kernels.quantize_int8(w)
    assert torch.equal(kernels.linear(x, qw), cpu_ext.quant_linear(x, qw))
    assert torch.equal(F.linear(x, qw), kernels.linear(x, qw))  # via PackedWeight.__torch_function__
    b = torch.randn(32)
    assert torch.equal(F.linear(input=x, weight=qw, bias=b), kernels.linear(x, qw, b))
    x16 = x.half()  # no fp16 kernel: the exact reference
    assert torch.equal(kernels.linear(x16, qw), quant_linear_ref(x16, qw))


def test_fallback_without_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_compiler():
        raise RuntimeError("no compiler in this test")

    monkeypatch.setattr(cpu_ext, "_state", {})
    monkeypatch.setattr(cpu_ext, "_build", no_compiler)
    w = torch.randn(20, 64)
    with pytest.warns(RuntimeWarning, match="no compiler in this test"):
        qw = kernels.quantize_int4(w, 32)  # the int4 search falls back to its torch twin
    d = qw.scale.permute(0, 2, 1).reshape(-1, 2)[:20]  # [rows, K/32]
    assert torch.equal(d, int4_fit_ref(w.view(-1, 32))[:, 0].half().view(20, 2))
    x = torch.randn(3, 64).to(torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once only
        y = kernels.linear(x, qw)
        assert torch.equal(kernels.linear(x, qw), y)
    assert torch.equal(y, quant_linear_ref(x, qw))
    assert cpu_ext.isa() == "none"


def test_quantize_model_converts_linears_not_embeddings() -> None:
    from swiftspec.parallel.linear import (
        MergedColumnParallelLinear,
        ParallelLMHead,
        QKVParallelLinear,
        RowParallelLinear,
        VocabParallelEmbedding,
    )

    torch.manual_seed(4)
    f32 = {"dtype": torch.float32}
    model = nn.ModuleDict({
        "embed": VocabParallelEmbedding(50, 64, **f32), "head": ParallelLMHead(50, 64, **f32),
        "qkv": QKVParallelLinear(64, 16, 4, 2, bias=True, **f32), "o": RowParallelLinear(64, 64, bias=False, **f32),
        "gate_up": MergedColumnParallelLinear(64, [96, 96], bias=False, **f32), "plain": nn.Linear(64, 32),
    })
    for p in model.parameters():
        nn.init.normal_(p, std=0.1)
    model["head"].weight = model["embed"].weight  # tied, as Qwen does
    x = torch.randn(5, 64)
    before = {name: model[name](x) for name in ("head", "qkv", "o", "gate_up", "plain")}
    converted = kernels.quantize_model_(model, "int8")
    assert sorted(converted) == ["gate_up", "head", "o", "plain", "qkv"]
    assert isinstance(model["embed"].weight, nn.Parameter)  # the lookup keeps its table
    assert model["embed"](torch.tensor([3])).shape == (1, 64)
    for name, y0 in before.items():
        assert isinstance(model[name].weight, kernels.PackedWeight)
        assert (model[name](x) - y0).norm() <= 3e-2 * y0.norm(), name
    head_kept = nn.ModuleDict({"head": ParallelLMHead(50, 64, **f32), "o": RowParallelLinear(64, 64, bias=False)})
    for p in head_kept.parameters():
        nn.init.normal_(p, std=0.1)
    assert kernels.quantize_model_(head_kept, "int4", 32, lm_head=False) == ["o"]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="group_size"):
        kernels.quantize_int4(torch.randn(16, 96), 64)
    with pytest.raises(ValueError, match="block"):
        kernels.quantize_int8(torch.randn(16, 96), 48)
    with pytest.raises(ValueError, match="format"):
        kernels.quantize_linear_(nn.Linear(64, 16), "int2")


def test_a_dead_builds_lock_is_cleared(tmp_path) -> None:
    """A killed first build leaves torch's lock file behind; the next start must not wait on it."""
    import os
    import time

    lock = tmp_path / "lock"
    lock.touch()
    cpu_ext._clear_stale_lock(lock)
    assert lock.exists()  # fresh: a build may be starting
    old = time.time() - 300
    os.utime(lock, (old, old))
    with pytest.warns(RuntimeWarning, match="stale build lock"):
        cpu_ext._clear_stale_lock(lock)
    assert not lock.exists()  # no compiler runs in tmp_path


def test_a_start_waiting_on_a_dead_build_goes_on(tmp_path) -> None:
    """A start that finds the lock of a build killed meanwhile clears it instead of waiting forever."""
    import os
    import time

    lock = tmp_path / "lock"
    lock.touch()
    old = time.time() - 300
    os.utime(lock, (old, old))
    with pytest.warns(RuntimeWarning, match="stale build lock"):
        cpu_ext._wait_for_build(lock)
    assert not lock.exists()
    cpu_ext._wait_for_build(lock)  # no lock: no wait
