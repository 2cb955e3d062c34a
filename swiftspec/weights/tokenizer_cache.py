"""What a GGUF is converted into: its tokenizer, cached once, and a transformers config.json of its settings.

A GGUF's weights are always read from the file itself (weights/loader.py); only its tokenizer is
kept, under `<cache>/tokenizers/` (a few MB; building it from the GGUF's metadata takes several
times longer than reading it back), keyed by the GGUF's size and mtime.  The entry appears by an
atomic rename, so a crash mid-conversion leaves no half-written entry behind.  `hf_config` writes
the config.json of a model's settings (the tiny test checkpoints; the tokenizer's model type).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from swiftspec.model.args import ModelArgs
from swiftspec.tokenizer import Tokenizer
from swiftspec.weights.gguf import GGUFCheckpoint

FORMAT_VERSION = 1  # bump when the layout of a cached tokenizer changes
DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
# our arch -> (HF model_type, class); a Llama with a sliding window is written as a Mistral
_HF_CLASSES = {"qwen2": ("qwen2", "Qwen2ForCausalLM"), "llama": ("llama", "LlamaForCausalLM"),
               "mistral": ("mistral", "MistralForCausalLM"), "qwen3": ("qwen3", "Qwen3ForCausalLM"),
               "gemma2": ("gemma2", "Gemma2ForCausalLM"), "gemma3": ("gemma3_text", "Gemma3ForCausalLM")}


def tokenizer_dir(gguf: Path, cache_root: Path) -> Path:
    """Where the tokenizer of this GGUF (at its current size and mtime) lives on its own."""
    return cache_root / "tokenizers" / f"{gguf.stem}-{_key(gguf, 'tokenizer')}"


def ensure_tokenizer(gguf: Path, cache_root: Path) -> Path:
    """Return the tokenizer-only directory of `gguf` (tokenizer.json, tokenizer_config.json),
    building it from the GGUF's metadata first if needed."""
    out = tokenizer_dir(gguf, cache_root)
    if (out / "tokenizer.json").is_file():
        return out
    print(f"[swiftspec] reading the tokenizer of {gguf.name} once, into {out}", file=sys.stderr)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        Tokenizer.from_gguf(gguf, tokenizer_type(GGUFCheckpoint(gguf).args)).save(tmp)
        _publish(tmp, out, "tokenizer.json")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


# The model types whose tokenizer class transformers picks for a GGUF as it would from the file's
# config (tests/model/test_families.py: the same tokenizer files); a Llama's (and a Mistral's: a
# GGUF says "llama") goes through transformers' own search.
_TOKENIZER_TYPES = ("qwen2", "qwen3", "gemma2", "gemma3_text")


def tokenizer_type(args: ModelArgs) -> str | None:
    """The transformers model type that picks this GGUF's tokenizer class (Tokenizer.from_gguf), or None."""
    model_type = hf_config(args, torch.float32)["model_type"]
    return model_type if model_type in _TOKENIZER_TYPES else None


def hf_config(args: ModelArgs, dtype: torch.dtype) -> dict[str, Any]:
    """A transformers config.json for args (model/hf_args.model_args reads it back unchanged)."""
    model_type, hf_class = _HF_CLASSES["mistral" if args.arch == "llama" and args.sliding_window else args.arch]
    cfg: dict[str, Any] = {
        "architectures": [hf_class],
        "model_type": model_type,
        "vocab_size": args.vocab_size,
        "hidden_size": args.hidden_size,
        "intermediate_size": args.intermediate_size,
        "num_hidden_layers": args.num_layers,
        "num_attention_heads": args.num_heads,
        "num_key_value_heads": args.num_kv_heads,
        "head_dim": args.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": args.rms_norm_eps,
        "rope_theta": args.rope_theta,
        "tie_word_embeddings": args.tie_word_embeddings,
        "max_position_embeddings": args.max_position_embeddings,
        "torch_dtype": DTYPE_NAMES[dtype],
    }
    if args.arch in ("llama", "qwen3"):
        cfg["attention_bias"] = args.qkv_bias
    cfg.update(_family_config(args))
    s = args.rope_scaling
    if s.kind == "yarn":
        cfg["rope_scaling"] = {"rope_type": "yarn", "factor": s.factor, "original_max_position_embeddings":
                               s.original_max_position, "beta_fast": s.beta_fast, "beta_slow": s.beta_slow,
                               "attention_factor": s.attention_factor, "truncate": s.truncate}
    elif s.kind == "linear":
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": s.factor}
    elif s.kind == "llama3":
        cfg["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": s.factor,
            "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position,
        }
    return cfg


def _family_config(args: ModelArgs) -> dict[str, Any]:
    """The config.json entries of the sliding window and Gemma's block."""
    cfg: dict[str, Any] = {}
    if args.sliding_window is not None and not args.arch.startswith("qwen"):
        cfg["sliding_window"] = args.sliding_window
    if not args.gemma:
        return cfg
    cfg.update(hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=args.query_pre_attn_scalar,
               attn_logit_softcapping=args.attn_softcap, final_logit_softcapping=args.final_softcap)
    if args.sliding_layers:
        cfg["layer_types"] = ["sliding_attention" if s else "full_attention" for s in args.sliding_layers]
    if args.local_rope_theta is not None:
        cfg["rope_local_base_freq"] = args.local_rope_theta
    return cfg


def _key(gguf: Path, kind: str) -> str:
    st = gguf.stat()
    return hashlib.sha1(f"{st.st_size}|{st.st_mtime_ns}|{kind}|v{FORMAT_VERSION}".encode()).hexdigest()[:12]


def _publish(tmp: Path, out: Path, last_file: str) -> None:
    """Rename tmp to out; `last_file` marks a complete entry."""
    try:
        tmp.rename(out)
    except OSError:
        if not (out / last_file).is_file():  # another process finishing first is fine
            raise
