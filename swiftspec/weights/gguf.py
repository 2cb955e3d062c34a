"""GGUF checkpoints: metadata -> ModelArgs, tensors -> dequantized float tensors under HF names.

Reading and dequantizing go through the `gguf` package (GGUFReader, its header parse sped up in
gguf_reader.py, and gguf.quants.dequantize), so every quantization it knows (Q4_K, Q5_0, Q6_K, Q8_0,
F16, BF16, F32, ...) is supported here; Q4_K, Q5_K and Q6_K, the bulk of a K-quant file, are dequantized
by kernels/kquant.py, and Q8_0 / Q5_0 / Q4_0 by kernels/qblock.py (the same values, faster).
"""

from __future__ import annotations

import mmap
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from gguf import ReaderTensor
from gguf.quants import dequantize

from swiftspec.config import ConfigError
from swiftspec.errors import UserError
from swiftspec.kernels import kquant, qblock
from swiftspec.model.args import SUPPORTED_ARCHS, ModelArgs, RopeScaling
from swiftspec.model.hf_args import rope_scaling
from swiftspec.weights.gguf_arch import block_names, family_fields, norm_shift
from swiftspec.weights.gguf_arch import f32 as _f32
from swiftspec.weights.gguf_reader import FastReader

_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GGUF_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_HF_BLOCK = re.compile(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)")
_ROPE_FREQS = "rope_freqs.weight"  # llama3 frequency factors; folded into ModelArgs.rope_scaling
# Errors GGUFReader raises on a damaged header (it has no exception type of its own).
_READ_ERRORS = (ValueError, KeyError, IndexError, OSError, struct.error, UnicodeDecodeError, OverflowError)


def gguf_to_hf_name(name: str, arch: str = "llama") -> str | None:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight` (names of `arch`); None when unknown."""
    if m := _GGUF_BLOCK.fullmatch(name):
        part = block_names(arch, _BLOCK_NAMES).get(m[2])
        return f"model.layers.{m[1]}.{part}.{m[3]}" if part else None
    base, _, suffix = name.rpartition(".")
    part = _TOP_NAMES.get(base)
    return f"{part}.{suffix}" if part and suffix in ("weight", "bias") else None


def hf_to_gguf_name(name: str, arch: str = "llama") -> str | None:
    """Inverse of gguf_to_hf_name (used to write test GGUFs)."""
    if m := _HF_BLOCK.fullmatch(name):
        part = {v: k for k, v in block_names(arch, _BLOCK_NAMES).items()}.get(m[2])
        return f"blk.{m[1]}.{part}.{m[3]}" if part else None
    base, _, suffix = name.rpartition(".")
    part = {v: k for k, v in _TOP_NAMES.items()}.get(base)
    return f"{part}.{suffix}" if part else None


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert-time Q/K row permutation (rotary halves -> interleaved pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama_permute: back to HF's rotate-half row order."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One tensor of the checkpoint as it will come out: HF name and HF (row-major) shape."""

    gguf_name: str
    hf_name: str
    shape: tuple[int, ...]


class GGUFCheckpoint:
    """An opened, validated GGUF file: its metadata, its ModelArgs and its tensors under HF names."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._reader = open_reader(path)
        self._tensors = {t.name: t for t in self._reader.tensors}
        self.arch = str(self.meta("general.architecture"))
        if self.arch not in SUPPORTED_ARCHS:
            raise UserError(
                f"unsupported architecture {self.arch!r} in {path} (supported: {', '.join(SUPPORTED_ARCHS)})"
            )
        self.args = self._build_args()
        self.specs = self._build_specs()

    def meta(self, key: str, default: Any = ...) -> Any:
        """A metadata value (strings decoded, arrays as lists); UserError when absent and no default."""
        field = self._reader.fields.get(key)
        if field is None:
            if default is ...:
                raise UserError(f"GGUF file {self.path} lacks metadata key {key!r}")
            return default
        return field.contents()

    def tensors(self, dtype: torch.dtype, skip: frozenset[str] = frozenset()) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (hf_name, tensor) in file order, dequantized, un-permuted and cast to dtype; the
        names in skip are never read."""
        for spec in self.specs:
            if spec.hf_name not in skip:
                yield spec.hf_name, self.tensor(spec, dtype)

    def tensor(self, spec: TensorSpec, dtype: torch.dtype) -> torch.Tensor:
        """One tensor dequantized to dtype: gguf-py's fp32 values rounded once to dtype (K-quants
        and Q8_0 / Q5_0 / Q4_0 are decoded here, by row chunks: several times faster, the same bits).  Its pages are
        released once read."""
        raw = self._tensors[spec.gguf_name]
        blocks = next((m for m in (kquant, qblock) if raw.tensor_type.name in m.TYPES), None)
        if blocks is not None and len(spec.shape) == 2:
            out = blocks.dequantize_blocks(*self.raw(spec), dtype)
        else:
            w = dequantize(raw.data, raw.tensor_type).reshape(spec.shape)
            w = np.ascontiguousarray(self._unpermute(spec.gguf_name, w))
            if shift := norm_shift(self.arch, spec.gguf_name):  # back to HF's value (exact: w is near 1)
                w = w - np.float32(shift)
            if not w.flags.writeable:  # F32 tensors come back as views of the read-only memmap
                w = w.copy()
            out = torch.from_numpy(w).to(dtype)
        self.release(spec)
        return out

    def release(self, spec: TensorSpec) -> None:
        """Drop a tensor's pages from this process's resident set once it has been read (the page
        cache keeps them; a later read maps them again): otherwise every page of the file read so
        far stays resident until the file is closed, on top of the weights made from them."""
        mapping = getattr(self._reader.data, "_mmap", None)  # np.memmap's mmap.mmap
        if mapping is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        t = self._tensors[spec.gguf_name]
        start = t.data_offset - t.data_offset % mmap.PAGESIZE
        mapping.madvise(mmap.MADV_DONTNEED, start, t.data_offset + t.n_bytes - start)

    def raw(self, spec: TensorSpec) -> tuple[np.ndarray, str]:
        """A tensor's stored bytes as [rows, bytes per row] in HF row order (a view of the memmap
        where no un-permuting applies), and its type name ("Q4_K", ...)."""
        t = self._tensors[spec.gguf_name]
        rows = t.data.reshape(spec.shape[0], -1)
        return self._unpermute(spec.gguf_name, rows), t.tensor_type.name

    def _unpermute(self, name: str, w: np.ndarray) -> np.ndarray:
        if self.arch != "llama":  # qwen2 GGUFs keep HF's row order
            return w
        if ".attn_q." in name:
            return llama_unpermute(w, self.args.num_heads)
        if ".attn_k." in name:
            return llama_unpermute(w, self.args.num_kv_heads)
        return w

    def _build_specs(self) -> list[TensorSpec]:
        specs = []
        for t in self._reader.tensors:
            if t.name == _ROPE_FREQS:
                continue
            hf = gguf_to_hf_name(t.name, self.arch)
            if hf is None:
                raise UserError(f"unexpected tensor {t.name!r} in {self.path} for architecture {self.arch!r}")
            specs.append(TensorSpec(t.name, hf, _hf_shape(t)))
        return specs

    def _build_args(self) -> ModelArgs:
        try:
            return self._read_args()
        except ConfigError as e:
            raise UserError(f"{self.path}: {e}") from None
        except (TypeError, ValueError) as e:  # a metadata value of the wrong type
            raise UserError(f"bad metadata in GGUF file {self.path}: {e}") from None

    def _read_args(self) -> ModelArgs:
        a = self.arch
        heads = int(self.meta(f"{a}.attention.head_count"))
        hidden = int(self.meta(f"{a}.embedding_length"))
        head_dim = int(self.meta(f"{a}.attention.key_length", hidden // heads))
        theta = _f32(self.meta(f"{a}.rope.freq_base", 10000.0))
        layers = int(self.meta(f"{a}.block_count"))
        shape = dict(num_layers=layers, hidden_size=hidden, num_heads=heads, head_dim=head_dim)
        return ModelArgs(
            arch=a,
            vocab_size=self._vocab_size(),
            hidden_size=hidden,
            intermediate_size=int(self.meta(f"{a}.feed_forward_length")),
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=int(self.meta(f"{a}.attention.head_count_kv", heads)),
            head_dim=head_dim,
            rms_norm_eps=_f32(self.meta(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)),
            rope_theta=theta,
            rope_scaling=self._rope_scaling(head_dim, theta),
            qkv_bias="blk.0.attn_q.bias" in self._tensors,
            o_bias="blk.0.attn_output.bias" in self._tensors,
            tie_word_embeddings="output.weight" not in self._tensors,
            max_position_embeddings=int(self.meta(f"{a}.context_length", 4096)),
            **family_fields(self.meta, a, shape, "blk.0.attn_q_norm.weight" in self._tensors),
        )

    def _vocab_size(self) -> int:
        embd = self._tensors.get("token_embd.weight")
        if embd is not None:
            return _hf_shape(embd)[0]
        field = self._reader.fields.get("tokenizer.ggml.tokens")
        if field is None:
            raise UserError(f"GGUF file {self.path} lacks metadata key 'tokenizer.ggml.tokens'")
        return len(field.contents())

    def _rope_scaling(self, head_dim: int, theta: float) -> RopeScaling:
        a = self.arch
        kind = str(self.meta(f"{a}.rope.scaling.type", "none"))
        if kind == "linear":
            return RopeScaling(kind="linear", factor=_f32(self.meta(f"{a}.rope.scaling.factor")))
        if kind == "yarn":
            return self._yarn()
        if kind != "none":
            raise UserError(f"unsupported rope scaling {kind!r} in {self.path}")
        freqs = self._tensors.get(_ROPE_FREQS)
        if freqs is None:
            return RopeScaling()
        original = int(self.meta(f"{a}.rope.scaling.original_context_length", 8192))
        return llama3_scaling_from_factors(dequantize(freqs.data, freqs.tensor_type), head_dim, theta, original)


    def _yarn(self) -> RopeScaling:
        """YaRN as llama.cpp's converter writes it (attn_factor absent: transformers' default)."""
        a = self.arch
        raw = {"rope_type": "yarn", "factor": _f32(self.meta(f"{a}.rope.scaling.factor")),
               "original_max_position_embeddings": int(self.meta(f"{a}.rope.scaling.original_context_length")),
               "attention_factor": _optional_f32(self.meta(f"{a}.rope.scaling.attn_factor", None)),
               "beta_fast": _optional_f32(self.meta(f"{a}.rope.scaling.yarn_beta_fast", None)),
               "beta_slow": _optional_f32(self.meta(f"{a}.rope.scaling.yarn_beta_slow", None))}
        return rope_scaling(raw, {"max_position_embeddings": int(self.meta(f"{a}.context_length", 4096))})


def llama3_scaling_from_factors(factors: np.ndarray, head_dim: int, theta: float, original: int) -> RopeScaling:
    """Recover Llama-3 rope scaling from llama.cpp's per-frequency divisors (`rope_freqs.weight`).

    llama.cpp stores only the divisors; the factor is their maximum, and the low/high frequency
    factors are Llama 3.1's (1, 4). The guess is checked by recomputing every divisor.
    """
    scaling = RopeScaling(kind="llama3", factor=float(factors.max()), original_max_position=original)
    if not np.allclose(llama3_factors(scaling, head_dim, theta), factors.reshape(-1), rtol=1e-3):
        raise UserError("unsupported rope_freqs tensor (not Llama-3 scaling with low/high factors 1/4)")
    return scaling


def llama3_factors(s: RopeScaling, head_dim: int, theta: float) -> np.ndarray:
    """Per-frequency divisors of Llama-3 scaling, as llama.cpp's converter writes them."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * np.pi / inv_freq
    smooth = (s.original_max_position / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    medium = 1.0 / ((1 - smooth) / s.factor + smooth)
    factors = np.where(wavelen > s.original_max_position / s.low_freq_factor, s.factor, medium)
    return np.where(wavelen < s.original_max_position / s.high_freq_factor, 1.0, factors).astype(np.float32)


def _optional_f32(value: float | None) -> float | None:
    return None if value is None else _f32(value)


def _hf_shape(t: ReaderTensor) -> tuple[int, ...]:
    # GGUF lists dimensions fastest-first (ne[0] = row length); HF/torch list them slowest-first.
    return tuple(int(d) for d in reversed(t.shape.tolist()))


def open_reader(path: Path) -> FastReader:
    try:
        reader = FastReader(path)
    except _READ_ERRORS as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"corrupt or truncated GGUF file {path}: {reason}") from None
    size = path.stat().st_size
    for t in reader.tensors:
        # GGUFReader slices its memmap, which silently shortens tensors cut off by truncation.
        if t.data_offset + t.n_bytes > size or t.data.nbytes != t.n_bytes:
            raise UserError(f"corrupt or truncated GGUF file {path}: tensor {t.name!r} extends past the end")
    return reader
