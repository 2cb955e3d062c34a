"""Our Transformer against transformers' Llama/Qwen2 on tiny random models: prefill, cached decode, tree branches."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from swiftspec.model import ModelArgs, RopeScaling, Transformer, WeightLoadError
from swiftspec.model.hf_args import model_args
from swiftspec.model.layers import RotaryEmbedding

ATOL = 1e-4
PREFILL, DECODE_STEPS = 12, 16
COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              head_dim=16, rms_norm_eps=1e-6)
# Hub-style config.json dictionaries (the format model/hf_args.model_args reads).
LLAMA = dict(COMMON, model_type="llama", num_key_value_heads=2, rope_theta=500000.0, tie_word_embeddings=False,
             max_position_embeddings=128,
             # small original length so all three llama3 frequency bands occur at head_dim 16
             rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                               original_max_position_embeddings=64))
QWEN2 = dict(COMMON, model_type="qwen2", num_key_value_heads=1, rope_theta=1000000.0, tie_word_embeddings=True,
             max_position_embeddings=256)
CONFIGS = {"llama": (LLAMA, LlamaConfig, LlamaForCausalLM), "qwen2": (QWEN2, Qwen2Config, Qwen2ForCausalLM)}


def _hf_model(arch: str) -> torch.nn.Module:
    raw, config_cls, model_cls = CONFIGS[arch]
    config = config_cls(**{k: v for k, v in raw.items() if k != "model_type"}, attn_implementation="eager")
    torch.manual_seed(0)
    hf = model_cls(config).float().eval()
    with torch.no_grad():  # HF zero-inits biases and one-inits norms; randomise everything
        for name, param in hf.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
            else:
                param.normal_(0.0, 0.1)
    return hf


def _checkpoint(hf: torch.nn.Module, tied: bool) -> list[tuple[str, torch.Tensor]]:
    """The state dict as HF safetensors hold it: tied checkpoints have no lm_head.weight."""
    return [(n, t) for n, t in hf.state_dict().items() if not (tied and n == "lm_head.weight")]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def pair(request):
    arch = request.param
    hf = _hf_model(arch)
    args = model_args(CONFIGS[arch][0])
    ours = Transformer(args, dtype=torch.float32)
    ours.load_weights(_checkpoint(hf, args.tie_word_embeddings))
    return hf, ours


def _hf_logits(hf: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf(input_ids=tokens[None]).logits[0].float()  # [T, vocab]


def _forward(model: Transformer, cache, tokens, positions, slots, mask) -> torch.Tensor:
    with torch.no_grad():
        return model.logits(model(tokens, positions, cache, slots, mask))


def _causal_mask(num_tokens: int) -> torch.Tensor:
    return torch.ones(num_tokens, num_tokens, dtype=torch.bool).tril()


def test_args_from_config():
    args = model_args(LLAMA)
    assert args.rope_scaling.kind == "llama3" and args.rope_scaling.original_max_position == 64
    assert not args.qkv_bias and not args.tie_word_embeddings
    qwen = model_args(QWEN2)
    assert qwen.qkv_bias and qwen.tie_word_embeddings and qwen.num_kv_heads == 1


def test_rope_tables_grow():
    scaling = RopeScaling(kind="llama3", factor=8.0, original_max_position=64)
    rope = RotaryEmbedding(16, 500000.0, scaling, 8, torch.float32, "cpu")
    rope.ensure(100)
    assert rope.length >= 100
    full = RotaryEmbedding(16, 500000.0, scaling, rope.length, torch.float32, "cpu")
    torch.testing.assert_close(rope.cos, full.cos, rtol=0, atol=0)
    angles = rope.angles(torch.tensor([3, 99]))
    assert angles.cos.shape == (2, 1, 16)
    torch.testing.assert_close(angles.sin[1, 0], full.sin[99], rtol=0, atol=0)


def test_prefill_and_decode_match_hf(pair):
    hf, ours = pair
    torch.manual_seed(1)
    total = PREFILL + DECODE_STEPS
    tokens = torch.randint(0, 256, (total,))
    expected = _hf_logits(hf, tokens)  # [total, vocab]; full causal pass, no cache
    cache = ours.new_cache(64)
    prefill = torch.arange(PREFILL)
    got = _forward(ours, cache, tokens[:PREFILL], prefill, prefill, _causal_mask(PREFILL))
    assert got.dtype == torch.float32
    assert (got - expected[:PREFILL]).abs().max() < ATOL
    for pos in range(PREFILL, total):
        at = torch.tensor([pos])
        mask = torch.ones(1, pos + 1, dtype=torch.bool)
        got = _forward(ours, cache, tokens[pos : pos + 1], at, at, mask)
        assert (got[0] - expected[pos]).abs().max() < ATOL, f"decode step at position {pos}"


def test_tree_branches_match_causal_paths(pair):
    """vLLM's branch check: one tree forward over a cached prefix == causal decoding of each path."""
    hf, ours = pair
    torch.manual_seed(2)
    prefix_len = 8
    parents = [-1, 0, 0, 1, 1, 2, 4, 6]  # parent index < child index; node 0 is the root
    prefix = torch.randint(0, 256, (prefix_len,))
    nodes = torch.randint(0, 256, (len(parents),))
    paths = [_path(parents, n) for n in range(len(parents))]
    ancestors = torch.zeros(len(parents), len(parents), dtype=torch.bool)
    for n, path in enumerate(paths):
        ancestors[n, path] = True
    depth = torch.tensor([len(p) - 1 for p in paths])

    cache = ours.new_cache(32)
    at = torch.arange(prefix_len)
    _forward(ours, cache, prefix, at, at, _causal_mask(prefix_len))
    mask = torch.cat((torch.ones(len(parents), prefix_len, dtype=torch.bool), ancestors), dim=1)
    slots = prefix_len + torch.arange(len(parents))
    got = _forward(ours, cache, nodes, prefix_len + depth, slots, mask)  # [nodes, vocab]

    for n, path in enumerate(paths):
        expected = _hf_logits(hf, torch.cat((prefix, nodes[path])))[-1]
        assert (got[n] - expected).abs().max() < ATOL, f"tree node {n} (path {path})"


def _path(parents: list[int], node: int) -> list[int]:
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


def test_bf16_close_to_fp32(pair):
    hf, ours = pair
    args = ours.args
    low = Transformer(args, dtype=torch.bfloat16)
    low.load_weights(_checkpoint(hf, args.tie_word_embeddings))
    assert low.model.layers[0].mlp.down_proj.weight.dtype == torch.bfloat16
    tokens = torch.randint(0, 256, (PREFILL,))
    at = torch.arange(PREFILL)
    full = _forward(ours, ours.new_cache(16), tokens, at, at, _causal_mask(PREFILL))
    half = _forward(low, low.new_cache(16), tokens, at, at, _causal_mask(PREFILL))
    assert half.dtype == torch.float32
    assert (half - full).abs().max() < 0.05 * full.abs().max()


def test_load_weights_reports_missing_and_unexpected(pair):
    hf, ours = pair
    named = [(n, t) for n, t in _checkpoint(hf, ours.args.tie_word_embeddings) if "layers.1.mlp.up_proj" not in n]
    named.append(("model.layers.0.self_attn.rogue.weight", torch.zeros(1)))
    fresh = Transformer(ours.args, dtype=torch.float32)
    with pytest.raises(WeightLoadError, match=r"missing 1 \(model\.layers\.1\.mlp\.up_proj\.weight\).*"
                                              r"unexpected 1 \(model\.layers\.0\.self_attn\.rogue\.weight\)"):
        fresh.load_weights(named)


def test_load_weights_rejects_wrong_shape(pair):
    hf, ours = pair
    named = dict(_checkpoint(hf, ours.args.tie_word_embeddings))
    named["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(3, 64)
    with pytest.raises(WeightLoadError, match="k_proj"):
        Transformer(ours.args, dtype=torch.float32).load_weights(named.items())
