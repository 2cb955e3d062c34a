"""Packed drafts kept on disk: the first start packs a GGUF draft as int8 or int4 (dequantizing the
file, then quantizing every linear and the pruned LM head: ~4 s for the default draft) and writes
what it packed; later starts read that back (~0.5 s) instead.

An entry (`<cache>/drafts/<name>.safetensors`) holds the model's dense parameters (embedding, norms,
biases), each packed linear's tensors and the pruned head with its token ids.  Its name hashes the
GGUF's size and mtime, the format, dtype and pruned-vocabulary size, and the bytes of the kernels
(whose packing it stores) and of the vocabulary tables, so any change to those makes a new entry.
Entries appear by an atomic rename, and a new one removes the older entries of its draft and
format (their keys are stale); an unreadable one is warned about and packed again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from swiftspec import kernels
from swiftspec.config import LoadConfig, TreeConfig
from swiftspec.kernels import cpu_ext
from swiftspec.model.transformer import Transformer
from swiftspec.parallel.state import ParallelState
from swiftspec.speculate.drafter import TreeDrafter, build_drafter, fim_focus
from swiftspec.speculate.vocab import TABLE_DIR
from swiftspec.weights.bundled import cache_dir
from swiftspec.weights.loaded_model import LoadedModel
from swiftspec.weights.loader import DTYPES, load_model, load_tokenizer, model_args
from swiftspec.weights.source import resolve_source

log = logging.getLogger("swiftspec")

CACHE_VERSION = 1  # bump when an entry's layout changes
CACHED_FORMATS = ("int8", "int4")  # bf16 only wraps its weights; gguf packs the file's blocks as stored
_KERNELS = Path(kernels.__file__).parent


@dataclass(slots=True)
class Draft:
    """A drafter ready to run and the loaded (packed) draft model under it."""

    drafter: TreeDrafter
    loaded: LoadedModel


def load_drafter(source: str, load: LoadConfig, cfg: TreeConfig, max_seq_len: int, draft_vocab: int,
                 parallel: ParallelState | None = None) -> Draft:
    """The draft `source` packed as load.weights, under a TreeDrafter (build_drafter): read from
    its cache entry where one exists, else loaded, packed and (a CPU GGUF draft in int8/int4)
    written to the cache."""
    parallel = parallel or ParallelState()
    path = resolve_source(source)
    entry = _entry(path, load, draft_vocab) if _cacheable(path, load, parallel) else None
    if entry is not None and entry.is_file():
        try:
            return _read(entry, path, load, cfg, max_seq_len)
        except Exception as err:  # noqa: BLE001 - a damaged entry is packed again, never fatal
            log.warning("draft cache: %s unreadable (%s); packing the draft again", entry, err)
    loaded = load_model(source, load, parallel)
    drafter = build_drafter(loaded, cfg, max_seq_len, draft_vocab, load.weights)
    if entry is not None:
        _write(entry, loaded.model, drafter.pruned)
        for stale in entry.parent.glob(f"{_prefix(path, load)}*.safetensors"):
            if stale != entry:
                stale.unlink(missing_ok=True)
    return Draft(drafter, loaded)


def _cacheable(path: Path, load: LoadConfig, parallel: ParallelState) -> bool:
    return (path.is_file() and load.weights in CACHED_FORMATS and load.device.startswith("cpu")
            and parallel.tp_size == 1 and cpu_ext.load() is not None)


def _entry(path: Path, load: LoadConfig, draft_vocab: int) -> Path:
    """The entry's file: its name hashes everything its bytes depend on (module docstring)."""
    st = path.stat()
    digest = hashlib.sha1(f"{st.st_size}|{st.st_mtime_ns}|{load.weights}|{load.dtype}|{draft_vocab}|"
                          f"v{CACHE_VERSION}".encode())
    sources = [*_KERNELS.glob("*.py"), *(_KERNELS / "csrc").iterdir(), *TABLE_DIR.glob("*.json")]
    for file in sorted(sources):
        digest.update(file.name.encode() + b"\0" + file.read_bytes())
    return cache_dir() / "drafts" / f"{_prefix(path, load)}{digest.hexdigest()[:16]}.safetensors"


def _prefix(path: Path, load: LoadConfig) -> str:
    """The start of the names of a draft's entries in one format."""
    return f"{path.stem}-{load.weights}-"


def _write(entry: Path, model: Transformer, pruned: tuple[torch.Tensor | None, object]) -> None:
    """Write a packed draft's tensors (dense parameters, packed linears, pruned head) to entry."""
    tensors = {f"dense.{name}": p.data.contiguous() for name, p in model.named_parameters()}
    packed = {name: m.weight for name, m in model.named_modules()
              if isinstance(getattr(m, "weight", None), kernels.PackedWeight)}
    vocab, head = pruned
    if vocab is not None:
        tensors["vocab"], packed["<head>"] = vocab, head
    meta = {}
    for name, w in packed.items():
        meta[name] = {"fmt": w.fmt, "shape": list(w.shape), "group_size": w.group_size}
        tensors[f"packed.{name}.qweight"], tensors[f"packed.{name}.scale"] = w.qweight, w.scale
        if w.mins is not None:
            tensors[f"packed.{name}.mins"] = w.mins
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = entry.parent / f".{entry.name}.tmp-{os.getpid()}"
    try:
        save_file(tensors, str(tmp), metadata={"packed": json.dumps(meta)})
        tmp.rename(entry)
    except OSError as err:  # a full or read-only cache costs the next start a packing, nothing more
        log.warning("draft cache: could not write %s (%s)", entry, err)
    finally:
        tmp.unlink(missing_ok=True)


def _read(entry: Path, path: Path, load: LoadConfig, cfg: TreeConfig, max_seq_len: int) -> Draft:
    """A drafter over the packed draft in entry (the model built empty, its tensors set from it)."""
    args = model_args(path)
    tokenizer = load_tokenizer(path)
    model = Transformer(args, dtype=DTYPES[load.dtype], device=load.device)
    params = dict(model.named_parameters(remove_duplicate=False))  # a tied head under its own name too
    with safe_open(str(entry), framework="pt") as f:
        meta = json.loads(f.metadata()["packed"])
        names = {k.removeprefix("dense.") for k in f.keys() if k.startswith("dense.")}
        if names | {f"{m}.weight" for m in meta if m != "<head>"} != params.keys():
            raise ValueError("its parameters are not this model's")
        for name in names:
            params[name].data = f.get_tensor(f"dense.{name}")
        weights = {name: _packed(f, name, m) for name, m in meta.items()}
        vocab = f.get_tensor("vocab") if "vocab" in f.keys() else None
    head = weights.pop("<head>", None)
    for name, weight in weights.items():
        module = model.get_submodule(name)
        del module.weight
        module.weight = weight
    drafter = TreeDrafter(model.eval(), cfg, max_seq_len, vocab, head, fim_focus(tokenizer))
    return Draft(drafter, LoadedModel(args, model, tokenizer, path))


def _packed(f, name: str, meta: dict) -> kernels.PackedWeight:  # f: an open safetensors file
    mins = f"packed.{name}.mins"
    return kernels.PackedWeight(meta["fmt"], tuple(meta["shape"]), meta["group_size"],
                                f.get_tensor(f"packed.{name}.qweight"), f.get_tensor(f"packed.{name}.scale"),
                                f.get_tensor(mins) if mins in f.keys() else None)
