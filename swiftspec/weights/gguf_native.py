"""`--weights gguf`: a GGUF's Q4_K / Q5_K / Q6_K (kernels/kquant.py) and Q8_0 / Q5_0 / Q4_0
(kernels/qblock.py) linear weights packed as stored.

The packed weights come straight from the file's blocks (a memmap), row chunk by row chunk: those
linears are never dequantized, their bf16 parameters are left untouched (never resident) until
the packed weight replaces them, and the blocks' pages leave the resident set once packed.  A
fused linear (qkv, gate_up) is native when all its parts are of one family (the K-quants, or
Q8_0 / Q5_0 / Q4_0); linears of other types or of mixed families (and every linear of a
tensor-parallel shard) stay dense here and get the int8 repack (kernels.prepare_model_).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import ModuleType

import torch
from torch import nn

from swiftspec.kernels import kquant, qblock
from swiftspec.kernels.packed import TILE_N
from swiftspec.model.transformer import _route
from swiftspec.weights.gguf import GGUFCheckpoint, TensorSpec

_SHARD_ORDER = {None: 0, "q": 0, "k": 1, "v": 2, 0: 0, 1: 1}  # fused parts in row order


def family(types: list[str]) -> ModuleType | None:
    """The module (TYPES, from_gguf) that packs a linear of these GGUF tensor types, or None."""
    return next((m for m in (kquant, qblock) if all(t in m.TYPES for t in types)), None)


@dataclass(frozen=True)
class NativePlan:
    """Our linear module name -> its GGUF tensors, in the fused row order."""

    groups: dict[str, list[TensorSpec]]

    @property
    def hf_names(self) -> frozenset[str]:
        return frozenset(s.hf_name for specs in self.groups.values() for s in specs)


def plan(ckpt: GGUFCheckpoint, tp_size: int = 1) -> NativePlan:
    """The linears of `ckpt` that run as stored: those whose parts are all of one family."""
    if tp_size != 1:
        return NativePlan({})
    groups: dict[str, list[tuple[int, TensorSpec]]] = {}
    for spec in ckpt.specs:
        if not (spec.hf_name.endswith("_proj.weight") or spec.hf_name == "lm_head.weight"):
            continue
        name, shard = _route(spec.hf_name)
        groups.setdefault(name.rsplit(".", 1)[0], []).append((_SHARD_ORDER[shard], spec))
    native = {}
    for module, parts in groups.items():
        specs = [s for _, s in sorted(parts, key=lambda p: p[0])]
        if family([ckpt.raw(s)[1] for s in specs]) and all(s.shape[0] % TILE_N == 0 for s in specs[:-1]):
            native[module] = specs
    return NativePlan(native)


def pack_native_(model: nn.Module, ckpt: GGUFCheckpoint, native: NativePlan) -> list[str]:
    """Replace each planned linear's weight by its packed blocks, in place; returns the names.

    The linears are packed on torch's intra-op thread count of worker threads (numpy and torch
    release the GIL in the bulk of the work); each packing is a pure function of its blocks."""

    def packed(specs: list[TensorSpec]):
        parts = [kquant.RawPart(*ckpt.raw(s)) for s in specs]
        qw = family([p.qtype for p in parts]).from_gguf(parts, specs[0].shape[1])
        for s in specs:
            ckpt.release(s)
        return qw

    with ThreadPoolExecutor(max(1, torch.get_num_threads())) as pool:
        for module_name, qw in zip(native.groups, pool.map(packed, native.groups.values())):
            module = model.get_submodule(module_name)
            del module.weight  # the untouched bf16 parameter
            module.weight = qw
    return list(native.groups)
