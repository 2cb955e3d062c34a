"""The fused CPU decoder (kernels.cpu_decoder): bit for bit the unfused model's forward (hidden
states and the K/V it caches) at every row count it takes, for every weight format and both
activation dtypes, at the lowest and the highest ISA level this CPU has; rebuilt when the weights
are repacked; never used where it does not apply."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from swiftspec import kernels
from swiftspec.kernels import cpu_ext, kquant, qblock
from swiftspec.kernels.prepare import is_linear
from swiftspec.model import ModelArgs, Transformer
from swiftspec.testing.tiny import random_kquant_blocks, random_weights
from swiftspec.tree import mask_from_parents

PROMPT = 20  # > MAX_DECODER_ROWS: the prefill runs unfused in both models
PARENTS = torch.tensor([-1, 0, 0, 1, 1, 2, 3])  # a 7-node tree verified after the prompt


@pytest.fixture(autouse=True)
def _needs_kernels(isa_bound: int):
    """Every test runs at the lowest and the highest ISA level (isa_bound)."""
    if not (cpu_ext.available("rowwise") and cpu_ext.available("attention")):
        pytest.skip(f"no attention or row-wise kernels at {cpu_ext.LEVEL_NAMES[isa_bound]}")


def _args(arch: str, heads: int, kv_heads: int, head_dim: int) -> ModelArgs:
    hidden = heads * head_dim
    return ModelArgs(arch=arch, vocab_size=300, hidden_size=hidden, intermediate_size=2 * hidden + 64, num_layers=3,
                     num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, rope_theta=10000.0,
                     qkv_bias=arch == "qwen2", tie_word_embeddings=arch == "qwen2", max_position_embeddings=256)


def _model(args: ModelArgs, dtype: torch.dtype, weights: str) -> Transformer:
    model = Transformer(args, dtype=dtype)
    model.load_weights(random_weights(args, seed=3).items())
    if weights == "int4":
        kernels.quantize_model_(model, "int4", group_size=32)
    elif weights == "gguf":  # random K-quant blocks where K % 256 == 0 (qkv mixed, as in a Q4_K_M file; Q5_K gate_up)
        for name, mod in model.named_modules():
            if is_linear(mod) and mod.weight.shape[1] % 256 == 0 and name != "lm_head":
                n, k = mod.weight.shape
                types = ["Q4_K", "Q6_K"] if "qkv" in name else ["Q5_K"] if "gate_up" in name else ["Q4_K"]
                rows = [n - 32, 32] if "qkv" in name else [n]
                parts = [kquant.RawPart(random_kquant_blocks(r, k, t, seed=r), t) for r, t in zip(rows, types)]
                del mod.weight
                mod.weight = kquant.from_gguf(parts, k)
        kernels.prepare_model_(model, "gguf")
    elif weights == "gguf-blocks":
        _gguf_blocks(model)
    else:
        kernels.prepare_model_(model, weights)
    return model


def _gguf_blocks(model: Transformer) -> None:
    """Every linear but the head as the GGUF blocks of its weights (gguf-py quantizes them): qkv
    Q4_0 with Q8_0 rows (q8_0), o Q4_0, gate_up Q5_0, down Q8_0."""
    quants = pytest.importorskip("gguf.quants")
    for name, mod in model.named_modules():
        if is_linear(mod) and name != "lm_head":
            w, k = mod.weight.float().numpy(), mod.weight.shape[1]
            kind = name.rsplit(".", 1)[-1]
            types = {"qkv_proj": ["Q4_0", "Q8_0"], "o_proj": ["Q4_0"], "gate_up_proj": ["Q5_0"]}.get(kind, ["Q8_0"])
            rows = [len(w) - 32, 32] if len(types) == 2 else [len(w)]
            parts, r0 = [], 0
            for r, t in zip(rows, types):
                parts.append(kquant.RawPart(quants.quantize(w[r0 : r0 + r], quants.GGMLQuantizationType[t]), t))
                r0 += r
            del mod.weight
            mod.weight = qblock.from_gguf(parts, k)
    kernels.prepare_model_(model, "gguf")


def _calls(model: Transformer, fused: bool) -> tuple[list[torch.Tensor], torch.nn.Module]:
    """Prefill, a tree, then two one-token decodes; the hidden states of each call and the cache."""
    model.fuse_cpu_layers = fused
    cache = model.new_cache(64)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.args.vocab_size, (PROMPT + PARENTS.numel() + 2,), generator=g)
    outs = [model(tokens[:PROMPT], torch.arange(PROMPT), cache, torch.arange(PROMPT),
                  torch.ones(PROMPT, PROMPT, dtype=torch.bool).tril())]
    tree = mask_from_parents(PARENTS)  # [7, 7]
    n = PARENTS.numel()
    mask = torch.cat([torch.ones(n, PROMPT, dtype=torch.bool), tree], dim=1)
    slots = torch.arange(PROMPT, PROMPT + n)
    outs.append(model(tokens[PROMPT : PROMPT + n], PROMPT + tree.sum(-1) - 1, cache, slots, mask))
    for i in range(2):
        p = torch.tensor([PROMPT + n + i])
        outs.append(model(tokens[PROMPT + n + i : PROMPT + n + i + 1], p, cache, p,
                          torch.ones(1, PROMPT + n + i + 1, dtype=torch.bool)))
    return outs, cache


CASES = [("qwen2", torch.bfloat16, "bf16", (4, 2, 16)), ("qwen2", torch.bfloat16, "int8", (6, 2, 32)),
         ("qwen2", torch.bfloat16, "int4", (4, 1, 64)), ("llama", torch.float32, "int8", (4, 2, 16)),
         ("llama", torch.float32, "int4", (2, 2, 48)), ("llama", torch.bfloat16, "int4", (6, 3, 32)),
         ("qwen2", torch.bfloat16, "gguf", (4, 2, 64)), ("llama", torch.float32, "gguf", (2, 1, 128)),
         ("qwen2", torch.bfloat16, "gguf-blocks", (3, 1, 32)), ("llama", torch.float32, "gguf-blocks", (2, 2, 48))]


@pytest.mark.parametrize("arch,dtype,weights,heads", CASES)
def test_fused_equals_unfused(arch, dtype, weights, heads) -> None:
    if weights == "bf16" and cpu_ext.kernel_paths()["bf16_linear"] == 0:
        pytest.skip("no bf16 linear kernel at this level: bf16 weights stay on oneDNN, unfused")
    model = _model(_args(arch, *heads), dtype, weights)
    assert model._cpu_decoder(PARENTS.numel()) is not None  # the fused path is taken
    fused, fused_cache = _calls(model, fused=True)
    plain, plain_cache = _calls(model, fused=False)
    for i, (a, b) in enumerate(zip(fused, plain)):
        assert torch.equal(a, b), i
    assert torch.equal(fused_cache.k, plain_cache.k) and torch.equal(fused_cache.v, plain_cache.v)


class _AtenMatmuls(TorchDispatchMode):
    """Records the ATen matrix products (the ops a process-wide oneDNN switch would reroute)."""

    NAMES = ("mm", "addmm", "bmm", "baddbmm", "mv", "addmv", "matmul", "linear", "dot", "_scaled_dot_product")

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        name = func.overloadpacket.__name__
        if name.startswith(self.NAMES) or "mkldnn" in name:
            self.seen.add(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("weights", ["bf16", "int8", "int4"])
@pytest.mark.parametrize("fused", [True, False])
def test_one_row_forward_runs_no_aten_matmul(weights, fused) -> None:
    """With the C++ kernels, every linear and the attention of a one-row bf16 forward, and its
    logits, run in them: no ATen matmul, so no setting of oneDNN can change a decode step's bits."""
    if weights == "bf16" and cpu_ext.kernel_paths()["bf16_linear"] == 0:
        pytest.skip("no bf16 linear kernel at this level: bf16 weights stay on ATen")
    model = _model(_args("qwen2", 4, 2, 32), torch.bfloat16, weights)
    model.fuse_cpu_layers = fused
    cache = model.new_cache(16)
    p, mask = torch.tensor([3]), torch.ones(1, 4, dtype=torch.bool)
    with _AtenMatmuls() as ops:
        model.logits(model(torch.tensor([7]), p, cache, p, mask))
    assert ops.seen == set()


def test_rebuilt_when_the_weights_are_repacked() -> None:
    model = _model(_args("qwen2", 4, 2, 16), torch.float32, "int8")
    first = model._cpu_decoder(1)
    kernels.quantize_model_(model.model.layers[1], "int8", group_size=32)  # a no-op on packed layers
    assert model._cpu_decoder(1) is first
    model.model.layers[1].mlp.down_proj.weight = kernels.quantize_int4(torch.randn(64, 192), 32)
    assert model._cpu_decoder(1) is not first
    fused, _ = _calls(model, fused=True)
    plain, _ = _calls(model, fused=False)
    assert all(torch.equal(a, b) for a, b in zip(fused, plain))


def test_not_used_where_it_does_not_apply() -> None:
    args = _args("llama", 4, 2, 16)
    plain = Transformer(args, dtype=torch.float32)  # unpacked weights run ATen
    assert plain._cpu_decoder(1) is None
    model = _model(args, torch.float32, "int8")
    assert model._cpu_decoder(kernels.MAX_DECODER_ROWS) is not None
    assert model._cpu_decoder(kernels.MAX_DECODER_ROWS + 1) is None  # prefill-sized calls
    assert model._cpu_decoder(0) is None


def test_bad_slot_is_a_clear_error() -> None:
    model = _model(_args("llama", 4, 2, 16), torch.float32, "int8")
    cache = model.new_cache(8)
    with pytest.raises(RuntimeError, match="slot out of range"):
        model(torch.tensor([1]), torch.tensor([0]), cache, torch.tensor([8]), torch.ones(1, 1, dtype=torch.bool))
