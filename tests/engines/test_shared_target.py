"""Engines built on one loaded target (build_engine's target argument) keep their own KV caches."""

from __future__ import annotations

import pytest

from conftest import FP32
from swiftspec.config import ConfigError, EngineConfig, TreeConfig
from swiftspec.engines import build_engine
from swiftspec.runner.load import load_target
from swiftspec.sampling import SamplingParams


def test_engines_share_a_loaded_target(tiny_qwen_dir, tiny_draft_dir) -> None:
    target = load_target(str(tiny_qwen_dir), FP32)
    ar = build_engine(EngineConfig(mode="ar", target=str(tiny_qwen_dir), target_load=FP32), target)
    tree = build_engine(EngineConfig(mode="tree", target=str(tiny_qwen_dir), draft=str(tiny_draft_dir),
                                     target_load=FP32, draft_load=FP32, tree=TreeConfig(depth=2)), target)
    assert tree.target.runner.model is ar.runner.model is target.model
    want = [t for chunk in ar.generate([5, 6, 7], SamplingParams(), 24) for t in chunk]
    got, stream = [], tree.generate([5, 6, 7], SamplingParams(), 24)
    for chunk in stream:  # an ar request between two rounds must not touch the tree engine's cache
        got += chunk
        list(ar.generate([9, 8], SamplingParams(), 4))
    assert got == want
    with pytest.raises(ConfigError, match="not sharded"):
        build_engine(EngineConfig(mode="async", target=str(tiny_qwen_dir), draft=str(tiny_draft_dir),
                                  target_load=FP32, draft_load=FP32, target_tp=2), target)
