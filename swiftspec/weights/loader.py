"""Model loading: a local GGUF file or HF directory (weights.source resolves names to one) ->
LoadedModel (Transformer + Tokenizer), and the header-only and tokenizer-only reads beside it.

A GGUF loads straight from the file, and only its tokenizer is cached (tokenizer_cache.py): with
`--weights gguf` the linears it holds as Q4_K / Q5_K / Q6_K / Q8_0 / Q5_0 / Q4_0 are packed as
stored (gguf_native.py) and every other tensor is dequantized from it; for bf16, int8 and int4 every
tensor is dequantized from it (in C++ for Q8_0 / Q5_0 / Q4_0, the bulk of the default draft) and then
packed as asked.  Bundled names are pulled on first use (see
bundled.py), hub ids resolve through the Hugging Face hub cache (see hub.py).  The GGUF modules
(and the gguf package they need) are imported only when a GGUF is read, so that an HF directory
loads, and the engines import, where gguf is not installed (a GPU machine's own torch, benchmarks/gpu_check.py).
"""

from __future__ import annotations

from pathlib import Path

import torch

from swiftspec.config import LoadConfig
from swiftspec.errors import UserError
from swiftspec.kernels import cpu_ext
from swiftspec.model.args import ModelArgs
from swiftspec.model.transformer import Transformer
from swiftspec.parallel.state import ParallelState
from swiftspec.tokenizer import Tokenizer
from swiftspec.weights.bundled import cache_dir
from swiftspec.weights.loaded_model import LoadedModel
from swiftspec.weights.safetensors import open_hf_dir
from swiftspec.weights.source import resolve_source

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def load_model(
    source: str, load: LoadConfig, parallel: ParallelState = ParallelState(), *, cache: Path | None = None
) -> LoadedModel:
    """Load `source` (bundled model name, .gguf path or HF directory) with load's dtype and device."""
    dtype = DTYPES[load.dtype]
    path = resolve_source(source, cache)
    if load.weights == "gguf" and not (path.is_file() and load.device.startswith("cpu")):
        raise UserError(f"--weights gguf runs a GGUF file's blocks on the CPU; {source} on {load.device} "
                        "needs bf16, int8 or int4")
    if path.is_file():
        return _load_gguf(path, load, parallel, cache)
    ckpt = open_hf_dir(path)
    tokenizer = Tokenizer.from_dir(ckpt.path)
    model = Transformer(ckpt.args, parallel=parallel, dtype=dtype, device=load.device)
    model.load_weights(ckpt.tensors(dtype))
    return LoadedModel(ckpt.args, model.eval(), tokenizer, path)


def _load_gguf(path: Path, load: LoadConfig, parallel: ParallelState, cache: Path | None) -> LoadedModel:
    """A GGUF, with no dense copy of the file made.  `--weights gguf`: the planned linears are
    packed from its blocks.  Every other tensor (all of them for bf16, int8 and int4) is
    dequantized from it: gguf-py's values rounded once to dtype."""
    from swiftspec.weights.gguf import GGUFCheckpoint
    from swiftspec.weights.gguf_native import pack_native_, plan

    dtype = DTYPES[load.dtype]
    gg = GGUFCheckpoint(path)  # validated before anything is cached
    if load.device.startswith("cpu"):
        cpu_ext.load()  # the CPU kernels will run this model: built now (once, cached), they also decode its blocks
    tokenizer = load_tokenizer(path, cache)
    model = Transformer(gg.args, parallel=parallel, dtype=dtype, device=load.device)
    native = plan(gg, parallel.tp_size) if load.weights == "gguf" else None
    supplied = frozenset() if native is None else native.hf_names
    model.load_weights(gg.tensors(dtype, skip=supplied), supplied=supplied)
    if native is not None:
        pack_native_(model, gg, native)
    return LoadedModel(gg.args, model.eval(), tokenizer, path)


def load_tokenizer(path: Path, cache: Path | None = None) -> Tokenizer:
    """The tokenizer of an HF directory, or of a GGUF file (through its tokenizer-only cache entry)."""
    if path.is_dir():
        return Tokenizer.from_dir(path)
    from swiftspec.weights.tokenizer_cache import ensure_tokenizer

    return Tokenizer.from_dir(ensure_tokenizer(path, cache or cache_dir()))


def model_args(path: Path) -> ModelArgs:
    """ModelArgs of a GGUF file or HF directory, from its header or config.json alone."""
    if path.is_dir():
        return open_hf_dir(path).args
    from swiftspec.weights.gguf import GGUFCheckpoint

    return GGUFCheckpoint(path).args
