"""Where a model's files are: a bundled name, a .gguf file, an HF directory or a hub id -> the local
GGUF file or HF directory (resolve_source), and whether a name is a GGUF before anything is pulled."""

from __future__ import annotations

from pathlib import Path

from swiftspec.errors import UserError
from swiftspec.weights.bundled import BUNDLED, pull
from swiftspec.weights.hub import parse_hub_id, resolve_hub

_GGUF_MAGIC = b"GGUF"


def is_gguf(source: str) -> bool:
    """Whether source names a GGUF (a bundled name, org/name:file.gguf or a GGUF file), without
    pulling or downloading it."""
    if source in BUNDLED:
        return True
    path = Path(source).expanduser()
    if path.is_file():
        return path.suffix == ".gguf" or _has_gguf_magic(path)
    hub = parse_hub_id(source)
    return not path.exists() and hub is not None and hub.file is not None


def resolve_source(source: str, cache: Path | None = None) -> Path:
    """The local GGUF file or HF directory behind source, pulling a bundled model (or a hub id that
    is not a local path) if needed."""
    if source in BUNDLED:
        return pull(source, cache)
    path = Path(source).expanduser()
    hub = parse_hub_id(source)
    if not path.exists() and hub is not None:
        return resolve_hub(hub)
    if not path.exists():
        raise UserError(f"model not found: {source} (not a file, a directory, a hub id org/name[:file.gguf] "
                        f"or one of: {', '.join(BUNDLED)})")
    if path.is_dir() or path.suffix == ".gguf" or _has_gguf_magic(path):
        return path
    raise UserError(f"{source} is neither a GGUF file nor an HF model directory")


def _has_gguf_magic(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == _GGUF_MAGIC
