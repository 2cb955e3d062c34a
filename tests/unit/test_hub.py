"""Models by hub id (`org/name`, `org/name:file.gguf`) from a pre-populated Hugging Face hub cache,
offline: HF_HUB_OFFLINE=1 and every socket connection refused, so no test can reach the network."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest

from swiftspec.cli.main import main
from swiftspec.config import LoadConfig
from swiftspec.errors import UserError
from swiftspec.testing.tiny import write_gguf
from swiftspec.weights.hub import HubId, parse_hub_id
from swiftspec.weights.loader import load_model
from swiftspec.weights.source import resolve_source

LOAD = LoadConfig(dtype="float32", max_seq_len=64)
REVISION = "0123456789abcdef0123456789abcdef01234567"


def _snapshot(cache: Path, repo: str) -> Path:
    """The hub cache layout: models--org--name/{refs/main, snapshots/<revision>/}."""
    root = cache / ("models--" + repo.replace("/", "--"))
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(REVISION)
    snap = root / "snapshots" / REVISION
    snap.mkdir(parents=True)
    return snap


@pytest.fixture
def hub_cache(tmp_path: Path, tmp_cache: Path, tiny_qwen_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A hub cache holding org/tiny (safetensors) and org/tiny-gguf (tiny.gguf), offline."""
    cache = tmp_path / "hub"
    shutil.copytree(tiny_qwen_dir, _snapshot(cache, "org/tiny"), dirs_exist_ok=True)
    write_gguf(tiny_qwen_dir, _snapshot(cache, "org/tiny-gguf") / "tiny.gguf")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def no_network(*args, **kwargs):
        raise OSError("tests run offline")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    return cache


def test_parse_hub_id() -> None:
    assert parse_hub_id("Qwen/Qwen2.5-Coder-1.5B-Instruct") == HubId("Qwen/Qwen2.5-Coder-1.5B-Instruct", None)
    assert parse_hub_id("org/repo:model-Q4_K_M.gguf") == HubId("org/repo", "model-Q4_K_M.gguf")
    for not_hub in ("qwen2.5-coder-1.5b-instruct", "/abs/dir", "./rel/dir", "a/b/c", "org/repo:file.bin"):
        assert parse_hub_id(not_hub) is None


def test_safetensors_repo_from_the_cache(hub_cache: Path, tiny_qwen_dir: Path) -> None:
    path = resolve_source("org/tiny")
    assert path == hub_cache / "models--org--tiny" / "snapshots" / REVISION
    by_id, by_dir = load_model("org/tiny", LOAD), load_model(str(tiny_qwen_dir), LOAD)
    assert by_id.args == by_dir.args
    assert by_id.tokenizer.encode("def add(a, b):") == by_dir.tokenizer.encode("def add(a, b):")


def test_gguf_file_from_the_cache(hub_cache: Path, tiny_qwen_dir: Path) -> None:
    assert resolve_source("org/tiny-gguf:tiny.gguf").name == "tiny.gguf"
    assert load_model("org/tiny-gguf:tiny.gguf", LOAD).args == load_model(str(tiny_qwen_dir), LOAD).args


@pytest.mark.parametrize("name", ["org/absent", "org/tiny-gguf:absent.gguf"])
def test_missing_model_is_one_line(hub_cache: Path, name: str) -> None:
    with pytest.raises(UserError) as err:
        resolve_source(name)
    message = str(err.value)
    assert "\n" not in message and "not in the hub cache" in message and "HF_HUB_OFFLINE" in message


def test_generate_by_hub_id(hub_cache: Path, capsys: pytest.CaptureFixture) -> None:
    argv = ["generate", "def add(a, b):", "--model", "org/tiny", "--mode", "ar", "--device", "cpu",
            "--dtype", "float32", "--max-tokens", "4", "--max-seq-len", "64"]
    assert main(argv) == 0
    assert "new tokens: 4" in capsys.readouterr().err
    assert main(argv[:3] + ["org/absent"] + argv[4:]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: model org/absent is not in the hub cache") and err.count("\n") == 1
