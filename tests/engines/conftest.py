"""Fixtures for engine tests: tiny models loaded once, in fp32."""

from __future__ import annotations

import pytest

from swiftspec.config import LoadConfig
from swiftspec.runner.load import load_target
from swiftspec.weights.loader import load_model

FP32 = LoadConfig(dtype="float32", max_seq_len=256)


@pytest.fixture(scope="session")
def tiny_target(tiny_qwen_dir):
    return load_model(str(tiny_qwen_dir), FP32)


@pytest.fixture(scope="session")
def tiny_draft(tiny_draft_dir):
    return load_model(str(tiny_draft_dir), FP32)


@pytest.fixture(scope="session")
def sharp_pair_dirs(tmp_path_factory):
    from spec_stats import sharp_pair

    return sharp_pair(tmp_path_factory.mktemp("sharp"))


@pytest.fixture(autouse=True)
def _tiny_models_on_one_thread(one_thread):
    """Tiny models run fastest on one thread (and do not fight other tests for the cores): every
    test here runs under tests/conftest.py's one_thread."""


@pytest.fixture(scope="session")
def tiny_int8_target(tiny_qwen_dir):
    """The tiny target with int8 linears (the C++ kernels, row-invariant at every row count)."""
    return load_target(str(tiny_qwen_dir), LoadConfig(dtype="float32", max_seq_len=256, weights="int8"))
