"""The masked attention kernels (AVX2 and AVX-512, each test at every ISA level this CPU has):
accuracy against SDPA, layout invariance, dispatch, and the end-to-end property they exist for: a
token tree verified in one forward gets, on every branch, the logits that decoding the branch one
token at a time gets (bitwise, with bf16 weights; fp32 linears run on MKL, whose results depend on
the batch)."""

from __future__ import annotations

import pytest
import torch

from swiftspec import kernels
from swiftspec.config import LoadConfig
from swiftspec.kernels import capability, cpu_ext
from swiftspec.kernels.tree_attention import grouped_attention
from swiftspec.tree import mask_from_parents
from swiftspec.weights.loader import load_model


@pytest.fixture
def attn_ext(isa_level: int):
    """The extension, with the process capped at each ISA level in turn (isa_level)."""
    if not cpu_ext.available("attention"):
        pytest.skip(f"no attention kernel at {cpu_ext.LEVEL_NAMES[isa_level]}")
    return cpu_ext.load()


def _inputs(t: int, h: int, hkv: int, d: int, s: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(t, h, d, generator=g).to(dtype)
    k = torch.randn(s + 7, hkv, d, generator=g).to(dtype)  # cache longer than the attended range
    v = torch.randn(s + 7, hkv, d, generator=g).to(dtype)
    mask = torch.rand(t, s, generator=g) < 0.6
    mask[:, 0] = True
    return q, k, v, mask


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 5e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("shape", [(1, 12, 2, 128, 300), (8, 12, 2, 128, 64), (5, 14, 2, 64, 77), (16, 4, 4, 16, 9),
                                   (4, 40, 2, 32, 50),  # 20 query heads per KV head, in blocks of 16
                                   (2, 10, 2, 256, 40)])  # the largest head dim; 5 heads per KV head
def test_matches_sdpa(attn_ext, dtype, tol, shape) -> None:
    t, h, hkv, d, s = shape
    q, k, v, mask = _inputs(t, h, hkv, d, s, dtype, seed=s)
    got = cpu_ext.masked_attention(q, k, v, mask)
    group = h // hkv
    want = grouped_attention(q.float(), k[:s].float(), v[:s].float(), mask.repeat(group, 1))
    assert got.dtype == dtype and got.shape == (t, h, d)
    assert (got.float() - want).abs().max() <= tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,head_dim", [(8, 64), (14, 64), (12, 128), (6, 32)])  # groups in 1-2 blocks; fallback
def test_result_depends_only_on_the_attended_keys(attn_ext, dtype, heads, head_dim) -> None:
    q, k, v, mask = _inputs(6, heads, 2, head_dim, 200, dtype, seed=3)
    full = cpu_ext.masked_attention(q, k, v, mask)
    for t in range(6):
        slots = mask[t].nonzero().flatten()
        alone = cpu_ext.masked_attention(q[t : t + 1], k[slots], v[slots], torch.ones(1, len(slots), dtype=torch.bool))
        assert torch.equal(alone, full[t : t + 1]), t


def test_fully_masked_row_gives_zeros(attn_ext) -> None:
    q, k, v, mask = _inputs(2, 4, 2, 32, 10, torch.float32, seed=4)
    mask[1] = False
    out = cpu_ext.masked_attention(q, k, v, mask)
    assert torch.equal(out[1], torch.zeros_like(out[1]))


@pytest.mark.parametrize("vendor", ["GenuineIntel", "AuthenticAMD"])
def test_dispatch_small_calls_and_prefill_where_faster(attn_ext, vendor, monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls of at most 16 rows run the kernel; longer ones (prefill) too where its AVX-512 path runs
    on a CPU not Intel's (MKL's slow GEMMs there), else SDPA; both agree with the reference."""
    monkeypatch.setattr(capability, "cpu_vendor", lambda: vendor)
    calls = []
    real = cpu_ext.masked_attention
    monkeypatch.setattr(cpu_ext, "masked_attention", lambda q, *a: calls.append(q.shape[0]) or real(q, *a))
    for t in (1, 16, 17):
        q, k, v, mask = _inputs(t, 4, 2, 32, 40, torch.float32, seed=t)
        got = kernels.attention(q, k[:40], v[:40], mask.repeat(2, 1))
        assert (got - grouped_attention(q, k[:40], v[:40], mask.repeat(2, 1))).abs().max() <= 5e-6
    prefill = vendor != "GenuineIntel" and cpu_ext.kernel_paths()["attention"] >= cpu_ext.LEVELS["avx512"]
    assert calls == ([1, 16, 17] if prefill else [1, 16])


# A tree over 4 nodes: 0 -> 1 -> 3 and 0 -> 2, so node 2 (a sibling of 1) sits between node 1
# and its child 3 in the cache.
PARENTS = torch.tensor([-1, 0, 0, 1])
TOKENS = torch.tensor([11, 4, 8, 30])
BRANCHES = [[0, 1, 3], [0, 2]]


def _decode(model, prompt: torch.Tensor, chain: list[int]) -> torch.Tensor:
    cache = model.new_cache(64)
    n = prompt.numel()
    model(prompt, torch.arange(n), cache, torch.arange(n), torch.ones(n, n).tril().bool())
    rows = []
    for i, tok in enumerate(chain):
        p = torch.tensor([n + i])
        rows.append(model.logits(model(torch.tensor([tok]), p, cache, p, torch.ones(1, n + i + 1, dtype=torch.bool))))
    return torch.cat(rows)


@pytest.mark.parametrize("weights", ["bf16", "int8"])  # int4 needs K % 128 == 0
def test_tree_forward_equals_branch_by_branch_decoding(attn_ext, tiny_qwen_dir, weights) -> None:
    if not cpu_ext.available("bf16_linear"):
        pytest.skip("no bf16 linear kernel at this level: bf16 linears run on oneDNN")
    model = load_model(str(tiny_qwen_dir), LoadConfig(dtype="bfloat16")).model
    kernels.prepare_model_(model, weights)  # every linear on a batch-invariant kernel
    if model.args.head_dim % 16:
        pytest.skip("the tiny model's head_dim does not fit the kernel")
    prompt = torch.tensor([5, 9, 14, 3, 7])
    n = prompt.numel()
    cache = model.new_cache(64)
    model(prompt, torch.arange(n), cache, torch.arange(n), torch.ones(n, n).tril().bool())
    tree_mask = mask_from_parents(PARENTS)  # [4, 4] ancestor-or-self
    depths = tree_mask.sum(-1) - 1
    mask = torch.cat([torch.ones(4, n, dtype=torch.bool), tree_mask], dim=1)
    slots = torch.arange(n, n + 4)
    logits = model.logits(model(TOKENS, n + depths, cache, slots, mask))  # [4, V]
    for branch in BRANCHES:
        want = _decode(model, prompt, TOKENS[branch].tolist())
        assert torch.equal(logits[branch], want), branch
