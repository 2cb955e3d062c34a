"""engines.defaults.resolve_defaults: flag parsing leaves the device and weight formats open, and one
call settles them (CPU or CUDA, a GGUF or an HF directory as target), keeps every explicit flag, and
refuses a verify size the CPU kernels cannot take in one call."""

from __future__ import annotations

from pathlib import Path

import pytest

from swiftspec.cli.engine_args import engine_config_from_args
from swiftspec.cli.main import build_parser
from swiftspec.config import AUTO, ConfigError, EngineConfig, LoadConfig
from swiftspec.engines import build_engine, defaults
from swiftspec.engines.defaults import default_draft_weights, resolve_defaults
from swiftspec.kernels import MAX_DECODER_ROWS, cpu_ext


def _parsed(*argv: str) -> EngineConfig:
    return engine_config_from_args(build_parser().parse_args(["generate", "x", *argv]))


@pytest.fixture
def kernels_at(monkeypatch: pytest.MonkeyPatch):
    """Pretend the C++ kernels load (or not) at an ISA level, without building them."""

    def set_level(level: str, loads: bool = True) -> None:
        monkeypatch.setattr(cpu_ext, "load", lambda: object() if loads else None)
        monkeypatch.setitem(cpu_ext._state, "level", cpu_ext.LEVELS[level])

    return set_level


@pytest.fixture
def device_checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The CUDA start-up check answers "cuda"; the list counts how often it was asked."""
    asked: list[str] = []
    monkeypatch.setattr(defaults, "default_device", lambda: asked.append("asked") or "cuda")
    return asked


@pytest.fixture
def gguf_file(tmp_path: Path) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + bytes(28))  # is_gguf reads the name and the magic, never the tensors
    return path


def test_parsing_leaves_the_defaults_open(monkeypatch: pytest.MonkeyPatch, device_checks: list[str]) -> None:
    def no_build():  # noqa: ANN202
        raise AssertionError("parsing flags loaded (and may have compiled) the C++ kernels")

    monkeypatch.setattr(cpu_ext, "load", no_build)
    config = _parsed()
    assert (config.target_load.device, config.draft_load.device) == (AUTO, AUTO)
    assert (config.target_load.weights, config.draft_load.weights) == (None, None)
    assert _parsed("--weights", "int4").draft_load.weights is None
    assert device_checks == []  # nor was the CUDA check run


def test_a_gguf_target_on_the_cpu_runs_as_stored(gguf_file: Path, kernels_at) -> None:
    kernels_at("avx2")
    config = resolve_defaults(_parsed("--model", str(gguf_file), "--device", "cpu"))
    assert (config.target_load.weights, config.draft_load.weights) == ("gguf", "int4")
    assert (config.target_load.device, config.draft_load.device) == ("cpu", "cpu")
    kernels_at("avx2", loads=False)  # no C++ kernels: the draft keeps the target's format
    assert resolve_defaults(_parsed("--model", str(gguf_file), "--device", "cpu")).draft_load.weights == "gguf"
    bundled = resolve_defaults(_parsed("--model", "qwen2.5-coder-1.5b-instruct", "--device", "cpu"))
    assert bundled.target_load.weights == "gguf"  # a bundled name is a GGUF, known without pulling it


@pytest.mark.parametrize("level, draft", [("avx512-vnni", "int8"), ("avx2-vnni", "int8"), ("avx2", "int4")])
def test_an_hf_directory_target_on_the_cpu(tiny_qwen_dir: Path, kernels_at, level: str, draft: str) -> None:
    kernels_at(level)
    config = resolve_defaults(_parsed("--model", str(tiny_qwen_dir), "--device", "cpu"))
    assert (config.target_load.weights, config.draft_load.weights) == ("bf16", draft)


def test_device_auto_asks_the_cuda_check_once(gguf_file: Path, device_checks: list[str]) -> None:
    config = resolve_defaults(_parsed("--model", str(gguf_file)))
    assert (config.target_load.device, config.draft_load.device) == ("cuda", "cuda")
    assert (config.target_load.weights, config.draft_load.weights) == ("bf16", "bf16")  # GGUF blocks run on CPU only
    assert device_checks == ["asked"]


def test_explicit_flags_are_kept_and_a_settled_config_stays(gguf_file: Path, monkeypatch: pytest.MonkeyPatch,
                                                            device_checks: list[str]) -> None:
    monkeypatch.setattr(cpu_ext, "load", lambda: pytest.fail("a settled config loaded the C++ kernels"))
    parsed = _parsed("--model", str(gguf_file), "--device", "cpu", "--weights", "int8", "--draft-weights", "bf16",
                     "--dtype", "float32", "--max-seq-len", "512")
    config = resolve_defaults(parsed)
    assert config.target_load == LoadConfig(device="cpu", dtype="float32", max_seq_len=512, weights="int8")
    assert config.draft_load == LoadConfig(device="cpu", dtype="float32", max_seq_len=512, weights="bf16")
    assert resolve_defaults(config) == config and resolve_defaults(EngineConfig()) == EngineConfig()
    assert device_checks == []


def test_a_verify_size_past_the_kernel_rows_is_refused_on_the_cpu(kernels_at) -> None:
    kernels_at("avx2")
    too_many = ("--mode", "tree", "--verify-size", str(MAX_DECODER_ROWS + 1))
    with pytest.raises(ConfigError, match="exceeds the 16 rows") as err:
        resolve_defaults(_parsed(*too_many, "--device", "cpu"))
    assert "\n" not in str(err.value)
    assert resolve_defaults(_parsed(*too_many, "--device", "cuda")).tree.verify_size == MAX_DECODER_ROWS + 1
    fits = ("--mode", "tree", "--verify-size", str(MAX_DECODER_ROWS), "--device", "cpu")
    assert resolve_defaults(_parsed(*fits)).tree.verify_size == MAX_DECODER_ROWS


def test_default_draft_weights_follow_the_target(kernels_at) -> None:
    kernels_at("avx2")
    assert default_draft_weights(LoadConfig(weights="int4")) == "int4"  # the target's own format
    assert default_draft_weights(LoadConfig(weights="bf16", dtype="float32")) == "bf16"  # the kernels take bf16
    assert default_draft_weights(LoadConfig(weights="bf16", device="cuda")) == "bf16"
    kernels_at("avx2", loads=False)  # no C++ kernels: the draft keeps the target's format
    assert default_draft_weights(LoadConfig(weights="bf16")) == "bf16"


def test_engines_are_built_from_settled_configs_only() -> None:
    for open_load in (LoadConfig(weights=None), LoadConfig(device=AUTO)):
        with pytest.raises(ConfigError, match="resolve_defaults"):
            build_engine(EngineConfig(mode="ar", target_load=open_load))
