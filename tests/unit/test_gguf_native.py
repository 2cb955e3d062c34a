"""`--weights gguf` loading (weights/gguf_native.py): the file's K-quant and Q8_0 / Q5_0 / Q4_0 linears are packed
from its blocks, fused in the model's row order (llama Q/K rows un-permuted), and their dequantized
values are the file's, bit for bit; a forward runs through the K-quant kernels.  Such a load reads
the file alone (only its tokenizer is cached) and gives the tensors of a dense (bf16) load."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from swiftspec.config import LoadConfig
from swiftspec.kernels.packed import PackedWeight
from swiftspec.kernels.quant_ref import dequantize
from swiftspec.runner.load import load_target
from swiftspec.testing.tiny import make_tiny_checkpoint, write_gguf
from swiftspec.weights.gguf import GGUFCheckpoint
from swiftspec.weights.loader import load_model
from swiftspec.weights.tokenizer_cache import tokenizer_dir

pytest.importorskip("gguf")


def _fmt(qtype: str, parts: list[str]) -> str:
    """The packed format of a fused linear of these parts in a file written as qtype (write_gguf)."""
    if qtype in ("Q4_K", "Q5_K"):
        return "q6k" if {"v_proj", "down_proj"} & set(parts) else qtype[0].lower() + qtype[1] + "k"
    return qtype.lower()


@pytest.mark.parametrize("arch,qtype", [("qwen2", "Q4_K"), ("llama", "Q4_K"), ("llama", "Q5_K"), ("qwen2", "Q8_0"),
                                        ("llama", "Q5_0"), ("qwen2", "Q4_0")])
def test_gguf_linears_are_the_files_blocks(arch: str, qtype: str, tmp_path: Path, tmp_cache: Path) -> None:
    hf = make_tiny_checkpoint(tmp_path / "hf", arch=arch, hidden_size=256, num_layers=1, num_heads=4,
                              num_kv_heads=2, intermediate_size=512, tie_word_embeddings=False)
    path = write_gguf(hf, tmp_path / "m.gguf", qtype)
    model = load_target(str(path), LoadConfig(dtype="bfloat16", weights="gguf")).model
    file = dict(GGUFCheckpoint(path).tensors(torch.float32))  # dequantized by gguf-py, HF names and order
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    fused = {
        attn.qkv_proj: ["q_proj", "k_proj", "v_proj"], attn.o_proj: ["o_proj"],
        mlp.gate_up_proj: ["gate_proj", "up_proj"], mlp.down_proj: ["down_proj"],
    }
    for module, parts in fused.items():
        qw = module.weight
        assert isinstance(qw, PackedWeight) and qw.fmt == _fmt(qtype, parts)
        prefix = "model.layers.0.self_attn." if parts[0].endswith(("q_proj", "o_proj")) else "model.layers.0.mlp."
        want = torch.cat([file[f"{prefix}{p}.weight"] for p in parts])
        assert torch.equal(dequantize(qw), want), parts
    assert model.lm_head.weight.fmt == _fmt(qtype, ["lm_head"])
    assert torch.equal(dequantize(model.lm_head.weight), file["lm_head.weight"])
    pos = torch.arange(5)
    hidden = model(torch.arange(5), pos, model.new_cache(8), pos, torch.ones(5, 5, dtype=torch.bool).tril())
    assert np.isfinite(model.logits(hidden).float().numpy()).all()


@pytest.mark.parametrize("arch,qtype", [("qwen2", "Q4_K"), ("llama", "Q4_K"), ("llama", "Q8_0")])
def test_gguf_load_reads_the_file_alone(arch: str, qtype: str, tmp_path: Path) -> None:
    hf = make_tiny_checkpoint(tmp_path / "hf", arch=arch, hidden_size=256, num_layers=1, num_heads=4,
                              num_kv_heads=2, intermediate_size=512)
    path = write_gguf(hf, tmp_path / "m.gguf", qtype)
    load = LoadConfig(dtype="bfloat16", weights="gguf")
    cache = tmp_path / "cache"
    got = load_model(str(path), load, cache=cache)
    assert sorted(p.name for p in cache.iterdir()) == ["tokenizers"]  # no converted copy
    assert [p.name for p in (cache / "tokenizers").iterdir()] == [tokenizer_dir(path, cache).name]
    dense = load_model(str(path), dataclasses.replace(load, weights="bf16"), cache=tmp_path / "dense")
    assert sorted(p.name for p in (tmp_path / "dense").iterdir()) == ["tokenizers"] and got.args == dense.args
    packed = 0
    for name, want in dense.model.named_parameters():  # every tensor, as the dense load holds it
        module, _, attr = name.rpartition(".")
        have = getattr(got.model.get_submodule(module), attr)
        if isinstance(have, PackedWeight):
            packed += 1
            have = dequantize(have).to(want.dtype)  # the file's fp32 values, rounded as the dense load does
        assert have.dtype == want.dtype and torch.equal(have, want), name
    linears = 4 if arch == "qwen2" else 5  # qkv, o, gate_up, down (+ the head where it is not tied)
    assert packed == linears
    text = "def add(a, b):\n    return a + b  # ünï"
    assert got.tokenizer.encode(text) == dense.tokenizer.encode(text)
