"""Triton tree attention and SwiGLU against their torch references.

Without CUDA the kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1, set below before
Triton is first used; it is read when a kernel is first compiled). On a CUDA machine the same cases
run on the GPU and the module carries the `gpu` mark, so `pytest -m gpu` includes it there.
The interpreter's tl.dot multiplies bfloat16 bit patterns (triton-lang/triton#11584, not supported
upstream), so bfloat16 cases run only on CUDA; float32 and float16 run everywhere.
"""

from __future__ import annotations

import os

import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from kernel_cases import rope_tables, tree_rows  # noqa: E402

from swiftspec import kernels  # noqa: E402
from swiftspec.kernels import triton_support  # noqa: E402
from swiftspec.kernels.swiglu import swiglu_act_ref, swiglu_act_triton, swiglu_ref, swiglu_triton  # noqa: E402
from swiftspec.kernels.tree_attention import tree_attention_ref, tree_attention_triton  # noqa: E402
from swiftspec.model.layers import RopeAngles, apply_rope  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if CUDA else [])
TOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
pytestmark = [pytest.mark.gpu] if CUDA else []
needs_triton = pytest.mark.skipif(not triton_support.available(),
                                  reason="Triton is not installed (pip install triton; it is in the test extra)")

# (T rows, S columns, heads, kv heads, head_dim, splits or None for the default)
ATTENTION_CASES = [
    (1, 37, 4, 4, 16, None),  # decode, MHA
    (7, 7, 4, 2, 16, None),  # square (prefill-like), GQA 2
    (8, 100, 8, 2, 32, None),  # non-square draft expansion, GQA 4
    (8, 100, 8, 2, 32, 3),  # same, KV split three ways and merged
    (1, 300, 4, 1, 64, 4),  # decode over a longer prefix, MQA, 4 splits
    (40, 150, 4, 2, 16, 2),  # 80 stacked rows: two row blocks
    (2, 2100, 4, 2, 16, 40),  # more splits asked than allowed: clamped, then 17 partials merged
]


def _attention_inputs(case: tuple, dtype: torch.dtype, seed: int = 0) -> dict:
    """Random q, cache (S_max = S + 9: slots past S must be ignored) and a random mask with the
    diagonal-ish column kept so that no row is empty."""
    num_tokens, length, heads, kv_heads, head_dim, _ = case
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(num_tokens, heads, head_dim, generator=gen)
    k = torch.randn(length + 9, kv_heads, head_dim, generator=gen)
    v = torch.randn(length + 9, kv_heads, head_dim, generator=gen)
    mask = torch.rand(num_tokens, length, generator=gen) < 0.4
    mask[torch.arange(num_tokens), torch.arange(num_tokens) % length] = True
    cos, sin = rope_tables(torch.randint(0, 200, (num_tokens,), generator=gen), head_dim, dtype)
    tensors = dict(q=q.to(dtype), k_cache=k.to(dtype), v_cache=v.to(dtype), mask=mask, cos=cos, sin=sin)
    return {name: t.to(DEVICE) for name, t in tensors.items()}


def _close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    assert out.shape == ref.shape and out.dtype == ref.dtype
    torch.testing.assert_close(out.float(), ref.float(), atol=TOL[dtype], rtol=TOL[dtype])


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", ATTENTION_CASES, ids=str)
def test_tree_attention_matches_reference(case: tuple, dtype: torch.dtype) -> None:
    inputs = _attention_inputs(case, dtype)
    out = tree_attention_triton(**inputs, num_splits=case[-1])
    ref = tree_attention_ref(**{n: t.float() if t.is_floating_point() else t for n, t in inputs.items()})
    _close(out, ref.to(dtype), dtype)


@needs_triton
@pytest.mark.parametrize("square", [True, False], ids=["verify-square", "draft-leaves"])
def test_tree_attention_token_tree(square: bool) -> None:
    """Real tree masks over a prefix: the target's [N, P + N] and the draft's [w, P + N] (leaves only),
    against a cache padded far past S (the CUDA-graph layout) so that most tiles are skipped."""
    gen = torch.Generator().manual_seed(1)
    prefix, nodes, heads, kv_heads, head_dim = 70, 12, 8, 2, 32
    rows = torch.arange(nodes) if square else torch.tensor([5, 9, 10, 11])
    mask = tree_rows(prefix, nodes, rows, gen)
    mask = torch.cat([mask, torch.zeros(rows.numel(), 200, dtype=torch.bool)], dim=1)  # S padded by 200
    q = torch.randn(rows.numel(), heads, head_dim, generator=gen)
    k = torch.randn(mask.shape[1], kv_heads, head_dim, generator=gen)
    v = torch.randn(mask.shape[1], kv_heads, head_dim, generator=gen)
    cos, sin = rope_tables(prefix + rows, head_dim, torch.float32)
    args = [t.to(DEVICE) for t in (q, k, v, mask, cos, sin)]
    for splits in (1, 4):
        _close(tree_attention_triton(*args, num_splits=splits), tree_attention_ref(*args), torch.float32)


@needs_triton
def test_tree_attention_row_that_sees_nothing_is_zero() -> None:
    inputs = _attention_inputs((4, 90, 4, 2, 16, None), torch.float32)
    inputs["mask"][2] = False
    out = tree_attention_triton(**inputs, num_splits=2)
    assert torch.equal(out[2], torch.zeros_like(out[2]))
    keep = torch.tensor([0, 1, 3], device=out.device)
    _close(out[keep], tree_attention_ref(**inputs)[keep], torch.float32)


def test_reference_rotates_like_the_model() -> None:
    """tree_attention_ref (pre-RoPE q) equals the model's CPU path (apply_rope on q, then
    grouped_attention with the per-group repeated mask) bit for bit."""
    inputs = _attention_inputs((5, 40, 8, 2, 16, None), torch.float32)
    rope = RopeAngles(cos=inputs["cos"][:, None], sin=inputs["sin"][:, None])
    length = inputs["mask"].shape[1]
    model_path = kernels.grouped_attention(apply_rope(inputs["q"], rope), inputs["k_cache"][:length],
                                           inputs["v_cache"][:length], inputs["mask"].repeat(4, 1))
    assert torch.equal(tree_attention_ref(**inputs), model_path)


def test_cpu_dispatch_runs_the_references() -> None:
    """On CPU tensors (Triton or not) tree attention returns the reference's result exactly; the
    SwiGLU activation runs the C++ row-wise kernel where it is built, within fp32 rounding of the
    reference (its exp differs from ATen's in the last bits)."""
    inputs = {n: t.cpu() for n, t in _attention_inputs((3, 20, 4, 2, 16, None), torch.float32).items()}
    assert torch.equal(kernels.tree_attention(**inputs), tree_attention_ref(**inputs))
    x, w = torch.randn(3, 32), torch.randn(2 * 24, 32)
    close = {"rtol": 1e-6, "atol": 1e-6}
    torch.testing.assert_close(kernels.swiglu(x, w), swiglu_ref(x, w), **close)
    torch.testing.assert_close(kernels.swiglu_act(x), swiglu_act_ref(x), **close)
    qw = kernels.quantize_int8(w)
    torch.testing.assert_close(kernels.swiglu(x, qw), swiglu_act_ref(kernels.linear(x, qw)), **close)


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,hidden,inter", [(1, 64, 96), (5, 200, 130), (16, 128, 64), (8, 256, 1100)])
def test_swiglu_matches_reference(rows: int, hidden: int, inter: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, hidden, generator=gen).to(DEVICE)
    w = (torch.randn(2 * inter, hidden, generator=gen) * hidden**-0.5).to(DEVICE)
    gate_up = torch.randn(rows, 2 * inter, generator=gen).to(DEVICE)
    _close(swiglu_triton(x.to(dtype), w.to(dtype)), swiglu_ref(x, w).to(dtype), dtype)
    _close(swiglu_act_triton(gate_up.to(dtype)), swiglu_act_ref(gate_up).to(dtype), dtype)


@needs_triton
def test_swiglu_rejects_too_many_rows() -> None:
    with pytest.raises(ValueError, match="at most 16 rows"):
        swiglu_triton(torch.randn(17, 32, device=DEVICE), torch.randn(64, 32, device=DEVICE))
