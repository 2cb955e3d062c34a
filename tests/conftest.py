"""Shared fixtures: tiny random checkpoints (built once per session) and the real default pair."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from swiftspec.testing import make_perturbed_draft, make_tiny_checkpoint
from swiftspec.weights.bundled import BUNDLED, DEFAULT_DRAFT, DEFAULT_TARGET, cache_dir, is_pulled, model_path


@dataclass(frozen=True, slots=True)
class RealPair:
    """The bundled target and draft GGUFs, verified in the cache."""

    target: Path
    draft: Path


@pytest.fixture(scope="session")
def tiny_qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "qwen2", arch="qwen2")


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "llama", arch="llama")


@pytest.fixture(scope="session")
def tiny_draft_dir(tiny_qwen_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A slightly perturbed copy of tiny_qwen_dir: agrees with it often, not always."""
    return make_perturbed_draft(tiny_qwen_dir, tmp_path_factory.mktemp("tiny") / "qwen2-draft")


@pytest.fixture
def tmp_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point SWIFTSPEC_CACHE at an empty per-test directory."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("SWIFTSPEC_CACHE", str(cache))
    return cache


@pytest.fixture(scope="session")
def real_pair() -> RealPair:
    """The real default pair; skips unless both GGUFs are pulled (`swiftspec models pull`)."""
    cache = cache_dir()
    specs = [BUNDLED[DEFAULT_TARGET], BUNDLED[DEFAULT_DRAFT]]
    if not all(is_pulled(spec, cache) for spec in specs):
        pytest.skip(f"default model pair not pulled into {cache}")
    return RealPair(target=model_path(specs[0], cache), draft=model_path(specs[1], cache))
