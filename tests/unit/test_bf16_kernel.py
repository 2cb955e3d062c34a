"""The bf16 linear kernels at every ISA level this CPU runs (the isa_level fixture; small M: the
AVX-512 BF16 or the AVX2 kernel; prefill: the AVX2 GEMM): accuracy, batch invariance, dispatch,
model wrapping.

Tolerance against the exact (float64) product of the same bf16 inputs: products of two bf16
values are exact in fp32 and every path accumulates in fp32, so |y - ref| <= 2^-8 |ref| (the
bf16 rounding of the output) + K 2^-24 (|x| @ |w|^T) (fp32 summation over K) + the bias's
rounding; the checks allow 2^-7 |ref| + K 2^-23 (|x| @ |w|^T).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from swiftspec import kernels
from swiftspec.config import LoadConfig
from swiftspec.kernels import cpu_ext
from swiftspec.model.transformer import Transformer
from swiftspec.weights.loader import load_model

NATIVE = cpu_ext.LEVELS["avx512-bf16"]  # from here up, prefill runs oneDNN's native bf16 GEMM


def _check(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> None:
    ref = x.double() @ w.double().T + (0.0 if bias is None else bias.double())
    k = x.shape[-1]
    tol = ref.abs() * 2.0**-7 + k * 2.0**-23 * (x.double().abs() @ w.double().abs().T) + 1e-30
    assert y.dtype == torch.bfloat16 and y.shape == ref.shape
    assert ((y.double() - ref).abs() <= tol).all(), (y.double() - ref).abs().max()


def _data(n: int, k: int, m: int, seed: int, with_bias: bool = False):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g).bfloat16()
    x = torch.randn(m, k, generator=g).bfloat16()
    bias = torch.randn(n, generator=g).bfloat16() if with_bias else None
    return x, w, bias


# N and K not multiples of the block widths (8, 4 channels; 16, 32 values); K = 31: one ragged chunk.
@pytest.mark.parametrize("n,k", [(37, 96), (16, 100), (100, 192), (9, 31), (64, 512)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_reference_for_every_row_count(isa_level: int, n: int, k: int, with_bias: bool) -> None:
    x, w, bias = _data(n, k, cpu_ext.MAX_SMALL_ROWS, n * k, with_bias)
    for m in range(1, cpu_ext.MAX_SMALL_ROWS + 1):
        _check(cpu_ext.bf16_linear(x[:m], w, bias), x[:m], w, bias)


def test_rows_are_bitwise_independent_of_batch_and_threads(isa_level: int) -> None:
    x, w, bias = _data(1000, 330, 16, 1, with_bias=True)  # N, K: not multiples of any block width
    full = cpu_ext.bf16_linear(x, w, bias)
    for m in range(1, 17):
        assert torch.equal(cpu_ext.bf16_linear(x[:m], w, bias), full[:m]), m
    for r in range(16):
        assert torch.equal(cpu_ext.bf16_linear(x[r : r + 1], w, bias), full[r : r + 1]), r
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(cpu_ext.bf16_linear(x, w, bias), full)
    finally:
        torch.set_num_threads(threads)


def test_strided_and_3d_inputs(isa_level: int) -> None:
    w = torch.randn(48, 64).bfloat16()
    for shape in [(2, 3, 128), (3, 7, 128)]:  # 6 rows: small M; 21 rows: prefill
        x = torch.randn(*shape).bfloat16()[..., ::2]  # non-contiguous rows
        fn = cpu_ext.bf16_linear if shape[0] * shape[1] <= cpu_ext.MAX_SMALL_ROWS else cpu_ext.bf16_prefill
        y = fn(x, w)
        assert y.shape == (*shape[:2], 48)
        assert torch.equal(y, fn(x.contiguous().view(-1, 64), w).view(*shape[:2], 48))


# Prefill: K-blocks of 256 (600 = 2 full + 88, 603 adds a ragged 3), panels of 16 channels, passes of 6 rows.
@pytest.mark.parametrize("m,n,k", [(17, 16, 64), (40, 37, 603), (150, 100, 600), (23, 1, 9)])
def test_prefill_matches_reference(isa_level: int, m: int, n: int, k: int) -> None:
    x, w, bias = _data(n, k, m, m * n + k, with_bias=True)
    _check(cpu_ext.bf16_prefill(x, w, bias), x, w, bias)
    _check(cpu_ext.bf16_prefill(x, w), x, w, None)


def test_prefill_rows_do_not_depend_on_batch_or_threads(isa_level: int) -> None:
    x, w, _ = _data(70, 300, 64, 3)
    full = cpu_ext.bf16_prefill(x, w)
    assert torch.equal(cpu_ext.bf16_prefill(x[:17], w), full[:17])
    assert torch.equal(cpu_ext.bf16_prefill(x[5:30], w), full[5:30])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(cpu_ext.bf16_prefill(x, w), full)
    finally:
        torch.set_num_threads(threads)


def test_dispatch_by_rows_and_level(isa_level: int, monkeypatch: pytest.MonkeyPatch) -> None:
    w = torch.randn(40, 64).bfloat16()
    qw = kernels.quantize_weight(w, "bf16")
    assert qw.qweight.data_ptr() == w.data_ptr() and qw.nbytes == w.numel() * 2
    calls = []
    small, prefill = cpu_ext.bf16_linear, cpu_ext.bf16_prefill
    monkeypatch.setattr(cpu_ext, "bf16_linear", lambda *a: calls.append(("small", a[0].shape)) or small(*a))
    monkeypatch.setattr(cpu_ext, "bf16_prefill", lambda *a: calls.append(("prefill", a[0].shape)) or prefill(*a))
    x16, x17 = torch.randn(16, 64).bfloat16(), torch.randn(17, 64).bfloat16()
    assert torch.equal(F.linear(x16, qw), small(x16, w))
    if isa_level >= NATIVE:  # oneDNN's native bf16 GEMM
        assert torch.equal(F.linear(x17, qw), F.linear(x17, w))
        assert calls == [("small", (16, 64))]
    else:
        assert torch.equal(F.linear(x17, qw), prefill(x17, w))
        assert calls == [("small", (16, 64)), ("prefill", (17, 64))]


def test_prepare_model_wraps_bf16_cpu_models_only(isa_bound: int, tiny_qwen_dir) -> None:
    bf16 = load_model(str(tiny_qwen_dir), LoadConfig(dtype="bfloat16")).model
    names = kernels.prepare_model_(bf16, "bf16")
    assert "lm_head" in names and any(n.endswith("qkv_proj") for n in names)
    head = bf16.lm_head.weight
    assert isinstance(head, kernels.PackedWeight) and head.fmt == "bf16"
    if bf16.args.tie_word_embeddings:  # the head reads the embedding's storage, no copy
        assert head.qweight.data_ptr() == bf16.model.embed_tokens.weight.data_ptr()
    fp32 = load_model(str(tiny_qwen_dir), LoadConfig(dtype="float32")).model
    assert kernels.prepare_model_(fp32, "bf16") == []


def _logits_one_by_one(model: Transformer, prompt: torch.Tensor, chain: torch.Tensor) -> torch.Tensor:
    cache = model.new_cache(64)
    n = prompt.numel()
    model(prompt, torch.arange(n), cache, torch.arange(n), torch.ones(n, n).tril().bool())
    rows = []
    for i, tok in enumerate(chain.tolist()):
        p = n + i
        mask = torch.ones(1, p + 1, dtype=torch.bool)
        rows.append(model.logits(model(torch.tensor([tok]), torch.tensor([p]), cache, torch.tensor([p]), mask)))
    return torch.cat(rows)


def test_chain_verification_logits_equal_one_row_steps(isa_bound: int, tiny_qwen_dir) -> None:
    """With the kernel, an 8-token verify forward gives the bits of 8 one-token decode steps, so
    greedy tree verification in bf16 picks exactly the tokens autoregressive decoding picks."""
    if not cpu_ext.available("attention"):
        pytest.skip("no layout-invariant attention kernel at this level: SDPA's result depends on the batch")
    model = load_model(str(tiny_qwen_dir), LoadConfig(dtype="bfloat16")).model
    kernels.prepare_model_(model, "bf16")
    prompt, chain = torch.tensor([5, 9, 14, 3, 7]), torch.tensor([11, 4, 8, 30, 2, 6, 19, 12])
    want = _logits_one_by_one(model, prompt, chain)
    cache = model.new_cache(64)
    n, m = prompt.numel(), chain.numel()
    model(prompt, torch.arange(n), cache, torch.arange(n), torch.ones(n, n).tril().bool())
    mask = torch.ones(m, n + m, dtype=torch.bool)
    mask[:, n:] = torch.ones(m, m).tril().bool()
    pos = torch.arange(n, n + m)
    got = model.logits(model(chain, pos, cache, pos, mask))
    assert torch.equal(got, want)
