"""HF checkpoint directories (config.json + *.safetensors, single or sharded): ModelArgs and tensors.

Tensors are read one at a time through safetensors' memory map, so loading needs no second copy
of the checkpoint in memory. Also holds a streaming writer used by the GGUF conversion cache.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

import torch
from safetensors import SafetensorError, safe_open

from swiftspec.config import ConfigError
from swiftspec.errors import UserError
from swiftspec.model.args import ModelArgs
from swiftspec.model.hf_args import model_args

_INDEX = "model.safetensors.index.json"
# The tensors the decoder takes; anything else in a checkpoint (rotary caches, ...) is skipped.
_WANTED = re.compile(
    r"model\.embed_tokens\.weight|model\.norm\.weight|lm_head\.weight"
    r"|model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.(weight|bias)"
    r"|model\.layers\.\d+\.(input|post_attention|pre_feedforward|post_feedforward)_layernorm\.weight"
    r"|model\.layers\.\d+\.self_attn\.[qk]_norm\.weight"
)
_ST_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


@dataclass(frozen=True, slots=True)
class HFCheckpoint:
    """An HF-style checkpoint directory with its parsed config and weight files."""

    path: Path
    args: ModelArgs
    files: tuple[Path, ...]

    def tensors(self, dtype: torch.dtype, skip: frozenset[str] = frozenset()) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (hf_name, tensor) cast to dtype; lm_head is dropped when embeddings are tied, and
        the names in skip are never read."""
        for file in self.files:
            try:
                with safe_open(file, framework="pt") as f:
                    for name in f.keys():
                        if not _WANTED.fullmatch(name) or name in skip:
                            continue
                        if name == "lm_head.weight" and self.args.tie_word_embeddings:
                            continue
                        yield name, f.get_tensor(name).to(dtype)
            except SafetensorError as e:
                raise UserError(f"corrupt safetensors file {file}: {e}") from None


def open_hf_dir(path: Path) -> HFCheckpoint:
    """Parse config.json and find the weight files (index.json shards, else every *.safetensors)."""
    config = path / "config.json"
    if not config.is_file():
        raise UserError(f"{path} is not a model directory (no config.json)")
    try:
        args = model_args(json.loads(config.read_text()))
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise UserError(f"bad config.json in {path}: {type(e).__name__}: {e}") from None
    except ConfigError as e:
        raise UserError(f"{path}: {e}") from None
    return HFCheckpoint(path, args, _weight_files(path))


def _weight_files(path: Path) -> tuple[Path, ...]:
    index = path / _INDEX
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, AttributeError) as e:
            raise UserError(f"bad {_INDEX} in {path}: {e}") from None
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise UserError(f"{path}: shard {missing[0]} listed in {_INDEX} is missing")
        return tuple(path / s for s in shards)
    files = tuple(sorted(path.glob("*.safetensors")))
    if not files:
        raise UserError(f"{path} has no *.safetensors weights")
    return files
