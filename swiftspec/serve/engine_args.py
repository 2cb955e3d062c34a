"""Command-line flags shared by `generate`, `serve` and `bench`, generated from the config dataclasses."""

from __future__ import annotations

import argparse
import dataclasses

import torch

from swiftspec.config import MODES, EngineConfig, LoadConfig, TreeConfig
from swiftspec.runtime import default_draft_weights

_TREE_HELP = {
    "width": "w: leaves expanded per draft forward",
    "verify_size": "bs: tree nodes verified per target forward",
    "depth": "d: draft expansions per round (0 = choose by profiling)",
    "topk": "children proposed per expanded leaf",
    "budget": "most nodes a draft tree may hold",
    "chain_length": "draft tokens per round in chain mode",
    "adaptive": "serial tree: 1 = expand only leaves whose draft probability repays a forward, 0 = always d",
    "adaptive_verify": "serial tree with --adaptive 1: 1 = verify only the subtree nodes that repay their rows, "
                       "0 = always bs",
    "lookup": "1 = add prompt-lookup (n-gram) candidates from the prompt and output to the tree, 0 = off",
    "lookup_tokens": "most tokens of one prompt-lookup candidate",
    "lookup_branches": "most distinct prompt-lookup continuations per round",
    "lookup_ngram": "longest n-gram that prompt lookup matches",
}


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def add_engine_arguments(parser: argparse.ArgumentParser, *, with_mode: bool = True) -> None:
    """Model, placement and tree flags; the tree flags come from TreeConfig's fields."""
    defaults = EngineConfig()
    if with_mode:
        parser.add_argument("--mode", choices=MODES, default="ar", help="decoding engine (default: ar)")
    parser.add_argument("--model", default=defaults.target, help="target: bundled name, .gguf file or HF dir")
    parser.add_argument("--draft-model", default=defaults.draft,
                        help="draft: bundled name, .gguf file, HF dir, or none (prompt lookup alone drafts)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    parser.add_argument("--dtype", choices=("bfloat16", "float32", "float16"), default="bfloat16")
    parser.add_argument("--weights", choices=("bf16", "int8", "int4"), default="bf16", help="target weight format")
    parser.add_argument("--draft-weights", choices=("bf16", "int8", "int4"), default=None,
                        help="draft weight format (default: int8 for a bf16 target on CPU, else --weights)")
    parser.add_argument("--max-seq-len", type=int, default=LoadConfig().max_seq_len, help="KV cache length")
    parser.add_argument("--draft-vocab", type=int, default=defaults.draft_vocab,
                        help="pruned draft LM head size (0 = full vocabulary)")
    parser.add_argument("--target-tp", type=int, default=1, help="async: tensor-parallel ranks of the target group")
    parser.add_argument("--draft-tp", type=int, default=1, help="async: tensor-parallel ranks of the draft group")
    parser.add_argument("--draft-cores", type=int, default=0, help="async on CPU: draft threads (0 = half)")
    parser.add_argument("--trace", default="", help="async: write the per-round timeline to this JSON file")
    for f in dataclasses.fields(TreeConfig):
        flag = "--" + f.name.replace("_", "-")
        parser.add_argument(flag, type=int, default=f.default, help=_TREE_HELP.get(f.name, f.name))


def engine_config_from_args(args: argparse.Namespace, mode: str | None = None) -> EngineConfig:
    """Build the frozen EngineConfig from parsed flags (raises ConfigError on bad values)."""
    device = args.device or default_device()
    target_load = LoadConfig(device=device, dtype=args.dtype, max_seq_len=args.max_seq_len, weights=args.weights)
    draft_load = dataclasses.replace(target_load, weights=args.draft_weights or default_draft_weights(target_load))
    tree = TreeConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TreeConfig)})
    return EngineConfig(
        mode=mode or args.mode,
        target=args.model,
        draft=args.draft_model,
        target_load=target_load,
        draft_load=draft_load,
        tree=tree,
        draft_vocab=args.draft_vocab,
        target_tp=args.target_tp,
        draft_tp=args.draft_tp,
        draft_cores=args.draft_cores,
        trace=args.trace,
    )
