"""Bad user input fails with a one-line UserError, never a traceback from deep inside a library."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest

from swiftspec.config import LoadConfig
from swiftspec.errors import UserError
from swiftspec.testing.tiny import write_gguf
from swiftspec.weights.loader import load_model

LOAD = LoadConfig(dtype="float32")

# ---- weights ---------------------------------------------------------------------------------


def _load_error(source: Path | str, cache: Path) -> str:
    with pytest.raises(UserError) as err:
        load_model(str(source), LOAD, cache=cache)
    message = str(err.value)
    assert message and "\n" not in message
    return message


def test_missing_path(tmp_path: Path) -> None:
    assert "model not found" in _load_error(tmp_path / "nope.gguf", tmp_path)


def test_not_a_model_file(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    assert "neither a GGUF file nor" in _load_error(tmp_path / "notes.txt", tmp_path)


@pytest.mark.parametrize("content", [b"", b"GGU", b"not a gguf at all" * 10])
def test_corrupt_gguf(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "bad.gguf").write_bytes(content)
    assert "corrupt or truncated GGUF" in _load_error(tmp_path / "bad.gguf", tmp_path)


@pytest.mark.parametrize("keep", [0.3, 0.99])  # cut in the metadata / in the tensor data
def test_truncated_gguf(tiny_qwen_dir: Path, tmp_path: Path, keep: float) -> None:
    data = write_gguf(tiny_qwen_dir, tmp_path / "full.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: int(len(data) * keep)])
    assert "corrupt or truncated GGUF" in _load_error(tmp_path / "cut.gguf", tmp_path)


def test_unsupported_gguf_architecture(tmp_path: Path) -> None:
    writer = gguf.GGUFWriter(str(tmp_path / "phi3.gguf"), "phi3")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert "unsupported architecture 'phi3'" in _load_error(tmp_path / "phi3.gguf", tmp_path)


def test_dir_without_config(tmp_path: Path) -> None:
    assert "no config.json" in _load_error(tmp_path, tmp_path)


def test_unsupported_hf_architecture(tiny_qwen_dir: Path, tmp_path: Path) -> None:
    model = shutil.copytree(tiny_qwen_dir, tmp_path / "m")
    config = json.loads((model / "config.json").read_text()) | {"model_type": "gpt2"}
    (model / "config.json").write_text(json.dumps(config))
    assert "unsupported architecture 'gpt2'" in _load_error(model, tmp_path)


def test_dir_without_weights(tiny_qwen_dir: Path, tmp_path: Path) -> None:
    model = shutil.copytree(tiny_qwen_dir, tmp_path / "m")
    (model / "model.safetensors").unlink()
    assert "no *.safetensors" in _load_error(model, tmp_path)


def test_corrupt_safetensors(tiny_qwen_dir: Path, tmp_path: Path) -> None:
    model = shutil.copytree(tiny_qwen_dir, tmp_path / "m")
    data = (model / "model.safetensors").read_bytes()
    (model / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert "corrupt safetensors" in _load_error(model, tmp_path)
