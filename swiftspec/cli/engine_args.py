"""Command-line flags shared by `generate`, `serve`, `bench` and `demo`, generated from the config
dataclasses; flags that only some modes use narrow `--mode auto`, and are refused by other modes.
Flags not given leave their defaults open (device AUTO, weights None): engines.defaults.resolve_defaults
settles them after parsing, in one place."""

from __future__ import annotations

import argparse
import dataclasses

from swiftspec.cli.remote_args import remote_config_from_args
from swiftspec.config import AUTO, MODES, WEIGHT_FORMATS, AutoConfig, ConfigError, EngineConfig, LoadConfig, TreeConfig

_TREE_HELP = {
    "width": "w: leaves expanded per draft forward",
    "verify_size": "bs: tree nodes verified per target forward",
    "depth": "d: draft expansions per round (0 = choose by profiling)",
    "topk": "children proposed per expanded leaf",
    "budget": "most nodes a draft tree may hold",
    "chain_length": "draft tokens per round in chain mode",
    "adaptive": "serial tree: expand only leaves whose draft probability repays a forward (else always d)",
    "adaptive_verify": "tree (with --adaptive) and async: verify only the subtree nodes that repay their rows "
                       "(else always bs)",
    "lookup": "add prompt-lookup (n-gram) candidates from the prompt and output to the tree",
    "lookup_tokens": "most tokens of one prompt-lookup candidate",
    "lookup_branches": "most distinct prompt-lookup continuations per round",
    "lookup_ngram": "longest n-gram that prompt lookup matches",
    "lookup_earlier": "prompt lookup also reads the last request's text that this prompt does not repeat "
                      "(an editor's last suggestion)",
    "draft_context": "prompt tokens the draft model reads: the first few and the last ones (0 = the whole prompt)",
    "fallback": "serial tree/chain: a request whose drafting rounds emit fewer tokens per second than plain "
                "decoding decodes plainly for a while, then drafts again (auto: always on)",
}
SPECULATIVE = ("chain", "tree", "async")
# The modes that use each flag.  Under --mode auto a given flag narrows the candidates to these
# (but for the flags that name the pair, PAIR_FLAGS: auto profiles that pair and may still pick
# ar); an explicitly chosen mode refuses a flag it would ignore.
PAIR_FLAGS = ("draft_model", "draft_weights", "draft_vocab")
FLAG_MODES: dict[str, tuple[str, ...]] = {
    "draft_model": SPECULATIVE, "draft_weights": SPECULATIVE, "draft_vocab": SPECULATIVE,
    "chain_length": ("chain",), "budget": SPECULATIVE,
    "width": ("tree", "async"), "verify_size": ("tree", "async"), "depth": ("tree", "async"),
    "topk": ("tree", "async"), "adaptive": ("tree",), "adaptive_verify": ("tree", "async"),
    "target_tp": ("async",), "draft_tp": ("async",), "draft_cores": ("async",),
    "lookup": ("tree", "async"), "lookup_tokens": ("tree", "async"), "lookup_branches": ("tree", "async"),
    "lookup_ngram": ("tree", "async"), "lookup_earlier": ("tree", "async"), "draft_context": SPECULATIVE,
    "fallback": ("chain", "tree"),
}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_engine_arguments(parser: argparse.ArgumentParser, *, with_mode: bool = True) -> None:
    """Model, placement and tree flags; the tree flags come from TreeConfig's fields.  Flags of
    FLAG_MODES default to None, so that a flag given on the command line can be told apart."""
    defaults = EngineConfig()
    if with_mode:
        parser.add_argument("--mode", choices=(AUTO,) + MODES, default=AUTO,
                            help="decoding engine (default: auto = the fastest here, from a cached profile)")
        parser.add_argument("--reprofile", action="store_true", help="auto: profile this machine and pair again")
    parser.add_argument("--model", default=defaults.target,
                        help="target: bundled name, .gguf file, HF dir, hub id org/name or org/name:file.gguf")
    parser.add_argument("--draft-model", default=None, help="draft, named like --model, or none: prompt lookup "
                        f"alone drafts (default: {defaults.draft})")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="default: cpu unless the CUDA path passed its start-up check here")
    parser.add_argument("--dtype", choices=("bfloat16", "float32", "float16"), default="bfloat16")
    parser.add_argument("--weights", choices=WEIGHT_FORMATS, default=None,
                        help="target weight format (default: gguf for a GGUF on the CPU, its Q4_K/Q5_K/Q6_K/Q8_0/Q5_0/Q4_0 linears "
                             "as stored and the rest int8; else bf16)")
    parser.add_argument("--draft-weights", choices=WEIGHT_FORMATS, default=None,
                        help="draft weight format (default: auto chooses; else on CPU int8 for a bf16 target "
                             "(int4 without VNNI) and int4 for a gguf one, else --weights)")
    parser.add_argument("--max-seq-len", type=int, default=LoadConfig().max_seq_len,
                        help="context length: prompt + new tokens (default 0: the model's own, as far as a quarter "
                             "of the free memory holds its KV cache)")
    parser.add_argument("--draft-vocab", type=int, default=None,
                        help=f"pruned draft LM head size (0 = full vocabulary; default {defaults.draft_vocab})")
    parser.add_argument("--target-tp", type=int, default=None, help="async: tensor-parallel ranks of the target group")
    parser.add_argument("--draft-tp", type=int, default=None, help="async: tensor-parallel ranks of the draft group")
    parser.add_argument("--draft-cores", type=int, default=None, help="async on CPU: draft threads (0 = half)")
    parser.add_argument("--trace", default="", help="write each request's timeline to this file (Chrome "
                        "trace-event JSON: Perfetto, chrome://tracing, `swiftspec trace FILE --png OUT`)")
    parser.add_argument("--worker-timeout", type=float, default=0.0,
                        help="async: seconds a decode round may take before a worker counts as hung "
                             "(0 = a few seconds past the profiled round; a request's first round gets more, "
                             "by prompt length)")
    parser.add_argument("--prompt-cache-mb", type=int, default=EngineConfig().prompt_cache_mb,
                        help="MiB of earlier prompts' and answers' KV kept for later requests that share a prefix, "
                             "least recently used out first (default -1: an eighth of the free memory, at most "
                             "4096; 0: only the last request's, in the live cache)")
    for f in dataclasses.fields(TreeConfig):
        kind = {"action": argparse.BooleanOptionalAction} if isinstance(f.default, bool) else {"type": int}
        parser.add_argument(_flag(f.name), default=None, help=f"{_TREE_HELP[f.name]} (default {f.default})", **kind)


def given_flags(args: argparse.Namespace) -> list[str]:
    """The mode-specific flags given on the command line."""
    return [name for name in FLAG_MODES if getattr(args, name, None) is not None]


def auto_candidates(args: argparse.Namespace) -> tuple[str, ...]:
    """The modes that use every mode-specific flag given, PAIR_FLAGS aside (all of MODES when none is)."""
    flags = [n for n in given_flags(args) if n not in PAIR_FLAGS]
    modes = tuple(m for m in MODES if all(m in FLAG_MODES[n] for n in flags))
    if not modes:
        raise ConfigError(f"flags {', '.join(_flag(n) for n in flags)} apply to no common mode")
    return modes


def check_flags(args: argparse.Namespace, mode: str) -> None:
    """Refuse a flag that an explicitly chosen mode would ignore (one-line ConfigError)."""
    for name in given_flags(args):
        if mode not in FLAG_MODES[name]:
            raise ConfigError(f"{_flag(name)} applies to {'/'.join(FLAG_MODES[name])} only; --mode {mode} "
                              "would ignore it")


def _value(args: argparse.Namespace, name: str, default):  # noqa: ANN001, ANN202 - any field's type
    value = getattr(args, name, None)
    return default if value is None else value


def engine_config_from_args(args: argparse.Namespace, mode: str | None = None) -> EngineConfig:
    """Build the frozen EngineConfig from parsed flags (raises ConfigError on bad values), its
    defaults left open for engines.defaults.resolve_defaults: no check of this machine runs here.
    mode overrides --mode (bench and demo pick their modes themselves, and refuse no flag)."""
    remote = remote_config_from_args(args)
    chosen = mode or ("async" if remote is not None and args.mode == AUTO else args.mode)
    if mode is None and chosen != AUTO:
        check_flags(args, chosen)
    if chosen == AUTO and getattr(args, "fallback", None) is False:
        raise ConfigError("--no-fallback: auto always decodes plainly where drafting does not pay; "
                          "--mode tree or chain drafts every round")
    defaults = EngineConfig()
    target_load = LoadConfig(device=args.device or AUTO, dtype=args.dtype, max_seq_len=args.max_seq_len,
                             weights=args.weights)
    draft_load = dataclasses.replace(target_load, weights=args.draft_weights)
    tree = TreeConfig(**{f.name: _value(args, f.name, f.default) for f in dataclasses.fields(TreeConfig)})
    auto = AutoConfig(modes=auto_candidates(args), choose_draft_weights=args.draft_weights is None,
                      reprofile=getattr(args, "reprofile", False))
    return EngineConfig(
        mode=chosen,
        target=args.model,
        draft=_value(args, "draft_model", defaults.draft),
        target_load=target_load,
        draft_load=draft_load,
        tree=tree,
        draft_vocab=_value(args, "draft_vocab", defaults.draft_vocab),
        target_tp=_value(args, "target_tp", defaults.target_tp),
        draft_tp=_value(args, "draft_tp", defaults.draft_tp),
        draft_cores=_value(args, "draft_cores", defaults.draft_cores),
        trace=args.trace,
        auto=auto,
        worker_timeout=args.worker_timeout,
        remote=remote,
        prompt_cache_mb=args.prompt_cache_mb,
    )
