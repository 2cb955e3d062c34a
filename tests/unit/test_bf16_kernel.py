"""The small-M bf16 linear (AVX-512 BF16): accuracy, batch invariance, dispatch, model wrapping.

Tolerance against the fp32 product of the same bf16 inputs: products of two bf16 values are
exact in fp32 and vdpbf16ps accumulates in fp32, so |y - ref| <= 2^-7 |ref| (the bf16 rounding of
the output) + 1e-5 (|x| @ |w|^T) (fp32 summation over K <= 512).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from swiftspec import kernels
from swiftspec.config import LoadConfig
from swiftspec.kernels import cpu_ext
from swiftspec.model.transformer import Transformer
from swiftspec.weights import load_model


@pytest.fixture(scope="module")
def bf16_ext():
    if not cpu_ext.available("bf16_linear"):
        pytest.skip("no AVX-512 BF16 on this CPU (or the C++ kernels could not be built)")
    return cpu_ext.load()


def _check(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> None:
    ref = x.float() @ w.float().T + (0.0 if bias is None else bias.float())
    tol = ref.abs() * 2.0**-7 + 1e-5 * (x.float().abs() @ w.float().abs().T) + 1e-30
    assert y.dtype == torch.bfloat16 and y.shape == ref.shape
    assert ((y.float() - ref).abs() <= tol).all(), (y.float() - ref).abs().max()


@pytest.mark.parametrize("n,k", [(37, 96), (16, 100), (100, 192), (9, 31), (64, 512)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_reference_for_every_row_count(bf16_ext, n: int, k: int, with_bias: bool) -> None:
    g = torch.Generator().manual_seed(n * k)
    w = torch.randn(n, k, generator=g).bfloat16()
    bias = torch.randn(n, generator=g).bfloat16() if with_bias else None
    for m in range(1, cpu_ext.MAX_SMALL_ROWS + 1):
        x = torch.randn(m, k, generator=g).bfloat16()
        _check(cpu_ext.bf16_linear(x, w, bias), x, w, bias)


def test_rows_are_bitwise_independent_of_batch_and_threads(bf16_ext) -> None:
    g = torch.Generator().manual_seed(1)
    w = torch.randn(1000, 320, generator=g).bfloat16()  # N not a multiple of any block width
    x = torch.randn(16, 320, generator=g).bfloat16()
    full = cpu_ext.bf16_linear(x, w)
    for m in range(1, 17):
        assert torch.equal(cpu_ext.bf16_linear(x[:m], w), full[:m]), m
    for r in range(16):
        assert torch.equal(cpu_ext.bf16_linear(x[r : r + 1], w), full[r : r + 1]), r
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(cpu_ext.bf16_linear(x, w), full)
    finally:
        torch.set_num_threads(threads)


def test_strided_and_3d_inputs(bf16_ext) -> None:
    w = torch.randn(48, 64).bfloat16()
    x = torch.randn(2, 3, 128).bfloat16()[..., ::2]  # non-contiguous rows
    y = cpu_ext.bf16_linear(x, w)
    assert y.shape == (2, 3, 48)
    assert torch.equal(y, cpu_ext.bf16_linear(x.contiguous().view(6, 64), w).view(2, 3, 48))


def test_dispatch_by_rows_and_dtype(bf16_ext, monkeypatch: pytest.MonkeyPatch) -> None:
    w = torch.randn(40, 64).bfloat16()
    qw = kernels.quantize_weight(w, "bf16")
    assert qw.qweight.data_ptr() == w.data_ptr() and qw.nbytes == w.numel() * 2
    calls = []
    real = cpu_ext.bf16_linear
    monkeypatch.setattr(cpu_ext, "bf16_linear", lambda *a: calls.append(a[0].shape) or real(*a))
    small, large = torch.randn(16, 64).bfloat16(), torch.randn(17, 64).bfloat16()
    assert torch.equal(F.linear(small, qw), real(small, w))
    assert torch.equal(F.linear(large, qw), F.linear(large, w))  # prefill-sized: oneDNN
    assert calls == [(16, 64)]


def test_prepare_model_wraps_bf16_cpu_models_only(bf16_ext, tiny_qwen_dir) -> None:
    bf16 = load_model(str(tiny_qwen_dir), LoadConfig(dtype="bfloat16")).model
    names = kernels.prepare_model_(bf16, "bf16")
    assert "lm_head" in names and any(n.endswith("qkv_proj") for n in names)
    head = bf16.lm_head.weight
    assert isinstance(head, kernels.QuantWeight) and head.fmt == "bf16"
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


def test_chain_verification_logits_equal_one_row_steps(bf16_ext, tiny_qwen_dir) -> None:
    """With the kernel, an 8-token verify forward gives the bits of 8 one-token decode steps, so
    greedy tree verification in bf16 picks exactly the tokens autoregressive decoding picks."""
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
