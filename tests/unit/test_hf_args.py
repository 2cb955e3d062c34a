"""config.json -> ModelArgs for the families beyond Llama/Qwen2, and RoPE frequencies bit-exact
against transformers' own rope_init functions."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from swiftspec.config import ConfigError
from swiftspec.model import ModelArgs
from swiftspec.model.hf_args import model_args
from swiftspec.model.layers import RotaryEmbedding, rope_inv_freq

BASE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
            num_key_value_heads=1, head_dim=32, max_position_embeddings=4096)


@pytest.mark.parametrize("scaling", [
    dict(rope_type="linear", factor=4.0),
    dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
         original_max_position_embeddings=256),
    dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=1024),
    dict(rope_type="yarn", factor=8.0, original_max_position_embeddings=512, beta_fast=16, beta_slow=2,
         truncate=False),
    dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=1024, mscale=0.707, mscale_all_dim=0.707),
])
def test_inv_freq_and_attention_factor_equal_transformers(scaling) -> None:
    theta = 500000.0
    hf_config = LlamaConfig(**BASE, rope_parameters=dict(scaling, rope_theta=theta))
    want, factor = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](hf_config, "cpu")
    args = model_args(dict(BASE, model_type="llama", rope_scaling=scaling, rope_theta=theta))
    assert torch.equal(rope_inv_freq(args.head_dim, theta, args.rope_scaling), want)
    rope = RotaryEmbedding(args.head_dim, theta, args.rope_scaling, 16, torch.float32, "cpu")
    assert rope.attention_factor == pytest.approx(factor, rel=1e-12)


def test_gemma3_transformers4_config() -> None:
    """The hub's Gemma 3 text config.json (transformers 4): rope_local_base_freq, a window pattern."""
    cfg = dict(BASE, model_type="gemma3_text", rope_theta=1e6, rope_local_base_freq=10000.0, sliding_window=512,
               sliding_window_pattern=3, query_pre_attn_scalar=256, hidden_activation="gelu_pytorch_tanh")
    args = model_args(cfg)
    assert (args.arch, args.gemma, args.qk_norm, args.tie_word_embeddings) == ("gemma3", True, True, True)
    assert args.sliding_layers == (True, True, False, True, True, False)
    assert (args.rope_theta, args.local_rope_theta, args.query_pre_attn_scalar) == (1e6, 10000.0, 256.0)
    assert not args.plain and args.slides(0) and not args.slides(2)


def test_gemma2_alternates_and_mistral_slides_everywhere() -> None:
    gemma2 = model_args(dict(BASE, model_type="gemma2", sliding_window=4096,
                                           attn_logit_softcapping=50.0, final_logit_softcapping=30.0))
    assert gemma2.sliding_layers == (True, False) * 3 and gemma2.attn_softcap == 50.0 and not gemma2.qk_norm
    mistral = model_args(dict(BASE, model_type="mistral", sliding_window=1024))
    assert mistral.arch == "llama" and mistral.plain and mistral.sliding_layers == () and mistral.slides(5)
    assert model_args(dict(BASE, model_type="mistral", sliding_window=None)).sliding_window is None


@pytest.mark.parametrize("cfg,message", [
    (dict(model_type="gemma3"), "a multimodal Gemma 3: use its text-only checkpoint"),
    (dict(model_type="gemma3_text", use_bidirectional_attention=True), "bidirectional attention"),
    (dict(model_type="qwen3", use_sliding_window=True, sliding_window=4096), "use_sliding_window"),
    (dict(model_type="gemma2", hidden_activation="gelu"), "unsupported activation 'gelu'"),
    (dict(model_type="llama", rope_scaling=dict(rope_type="longrope", factor=2.0)), "unsupported rope scaling"),
])
def test_unsupported_settings_are_one_line_errors(cfg, message) -> None:
    with pytest.raises(ConfigError, match=message):
        model_args(dict(BASE, **cfg))
