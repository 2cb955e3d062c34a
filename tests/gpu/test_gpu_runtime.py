"""CUDA-only checks of the GPU path: the dispatch launches Triton, kernels do not recompile after
warm-up, the model on CUDA matches the CPU model, and CUDA-graph replays match eager forwards."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import rope_tables, tiny_model, tree_rows

from swiftspec import kernels
from swiftspec.kernels import triton_support
from swiftspec.kernels.tree_attention import tree_attention_ref
from swiftspec.runner.cuda_graph import GraphRunner, attach
from swiftspec.runner.model_runner import ModelRunner

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
needs_triton = pytest.mark.skipif(not triton_support.available(), reason="Triton is not installed")
MAX_LEN = 256


def _attention_args(num_tokens: int, length: int, dtype: torch.dtype = torch.bfloat16) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(num_tokens * 1000 + length)
    q = torch.randn(num_tokens, 8, 64, generator=gen)
    k, v = (torch.randn(MAX_LEN, 2, 64, generator=gen) for _ in range(2))
    mask = torch.rand(num_tokens, length, generator=gen) < 0.5
    mask[:, 0] = True
    cos, sin = rope_tables(torch.arange(num_tokens) + 7, 64, dtype)
    return [t.to(dtype).cuda() if t.is_floating_point() else t.cuda() for t in (q, k, v, mask)] + [cos.cuda(), sin.cuda()]


@needs_triton
def test_dispatch_launches_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = kernels.dispatch.tree_attention_triton
    monkeypatch.setattr(kernels.dispatch, "tree_attention_triton", lambda *a, **k: calls.append(1) or real(*a, **k))
    args = _attention_args(8, 100)
    out = kernels.tree_attention(*args)
    assert calls == [1]
    ref = tree_attention_ref(*[a.float() if a.is_floating_point() else a for a in args])
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=3e-2)


@needs_triton
def test_no_recompiles_after_warmup() -> None:
    """After one warm-up per row-block size, sizes that change every step (T, S and the mask's
    stride, the number of splits, M) reuse the compiled kernels."""
    import triton

    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    if not hasattr(runtime, "jit_post_compile_hook"):
        pytest.skip(f"Triton {triton.__version__} has no knobs.runtime.jit_post_compile_hook")
    compiled = []
    old = runtime.jit_post_compile_hook
    runtime.jit_post_compile_hook = lambda **kw: compiled.append(kw.get("repr"))  # called after each compile
    try:
        x, w = torch.randn(16, 256, device="cuda", dtype=torch.bfloat16), torch.randn(512, 256, device="cuda",
                                                                                  dtype=torch.bfloat16)
        for num_tokens in (1, 8, 20):  # row blocks of 16, 32 and 64 stacked rows (group 4)
            for length in (100, 250):  # one split, several
                kernels.tree_attention(*_attention_args(num_tokens, length))
        kernels.swiglu(x[:8], w)
        kernels.swiglu_act(x[:8])
        warm = len(compiled)
        for num_tokens, length in [(5, 101), (3, 163), (8, 250), (7, 64), (1, 17)]:
            kernels.tree_attention(*_attention_args(num_tokens, length))
        for rows in (1, 5, 16):
            kernels.swiglu(x[:rows], w)
            kernels.swiglu_act(x[:rows])
        torch.cuda.synchronize()
        assert len(compiled) == warm, compiled[warm:]
    finally:
        runtime.jit_post_compile_hook = old


def _tree_call(prompt: int, nodes: int, device: str) -> dict:
    mask = tree_rows(prompt, nodes, torch.arange(nodes), torch.Generator().manual_seed(nodes))
    depth = mask[:, prompt:].sum(1) - 1
    tokens = torch.arange(40, 40 + nodes)
    call = dict(tokens=tokens, positions=prompt + depth, slots=torch.arange(prompt, prompt + nodes), mask=mask)
    return {name: t.to(device) for name, t in call.items()}


def test_model_on_cuda_matches_cpu() -> None:
    """Prefill and a tree forward through the CUDA path (Triton attention and SwiGLU when
    installed) against the CPU model in float32."""
    results = []
    for device in ("cpu", "cuda"):
        runner = ModelRunner(tiny_model(device), MAX_LEN, max_nodes=16)
        first = runner.extend(list(range(3, 33)))
        results.append(torch.cat([first, runner.forward(**_tree_call(30, 7, device))]).cpu())
    torch.testing.assert_close(results[1], results[0], atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_graph_replay_equals_eager(dtype: torch.dtype) -> None:
    """Square verification trees and a non-square draft call (leaves only, rows selected) replay
    the bucket graphs with the eager results, and keep the KV cache equal outside the scratch slot."""
    eager = ModelRunner(tiny_model("cuda", dtype), MAX_LEN, max_nodes=16)
    graphed = ModelRunner(tiny_model("cuda", dtype), MAX_LEN, max_nodes=16)
    for runner in (eager, graphed):
        runner.extend(list(range(3, 33)))
    attach(graphed, (4, 8))
    graphs: GraphRunner = graphed.graphs
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    for nodes in (7, 3, 8):
        call = _tree_call(30, nodes, "cuda")
        torch.testing.assert_close(graphs.forward(**call), eager.forward(**call), atol=tol, rtol=tol)
    draft = _tree_call(30, 8, "cuda")
    leaves = {name: t[4:] for name, t in draft.items()}  # 4 leaves against all 38 columns
    rows = torch.tensor([1, 3], device="cuda")
    torch.testing.assert_close(graphs.forward(**leaves, rows=rows), eager.forward(**leaves, rows=rows),
                               atol=tol, rtol=tol)
    scratch = graphs.scratch
    torch.testing.assert_close(graphed.cache.k[:, :scratch], eager.cache.k[:, :scratch], atol=tol, rtol=tol)


def test_ar_engine_steps_through_its_one_token_graph() -> None:
    """The autoregressive engine on CUDA replays its one-token graph at every step and emits the
    tokens of the same engine stepping eagerly."""
    from types import SimpleNamespace

    from swiftspec.engines.ar import AutoregressiveEngine
    from swiftspec.sampling import SamplingParams

    target = SimpleNamespace(model=tiny_model("cuda"), tokenizer=SimpleNamespace(eos_token_ids=()))
    graphed, eager = AutoregressiveEngine(target, MAX_LEN), AutoregressiveEngine(target, MAX_LEN)
    eager.runner.graphs = None
    replays = []
    replay = graphed.runner.graphs.forward
    graphed.runner.graphs.forward = lambda *a, **k: replays.append(1) or replay(*a, **k)
    prompt = list(range(3, 33))
    tokens = [[t for chunk in e.generate(prompt, SamplingParams(), 40) for t in chunk] for e in (graphed, eager)]
    assert tokens[0] == tokens[1] and len(tokens[0]) == 40
    assert len(replays) == 39  # every step after the prefill's token
