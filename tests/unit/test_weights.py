"""Weight loading: GGUF names/metadata/header reader, HF dirs, the conversion and tokenizer caches, load_model."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFReader
from gguf.quants import dequantize as gguf_dequantize
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from swiftspec.config import LoadConfig
from swiftspec.model.args import RopeScaling
from swiftspec.runner.model_runner import causal_mask
from swiftspec.testing.tiny import make_tiny_checkpoint, write_gguf
from swiftspec.weights import tokenizer_cache
from swiftspec.weights.gguf import (
    GGUFCheckpoint,
    gguf_to_hf_name,
    hf_to_gguf_name,
    llama3_factors,
    llama3_scaling_from_factors,
    llama_permute,
    llama_unpermute,
)
from swiftspec.weights.gguf_reader import FastReader, PackedArray
from swiftspec.weights.loader import load_model, load_tokenizer
from swiftspec.weights.safetensors import open_hf_dir

DIRS = {"qwen2": "tiny_qwen_dir", "llama": "tiny_llama_dir"}
NAMES = [
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output.weight", "lm_head.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"),
    ("blk.11.attn_k.bias", "model.layers.11.self_attn.k_proj.bias"),
    ("blk.2.attn_v.weight", "model.layers.2.self_attn.v_proj.weight"),
    ("blk.2.attn_output.weight", "model.layers.2.self_attn.o_proj.weight"),
    ("blk.3.ffn_gate.weight", "model.layers.3.mlp.gate_proj.weight"),
    ("blk.3.ffn_up.weight", "model.layers.3.mlp.up_proj.weight"),
    ("blk.3.ffn_down.weight", "model.layers.3.mlp.down_proj.weight"),
    ("blk.4.attn_norm.weight", "model.layers.4.input_layernorm.weight"),
    ("blk.4.ffn_norm.weight", "model.layers.4.post_attention_layernorm.weight"),
]


@pytest.mark.parametrize("gguf_name,hf_name", NAMES)
def test_name_mapping_both_ways(gguf_name: str, hf_name: str) -> None:
    assert gguf_to_hf_name(gguf_name) == hf_name
    assert hf_to_gguf_name(hf_name) == gguf_name


def test_unknown_names_map_to_none() -> None:
    assert gguf_to_hf_name("blk.0.attn_k_norm.weight") is None
    assert gguf_to_hf_name("rope_freqs.weight") is None


def test_llama_unpermute_inverts_permute() -> None:
    w = np.arange(8 * 16 * 3, dtype=np.float32).reshape(8 * 16, 3)  # 8 heads of dim 16
    assert not np.array_equal(llama_permute(w, 8), w)
    np.testing.assert_array_equal(llama_unpermute(llama_permute(w, 8), 8), w)
    # llama.cpp pairs rotary halves: row j of a head comes from rows j//2 (+ dim/2 when odd)
    assert llama_permute(w, 8)[1, 0] == w[8, 0]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("qtype,tol", [("F32", 0.0), ("F16", 1e-3), ("Q8_0", 1e-2)])
def test_gguf_matches_safetensors(arch: str, qtype: str, tol: float, request, tmp_path: Path) -> None:
    hf_dir = request.getfixturevalue(DIRS[arch])
    ref = open_hf_dir(hf_dir)
    ckpt = GGUFCheckpoint(write_gguf(hf_dir, tmp_path / "m.gguf", qtype))
    assert ckpt.args == ref.args
    want, got = dict(ref.tensors(torch.float32)), dict(ckpt.tensors(torch.float32))
    assert got.keys() == want.keys()
    for name, w in want.items():
        assert (got[name] - w).abs().max() <= tol * w.abs().max(), name


def test_fast_reader_reads_what_gguf_py_reads(tiny_qwen_dir: Path, tmp_path: Path) -> None:
    path = write_gguf(tiny_qwen_dir, tmp_path / "m.gguf", "Q8_0")
    ours, ref = FastReader(path), GGUFReader(path)
    assert list(ours.fields) == list(ref.fields)
    for key, field in ref.fields.items():
        assert ours.fields[key].types == field.types and ours.fields[key].contents() == field.contents(), key
    arrays = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges")
    assert all(isinstance(ours.fields[key], PackedArray) for key in arrays)
    for key in arrays:
        for index in (0, 7, -1, slice(3, 9)):
            assert ours.fields[key].contents(index) == ref.fields[key].contents(index), (key, index)
    tensors = [(t.name, t.tensor_type, t.data_offset, t.data.tobytes()) for t in ref.tensors]
    assert [(t.name, t.tensor_type, t.data_offset, t.data.tobytes()) for t in ours.tensors] == tensors


def test_gguf_args_read_metadata(tiny_llama_dir: Path, tmp_path: Path) -> None:
    args = GGUFCheckpoint(write_gguf(tiny_llama_dir, tmp_path / "m.gguf")).args
    assert (args.arch, args.num_layers, args.num_heads, args.num_kv_heads, args.head_dim) == ("llama", 2, 4, 2, 16)
    assert args.rms_norm_eps == 1e-6 and not args.tie_word_embeddings and not args.qkv_bias


def test_llama3_rope_scaling_recovered_from_factors() -> None:
    s = RopeScaling(kind="llama3", factor=8.0, original_max_position=8192)
    factors = llama3_factors(s, head_dim=128, theta=500000.0)
    assert factors.min() == 1.0 and factors.max() == 8.0
    assert llama3_scaling_from_factors(factors, 128, 500000.0, 8192) == s
    with pytest.raises(Exception, match="unsupported rope_freqs"):
        llama3_scaling_from_factors(factors[::-1].copy(), 128, 500000.0, 8192)


def test_sharded_hf_dir(tiny_qwen_dir: Path, tmp_path: Path) -> None:
    tensors = load_file(tiny_qwen_dir / "model.safetensors")
    names = sorted(tensors)
    shards = {"a.safetensors": names[::2], "b.safetensors": names[1::2]}
    for file, part in shards.items():
        save_file({n: tensors[n] for n in part}, str(tmp_path / file))
    weight_map = {n: f for f, part in shards.items() for n in part}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (tmp_path / "config.json").write_text((tiny_qwen_dir / "config.json").read_text())
    got = dict(open_hf_dir(tmp_path).tensors(torch.float32))
    assert got.keys() == tensors.keys()
    assert all(torch.equal(got[n], tensors[n]) for n in names)


def test_tokenizer_cache_hit_and_invalidation(tiny_qwen_dir: Path, tmp_path: Path, monkeypatch) -> None:
    gguf = write_gguf(tiny_qwen_dir, tmp_path / "m.gguf")
    cache = tmp_path / "cache"
    out = tokenizer_cache.ensure_tokenizer(gguf, cache)
    assert out == tokenizer_cache.tokenizer_dir(gguf, cache) and (out / "tokenizer.json").is_file()
    assert [p.name for p in cache.iterdir()] == ["tokenizers"] and [p.name for p in out.parent.iterdir()] == [out.name]
    with monkeypatch.context() as m:  # a hit must not convert the tokenizer again
        m.setattr(tokenizer_cache.Tokenizer, "from_gguf", None)
        assert tokenizer_cache.ensure_tokenizer(gguf, cache) == out
        tok = load_tokenizer(gguf, cache)
    text = "def add(a, b):\n    return a + b"
    assert tok.encode(text) == load_tokenizer(tiny_qwen_dir).encode(text)
    tokenizer_cache.Tokenizer.from_gguf(gguf).save(tmp_path / "own")  # as transformers finds the class alone
    for file in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / file).read_text() == (tmp_path / "own" / file).read_text()
    os.utime(gguf, ns=(0, 10**9))
    assert tokenizer_cache.tokenizer_dir(gguf, cache) != out


@pytest.mark.parametrize("arch,qtype", [("qwen2", "Q4_K"), ("llama", "Q4_K"), ("llama", "Q8_0")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gguf_tensors_are_gguf_pys_values(arch: str, qtype: str, dtype: torch.dtype, tmp_path: Path) -> None:
    """K-quants and GGUF blocks dequantized by kquant / qblock equal gguf-py's values (llama Q/K rows
    un-permuted) cast to dtype;
    reading a tensor again after its pages were released gives it again."""
    hf = make_tiny_checkpoint(tmp_path / "hf", arch=arch, hidden_size=256, num_layers=1, intermediate_size=512)
    ckpt = GGUFCheckpoint(write_gguf(hf, tmp_path / "m.gguf", qtype))
    got = dict(ckpt.tensors(dtype, skip=frozenset({"model.norm.weight"})))
    assert set(got) == {s.hf_name for s in ckpt.specs} - {"model.norm.weight"}
    n_heads = {".q_proj.": ckpt.args.num_heads, ".k_proj.": ckpt.args.num_kv_heads}
    for spec in ckpt.specs:
        if spec.hf_name == "model.norm.weight":
            continue
        raw = ckpt._tensors[spec.gguf_name]
        w = gguf_dequantize(raw.data, raw.tensor_type).reshape(spec.shape)
        heads = [n for part, n in n_heads.items() if part in spec.hf_name and arch == "llama"]
        want = torch.from_numpy(np.array(llama_unpermute(w, heads[0]) if heads else w)).to(dtype)
        assert torch.equal(got[spec.hf_name], want), spec.hf_name
    assert all(torch.equal(t, got[name]) for name, t in ckpt.tensors(dtype, skip=frozenset({"model.norm.weight"})))


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    n = len(ids)
    pos = torch.arange(n)
    with torch.no_grad():
        return model.logits(model(ids, pos, model.new_cache(32), pos, causal_mask(0, n, "cpu")))


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_load_model_dir_and_gguf_agree(arch: str, request, tmp_path: Path) -> None:
    hf_dir = request.getfixturevalue(DIRS[arch])
    gguf = write_gguf(hf_dir, tmp_path / "m.gguf")
    load = LoadConfig(dtype="float32")
    a = load_model(str(hf_dir), load)
    b = load_model(str(gguf), load, cache=tmp_path / "cache")
    assert a.path == hf_dir and b.path == gguf and a.args == b.args
    assert a.tokenizer.encode("def add(a, b):") == b.tokenizer.encode("def add(a, b):")
    ids = torch.tensor(a.tokenizer.encode("def fibonacci(n):\n    return n"))
    torch.testing.assert_close(_logits(a.model, ids), _logits(b.model, ids), rtol=0, atol=1e-5)
