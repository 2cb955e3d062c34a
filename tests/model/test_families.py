"""Qwen3, Llama with YaRN/linear RoPE, Mistral, Gemma 2 and Gemma 3 (text) against transformers.

Each family is a tiny random model that transformers builds offline from a config and saves with
save_pretrained; SwiftSpec loads the directory (config.json, safetensors, tokenizer) and its fp32
logits must match transformers' eager ones within ATOL over a prefill and cached decode steps. The
sliding windows are shorter than the sequence, so windowed layers really drop keys.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

from swiftspec.config import LoadConfig
from swiftspec.testing.tiny import add_tokenizer
from swiftspec.weights.loader import load_model

ATOL = 1e-4  # fp32, logits of O(1)
VOCAB, PREFILL, DECODE_STEPS, WINDOW = 512, 10, 6, 5  # the tiny BPE needs 512 for merges
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6, attn_implementation="eager")
GEMMA = dict(COMMON, query_pre_attn_scalar=24, sliding_window=WINDOW, hidden_activation="gelu_pytorch_tanh")
FAMILIES = {
    # head_dim 32 != hidden / heads
    "qwen3": ("Qwen3", "Qwen3", dict(COMMON, head_dim=32, num_hidden_layers=2, tie_word_embeddings=False,
                            rope_parameters=dict(rope_type="default", rope_theta=1e6))),
    "llama-yarn": ("Llama", "Llama", dict(COMMON, num_hidden_layers=2, rope_parameters=dict(
        rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=64))),
    "llama-linear": ("Llama", "Llama", dict(COMMON, num_hidden_layers=2, rope_parameters=dict(
        rope_type="linear", rope_theta=10000.0, factor=2.0))),
    "mistral": ("Mistral", "Mistral", dict(COMMON, num_hidden_layers=2, sliding_window=WINDOW)),
    "gemma2": ("Gemma2", "Gemma2", dict(GEMMA, num_hidden_layers=2, attn_logit_softcapping=1.5, final_logit_softcapping=3.0)),
    "gemma3": ("Gemma3Text", "Gemma3", dict(GEMMA, num_hidden_layers=3, layer_types=[
        "sliding_attention", "full_attention", "sliding_attention"], rope_parameters=dict(
        full_attention=dict(rope_type="linear", rope_theta=1e6, factor=2.0),
        sliding_attention=dict(rope_type="default", rope_theta=10000.0)))),
}
FP32 = LoadConfig(dtype="float32", max_seq_len=64)


def hf_family_model(family: str, seed: int = 0, overrides: dict | None = None) -> torch.nn.Module:
    """A transformers model of `family` (config entries replaced by overrides) with every parameter
    random (norms near their identity)."""
    config_prefix, model_prefix, raw = FAMILIES[family]
    config = getattr(transformers, f"{config_prefix}Config")(**(raw | (overrides or {})))
    model_cls = getattr(transformers, f"{model_prefix}ForCausalLM")
    torch.manual_seed(seed)
    hf = model_cls(config).float().eval()
    gemma = family.startswith("gemma")
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if "norm" in name:
                param.uniform_(-0.5, 0.5) if gemma else param.uniform_(0.5, 1.5)
            else:
                param.normal_(0.0, 0.1)
    return hf


def save_family(family: str, path, seed: int = 0, overrides: dict | None = None) -> torch.nn.Module:
    """hf_family_model saved as an HF directory with the tiny tokenizer; returns the model."""
    hf = hf_family_model(family, seed, overrides)
    hf.save_pretrained(path)
    add_tokenizer(path, VOCAB)
    return hf


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    hf = save_family(request.param, path)
    return request.param, hf, load_model(str(path), FP32)


def _hf_logits(hf: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf(input_ids=tokens[None]).logits[0].float()  # [T, vocab]


def _forward(model, cache, tokens, positions, slots, mask) -> torch.Tensor:
    with torch.no_grad():
        return model.logits(model(tokens, positions, cache, slots, mask))


def test_family_prefill_and_decode_match_transformers(family):
    name, hf, loaded = family
    torch.manual_seed(1)
    total = PREFILL + DECODE_STEPS
    tokens = torch.randint(0, VOCAB, (total,))
    expected = _hf_logits(hf, tokens)  # [total, vocab]
    ours = loaded.model
    cache = ours.new_cache(64)
    at = torch.arange(PREFILL)
    got = _forward(ours, cache, tokens[:PREFILL], at, at, torch.ones(PREFILL, PREFILL, dtype=torch.bool).tril())
    assert (got - expected[:PREFILL]).abs().max() < ATOL, name
    for pos in range(PREFILL, total):
        at = torch.tensor([pos])
        got = _forward(ours, cache, tokens[pos : pos + 1], at, at, torch.ones(1, pos + 1, dtype=torch.bool))
        assert (got[0] - expected[pos]).abs().max() < ATOL, f"{name}: decode at position {pos}"


def test_family_tree_branches_match_causal_paths(family):
    """Windowed layers on a token tree: each node's logits equal the causal pass over its path."""
    name, hf, loaded = family
    torch.manual_seed(2)
    prefix_len, parents = 6, [-1, 0, 0, 1, 3, 4]
    prefix, nodes = torch.randint(0, VOCAB, (prefix_len,)), torch.randint(0, VOCAB, (len(parents),))
    paths = []
    for n in range(len(parents)):
        path = [n]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        paths.append(path[::-1])
    ancestors = torch.zeros(len(parents), len(parents), dtype=torch.bool)
    for n, path in enumerate(paths):
        ancestors[n, path] = True
    ours = loaded.model
    cache = ours.new_cache(32)
    at = torch.arange(prefix_len)
    _forward(ours, cache, prefix, at, at, torch.ones(prefix_len, prefix_len, dtype=torch.bool).tril())
    mask = torch.cat((torch.ones(len(parents), prefix_len, dtype=torch.bool), ancestors), dim=1)
    depth = torch.tensor([len(p) - 1 for p in paths])
    got = _forward(ours, cache, nodes, prefix_len + depth, prefix_len + torch.arange(len(parents)), mask)
    for n, path in enumerate(paths):
        expected = _hf_logits(hf, torch.cat((prefix, nodes[path])))[-1]
        assert (got[n] - expected).abs().max() < ATOL, f"{name}: tree node {n} (path {path})"


@pytest.mark.parametrize("weights", ["bf16", "gguf"])  # through the conversion cache; straight from the file
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_gguf_round_trip_matches_transformers(name, weights, tmp_path, tmp_cache):
    """The family exported as a llama.cpp-style F32 GGUF loads to the same logits."""
    from swiftspec.testing.tiny import write_gguf

    overrides = {"query_pre_attn_scalar": 16} if name.startswith("gemma") else {}  # what a GGUF implies
    hf = save_family(name, tmp_path / "hf", overrides=overrides)
    path = write_gguf(tmp_path / "hf", tmp_path / "m.gguf")
    loaded = load_model(str(path), LoadConfig(dtype="float32", max_seq_len=64, weights=weights))
    assert loaded.args == load_model(str(tmp_path / "hf"), FP32).args
    torch.manual_seed(3)
    tokens = torch.randint(0, VOCAB, (PREFILL,))
    at = torch.arange(PREFILL)
    ours = loaded.model
    got = _forward(ours, ours.new_cache(64), tokens, at, at, torch.ones(PREFILL, PREFILL, dtype=torch.bool).tril())
    assert (got - _hf_logits(hf, tokens)).abs().max() < ATOL, name


@pytest.mark.usefixtures("one_thread")
def test_gemma3_tree_and_chain_greedy_equal_ar(tmp_path):
    """Speculation is lossless on a family with q/k norms, two RoPEs and sliding layers: a window of
    5 tokens is far shorter than prompt + output, so tree nodes see windows cut inside the prefix."""
    import random

    from swiftspec.config import TreeConfig
    from swiftspec.engines import chain_config
    from swiftspec.engines.ar import AutoregressiveEngine
    from swiftspec.engines.serial import SerialEngine
    from swiftspec.sampling import SamplingParams
    from swiftspec.speculate import TreeDrafter
    from swiftspec.testing.tiny import make_perturbed_draft

    save_family("gemma3", tmp_path / "target")
    make_perturbed_draft(tmp_path / "target", tmp_path / "draft", noise=0.05)
    config = LoadConfig(dtype="float32", max_seq_len=128)
    target, draft = (load_model(str(tmp_path / d), config) for d in ("target", "draft"))
    rng, accepted = random.Random(0), []
    ar = AutoregressiveEngine(target, 128)
    for i in range(6):
        prompt = [rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 12))]
        want = [t for chunk in ar.generate(prompt, SamplingParams(), 24) for t in chunk]
        cfg = TreeConfig(width=rng.randint(2, 4), topk=rng.randint(2, 4), verify_size=rng.randint(3, 8),
                         depth=rng.randint(2, 4), budget=64)
        for tree in (cfg, chain_config(cfg)):
            generation = SerialEngine(target, TreeDrafter(draft.model, tree, 128), tree, 128).generate(
                prompt, SamplingParams(), 24)
            assert [t for chunk in generation for t in chunk] == want, (i, tree)
            accepted.append(generation.stats.acceptance_length)
    assert sum(accepted) / len(accepted) > 2  # the draft is right often enough for trees to matter


@pytest.mark.usefixtures("one_thread")
def test_mistral_window_reaches_the_fused_cpu_decoder(tmp_path):
    """Mistral slides in every layer, so its windowed mask goes to the fused C++ decoder too: bf16
    decode steps past the window give the unfused model's bits, and differ from no window."""
    from swiftspec import kernels
    from swiftspec.kernels import cpu_ext

    if not cpu_ext.available("bf16_linear"):
        pytest.skip("no bf16 CPU kernels here")
    save_family("mistral", tmp_path)
    runs = {}
    for fused, window in ((True, True), (False, True), (True, False)):
        model = load_model(str(tmp_path), LoadConfig(dtype="bfloat16", max_seq_len=64)).model
        if not window:
            model.args = dataclasses.replace(model.args, sliding_window=None)
        kernels.prepare_model_(model, "bf16")
        model.fuse_cpu_layers = fused
        cache, outs = model.new_cache(64), []
        for pos in range(3 * WINDOW):
            at = torch.tensor([pos])
            outs.append(_forward(model, cache, torch.tensor([pos % VOCAB + 3]), at, at,
                                 torch.ones(1, pos + 1, dtype=torch.bool)))
        runs[fused, window] = torch.cat(outs)
        assert (model._fused is not None) == fused
    assert torch.equal(runs[True, True], runs[False, True])
    assert not torch.equal(runs[True, True], runs[True, False])


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_gguf_tokenizer_is_transformers_own(name, tmp_path):
    """The tokenizer read from a GGUF by its model type (convert.tokenizer_type, skipping
    transformers' parse of the whole file into a config) is the one AutoTokenizer finds alone."""
    from swiftspec.testing.tiny import write_gguf
    from swiftspec.tokenizer import Tokenizer
    from swiftspec.weights.tokenizer_cache import ensure_tokenizer

    save_family(name, tmp_path / "hf", overrides={"query_pre_attn_scalar": 16} if name.startswith("gemma") else {})
    path = write_gguf(tmp_path / "hf", tmp_path / "m.gguf")
    ours = ensure_tokenizer(path, tmp_path / "cache")
    Tokenizer.from_gguf(path).save(tmp_path / "own")
    for file in ("tokenizer.json", "tokenizer_config.json"):
        assert (ours / file).read_text() == (tmp_path / "own" / file).read_text(), (name, file)
