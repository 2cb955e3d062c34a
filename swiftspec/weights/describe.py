"""`swiftspec models info`: what a GGUF file or HF directory holds (family, shape, parameters, tensor
types) and how SwiftSpec would run it, read from headers alone (no tensor data is loaded).  The
GGUF and safetensors readers are imported by the function that reads that kind of file: an HF
directory is described where the gguf package is missing (as weights/loader.py loads one).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from swiftspec.errors import UserError
from swiftspec.model.args import ModelArgs

_FLOAT_TYPES = ("F32", "F16", "BF16")


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """One model file or directory as `models info` reports it."""

    path: Path
    kind: str  # "GGUF file" | "HF directory"
    size: int  # bytes of weights on disk
    family: str  # the file's own architecture name (GGUF general.architecture, HF model_type)
    args: ModelArgs | None  # None when SwiftSpec cannot run it
    problem: str | None  # why it cannot run (one line), else None
    parameters: int
    tensor_types: dict[str, int]  # type name -> tensor count
    fallbacks: tuple[str, ...]  # how the formats run it, one line each

    def lines(self) -> list[str]:
        """The report, one fact per line."""
        out = [f"{self.path}: {self.kind}, {_size(self.size)}",
               f"  family: {self.family}" + (f" ({_shape(self.args)})" if self.args else ""),
               f"  parameters: {_count(self.parameters)} (every stored tensor)",
               "  tensor types: " + ", ".join(f"{t} x {n}" for t, n in sorted(self.tensor_types.items()))]
        if self.args is not None:
            out.append(f"  layers: {_features(self.args)}")
        out.append("  runs: " + ("yes" if self.problem is None else f"no: {self.problem}"))
        return out + [f"  {line}" for line in self.fallbacks]


def describe(path: Path) -> ModelInfo:
    """Describe the GGUF file or HF directory at path; UserError (one line) when it is neither."""
    if not path.exists():
        raise UserError(f"model not found: {path}")
    if path.is_dir():
        return _describe_hf(path)
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise UserError(f"{path} is neither a GGUF file nor an HF model directory")
    return _describe_gguf(path)


def _describe_gguf(path: Path) -> ModelInfo:
    from swiftspec.weights.gguf import GGUFCheckpoint, open_reader

    reader = open_reader(path)
    types = Counter(t.tensor_type.name for t in reader.tensors)
    parameters = sum(int(t.n_elements) for t in reader.tensors)
    arch_field = reader.fields.get("general.architecture")
    family = str(arch_field.contents()) if arch_field is not None else "unknown"
    unreadable = sorted(t for t in types if not _dequantizable(t))
    try:
        ckpt = GGUFCheckpoint(path)
    except UserError as e:
        return ModelInfo(path, "GGUF file", path.stat().st_size, family, None, str(e), parameters, dict(types), ())
    problem = f"gguf-py cannot read {', '.join(unreadable)} tensors" if unreadable else None
    return ModelInfo(path, "GGUF file", path.stat().st_size, family, ckpt.args, problem, parameters, dict(types),
                     () if problem else _gguf_fallbacks(ckpt))


def _gguf_fallbacks(ckpt) -> tuple[str, ...]:  # ckpt: weights.gguf.GGUFCheckpoint
    """How --weights gguf and the dense formats run a GGUF's tensors."""
    from swiftspec.kernels import kquant, qblock
    from swiftspec.weights.gguf_native import plan

    native = plan(ckpt)
    native_names = native.hf_names
    linears = [s for s in ckpt.specs if s.hf_name.endswith("_proj.weight") or s.hf_name == "lm_head.weight"]
    requantized = Counter(ckpt.raw(s)[1] for s in linears if s.hf_name not in native_names)
    as_stored = Counter(ckpt.raw(s)[1] for s in linears if s.hf_name in native_names)
    gguf_line = "--weights gguf (the default on CPU): "
    gguf_line += f"{sum(as_stored.values())} linear tensors run as stored ({_counts(as_stored)})" \
        if as_stored else f"no linear tensor is of a type run as stored ({', '.join(kquant.TYPES + qblock.TYPES)})"
    if requantized:
        gguf_line += f"; {sum(requantized.values())} with no native kernel re-quantized to int8 ({_counts(requantized)})"
    return (gguf_line + "; embeddings and norms dequantized to the dtype",
            "--weights bf16 | int8 | int4 (and on GPU): dequantized once into the conversion cache, then packed")


def _describe_hf(path: Path) -> ModelInfo:
    from safetensors import safe_open

    from swiftspec.weights.safetensors import open_hf_dir

    config = path / "config.json"
    if not config.is_file():
        raise UserError(f"{path} is not a model directory (no config.json)")
    try:
        family = str(json.loads(config.read_text()).get("model_type", "unknown"))
    except json.JSONDecodeError as e:
        raise UserError(f"bad config.json in {path}: {e}") from None
    files = sorted(path.glob("*.safetensors"))
    types: Counter[str] = Counter()
    parameters = 0
    for file in files:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                piece = f.get_slice(name)
                types[piece.get_dtype()] += 1
                parameters += _numel(piece.get_shape())
    size = sum(f.stat().st_size for f in files)
    try:
        args, problem = open_hf_dir(path).args, None
    except UserError as e:
        args, problem = None, str(e)
    fallbacks = () if problem else ("--weights bf16 (the default): loaded in --dtype; int8 | int4: packed at load",)
    return ModelInfo(path, "HF directory", size, family, args, problem, parameters, dict(types), fallbacks)


def _dequantizable(type_name: str) -> bool:
    """Whether gguf-py can dequantize tensors of this GGUF type."""
    import gguf
    import numpy as np
    from gguf.quants import dequantize

    if type_name in _FLOAT_TYPES:
        return True
    qtype = gguf.GGMLQuantizationType[type_name]
    try:
        dequantize(np.zeros(gguf.GGML_QUANT_SIZES[qtype][1], dtype=np.uint8), qtype)
    except (NotImplementedError, KeyError, ValueError):
        return False
    return True


def _features(args: ModelArgs) -> str:
    """How the layers run: the fused/kernel path, or the per-layer path and why."""
    parts = []
    if args.sliding_window is not None:
        layers = f" on {sum(args.sliding_layers)} of {args.num_layers} layers" if args.sliding_layers else ""
        parts.append(f"sliding window {args.sliding_window}{layers}")
    if args.qk_norm:
        parts.append("q/k norms")
    if args.gemma:
        parts.append("Gemma block")
    if args.attn_softcap is not None:
        parts.append(f"scores soft-capped at {args.attn_softcap:g} (torch attention)")
    if args.final_softcap is not None:
        parts.append(f"logits soft-capped at {args.final_softcap:g}")
    path = "the C++ kernels (fused decoder on CPU)" if args.plain else "per-layer path outside the fused C++ decoder"
    return ", ".join(parts + [path])


def _shape(a: ModelArgs) -> str:
    rope = "" if a.rope_scaling.kind == "none" else f", rope {a.rope_scaling.kind} x{a.rope_scaling.factor:g}"
    layers = f"{a.num_layers} layer" + ("s" if a.num_layers != 1 else "")
    return (f"{layers}, hidden {a.hidden_size}, {a.num_heads} heads / {a.num_kv_heads} KV x "
            f"{a.head_dim}, MLP {a.intermediate_size}, vocab {a.vocab_size}, context {a.max_position_embeddings}"
            f"{rope}")


def _counts(c: Counter) -> str:
    return ", ".join(f"{t} x {n}" for t, n in sorted(c.items()))


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M" if n >= 1e6 else f"{n / 1e3:.1f} k"


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"
