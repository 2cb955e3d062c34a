"""The default context length: the model's own, within a share of the free memory; a full context
is a clear error, never a crash."""

from __future__ import annotations

from pathlib import Path

import pytest

from swiftspec.config import EngineConfig, LoadConfig
from swiftspec.engines.ar import AutoregressiveEngine
from swiftspec.errors import UserError
from swiftspec.runner import load
from swiftspec.sampling import SamplingParams
from swiftspec.weights.loader import load_model, model_args


def _config(target: Path, draft: Path, mode: str = "tree", max_seq_len: int = 0) -> EngineConfig:
    lc = LoadConfig(dtype="float32", max_seq_len=max_seq_len)
    return EngineConfig(mode=mode, target=str(target), draft=str(draft), target_load=lc, draft_load=lc)


def test_context_defaults_to_the_models_own(tiny_qwen_dir: Path, tiny_draft_dir: Path) -> None:
    resolved = load.resolve_context(_config(tiny_qwen_dir, tiny_draft_dir))
    want = model_args(tiny_qwen_dir).max_position_embeddings
    assert resolved.target_load.max_seq_len == resolved.draft_load.max_seq_len == want
    given = _config(tiny_qwen_dir, tiny_draft_dir, max_seq_len=100)
    assert load.resolve_context(given) is given


def test_context_is_capped_by_free_memory(tiny_qwen_dir: Path, tiny_draft_dir: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    args = model_args(tiny_qwen_dir)
    per_token = 2 * args.num_layers * args.num_kv_heads * args.head_dim * 4  # fp32 K and V
    draft = model_args(tiny_draft_dir)
    per_token += 2 * draft.num_layers * draft.num_kv_heads * draft.head_dim * 4
    monkeypatch.setattr(load, "free_memory", lambda device: 300 * per_token / load.KV_MEMORY_SHARE)
    tree = load.resolve_context(_config(tiny_qwen_dir, tiny_draft_dir))
    assert tree.target_load.max_seq_len == load.CONTEXT_STEP  # 300 tokens fit: one step of 256
    monkeypatch.setattr(load, "free_memory", lambda device: 0)
    assert load.resolve_context(_config(tiny_qwen_dir, tiny_draft_dir)).target_load.max_seq_len == load.CONTEXT_STEP


def test_a_full_context_is_a_clear_error_and_clips_new_tokens(tiny_qwen_dir: Path) -> None:
    engine = AutoregressiveEngine(load_model(str(tiny_qwen_dir), LoadConfig(dtype="float32", max_seq_len=32)), 32)
    with pytest.raises(UserError, match="the context holds 32"):
        engine.generate(list(range(3, 35)), SamplingParams(), 4)
    generation = engine.generate(list(range(3, 30)), SamplingParams(), 100)
    assert sum(len(chunk) for chunk in generation) <= 32 - 27
