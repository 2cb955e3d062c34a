"""Shared fixtures: tiny random checkpoints (built once per session) and the real default pair."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from swiftspec.kernels import cpu_ext
from swiftspec.testing.tiny import make_perturbed_draft, make_tiny_checkpoint
from swiftspec.weights.bundled import BUNDLED, DEFAULT_DRAFT, DEFAULT_TARGET, cache_dir, is_pulled, model_path


@dataclass(frozen=True, slots=True)
class RealPair:
    """The bundled target and draft GGUFs, verified in the cache."""

    target: Path
    draft: Path


@pytest.fixture(scope="module")
def one_thread():
    """Small tensors: intra-op threads only add contention on a shared machine (a module asks for
    it with pytestmark = pytest.mark.usefixtures("one_thread"))."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "qwen2", arch="qwen2")


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "llama", arch="llama")


@pytest.fixture(scope="session")
def tiny_fim_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny_qwen_dir's architecture with Qwen2.5-Coder's fill-in-the-middle tokens in its vocabulary."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "qwen2-fim", arch="qwen2", fim=True)


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


# Every ISA level this CPU runs (empty where the kernels cannot be built): an AVX-512 host tests
# its AVX2 paths too.  ISA_BOUNDS: the lowest and the highest, for the slower model-level tests.
ISA_LEVELS = cpu_ext.supported_levels()
ISA_BOUNDS = sorted({ISA_LEVELS[0], ISA_LEVELS[-1]}) if ISA_LEVELS else []


def run_at_level(monkeypatch: pytest.MonkeyPatch, level: int) -> None:
    """Caps this process's kernels at `level` until monkeypatch undoes it, as SWIFTSPEC_ISA does at
    start-up; the variable is set too, so worker processes started meanwhile run at that level."""
    monkeypatch.setenv(cpu_ext.ISA_ENV, cpu_ext.LEVEL_NAMES[level])
    monkeypatch.setitem(cpu_ext._state, "level", level)
    monkeypatch.setitem(cpu_ext._state, "paths", cpu_ext.kernel_paths(level))


@pytest.fixture(params=ISA_LEVELS, ids=[cpu_ext.LEVEL_NAMES[lv] for lv in ISA_LEVELS])
def isa_level(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """The test runs once per ISA level this CPU has, with the process capped at it."""
    run_at_level(monkeypatch, request.param)
    return request.param


@pytest.fixture(params=ISA_BOUNDS, ids=[cpu_ext.LEVEL_NAMES[lv] for lv in ISA_BOUNDS])
def isa_bound(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """The test runs at the lowest (AVX2) and the highest ISA level this CPU has."""
    run_at_level(monkeypatch, request.param)
    return request.param


@pytest.fixture(scope="module")
def ext():
    """The built C++ kernel module (the tests that call it directly skip where it cannot be built)."""
    module = cpu_ext.load()
    if module is None:
        pytest.skip("C++ kernels could not be built here (no compiler, or CPU without AVX2/AVX-512)")
    return module
