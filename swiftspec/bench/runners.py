"""Builds every benchmarked mode once: our engines, the transformers peers and the llama.cpp peers.

A peer that cannot run here (llama.cpp not installed, a source that is not a GGUF) is skipped with
a one-line reason that the report carries; our own modes must build.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from swiftspec.bench import peers_llamacpp as lc
from swiftspec.bench.harness import EngineRunner, ModeSpec, Runner
from swiftspec.bench.peers_hf import HFRunner, load_hf_model, weight_bytes
from swiftspec.bench.roofline import WeightBytes, gguf_weight_bytes, our_weight_bytes
from swiftspec.config import NO_DRAFT, EngineConfig, TreeConfig
from swiftspec.engines import build_engine
from swiftspec.engines.defaults import default_draft_weights
from swiftspec.engines.startup import StartupProfile
from swiftspec.weights.loader import model_args
from swiftspec.weights.source import resolve_source


@dataclass(slots=True)
class Lineup:
    """The loaded modes, in command-line order, with what the report needs to know about each."""

    runners: dict[str, Runner] = field(default_factory=dict)
    weight_bytes: dict[str, WeightBytes] = field(default_factory=dict)
    backends: dict[str, str] = field(default_factory=dict)  # what runs each mode, in words
    draft_forwards: dict[str, float] = field(default_factory=dict)  # per round, for modes that cannot count
    skipped: dict[str, str] = field(default_factory=dict)  # mode -> why it did not run
    tokenizer: object = None  # swiftspec.tokenizer.Tokenizer of the target: encodes prompts, gives EOS

    def close(self) -> None:
        for runner in self.runners.values():
            runner.close()
        self.runners.clear()


def mode_config(base: EngineConfig, spec: ModeSpec, draft_weights: str | None) -> EngineConfig:
    """The EngineConfig of one of our modes: `tree@int4` sets the target's weight format, and the
    draft's unless auto chose it for this mode or --draft-weights is given (default_draft_weights)."""
    target_load = dataclasses.replace(base.target_load, weights=spec.weights or base.target_load.weights)
    draft = spec.draft_weights or draft_weights or default_draft_weights(target_load)
    return dataclasses.replace(
        base,
        mode=spec.variant,
        target_load=target_load,
        draft_load=dataclasses.replace(base.draft_load, weights=draft),
    )


@dataclass(frozen=True, slots=True)
class Sources:
    """Local files of the model pair: GGUF files or HF directories (draft None when no mode drafts)."""

    target: Path
    draft: Path | None


def resolve_sources(base: EngineConfig, specs: list[ModeSpec]) -> Sources:
    """Local paths of the pair (pulling bundled models if needed); the draft only when a mode drafts."""
    needs_draft = base.draft != NO_DRAFT and any(s.speculative for s in specs)
    return Sources(resolve_source(base.target), resolve_source(base.draft) if needs_draft else None)


def build_lineup(lineup: Lineup, specs: list[ModeSpec], base: EngineConfig, args: argparse.Namespace,
                 sources: Sources, startups: dict[str, StartupProfile | None]) -> None:
    """Load every mode of `specs` once into `lineup` (each keeps its models until lineup.close()).
    startups: the start-up profile of each `auto` mode's engine, by mode name (auto's decisions)."""
    hf_models: dict[str, torch.nn.Module] = {}
    try:
        for spec in specs:
            print(f"bench: loading {spec.name}", file=sys.stderr)
            if spec.kind != "ours" and spec.speculative and sources.draft is None:
                lineup.skipped[spec.name] = "no draft model (--draft-model none)"
            elif spec.kind == "ours":
                _add_ours(lineup, spec, mode_config(base, spec, args.draft_weights), sources, args,
                          startups.get(spec.name))
            elif spec.kind == "hf":
                _add_hf(lineup, spec, args, hf_models, sources)
            elif spec.kind == "ikllama":
                _add_ikllama(lineup, spec, args, sources, base.target_load.max_seq_len)
            else:
                _add_llamacpp(lineup, spec, args, sources, base.target_load.max_seq_len)
    except BaseException:
        lineup.close()  # stop worker processes and servers already started
        raise


def _add_ours(lineup: Lineup, spec: ModeSpec, config: EngineConfig, sources: Sources,
              args: argparse.Namespace, startup: StartupProfile | None) -> None:
    engine = build_engine(config, startup=startup)
    lineup.runners[spec.name] = EngineRunner(engine, args.temperature, args.top_p)
    load, dload = config.target_load, config.draft_load
    target_bytes = our_weight_bytes(model_args(sources.target), load.dtype, load.weights)
    drafts = spec.speculative and sources.draft is not None
    draft_bytes = our_weight_bytes(model_args(sources.draft), dload.dtype, dload.weights) if drafts else 0
    lineup.weight_bytes[spec.name] = WeightBytes(target_bytes, draft_bytes)
    fmt = load.dtype if load.weights == "bf16" else f"{load.weights} weights, {load.dtype} activations"
    draft = f"; {dload.weights} draft" if drafts else ""
    lineup.backends[spec.name] = f"swiftspec {spec.variant} ({fmt}{draft})"
    lineup.draft_forwards[spec.name] = _our_draft_forwards(engine, config)


def _our_draft_forwards(engine: object, config: EngineConfig) -> float:
    """Draft forwards per round of our modes: k for chain, the tree depth d for tree/async (when d is
    0 the engine picked it at start-up and keeps it in its StartupProfile). Async drafts may also top up the tree, so its figure is a lower estimate."""
    if config.mode == "ar":
        return 0.0
    if config.mode == "chain":
        return float(config.tree.chain_length)
    return float(config.tree.depth or engine.profile.depth)


def _add_hf(lineup: Lineup, spec: ModeSpec, args: argparse.Namespace,
            cache: dict[str, torch.nn.Module], sources: Sources) -> None:
    """transformers peers; hf-ar and hf-assisted share one copy of the target."""
    from transformers import __version__ as hf_version

    def model(role: str, path: Path) -> torch.nn.Module:
        if role not in cache:
            cache[role] = load_hf_model(path, args.dtype)
        return cache[role]

    target = model("target", sources.target)
    assistant = model("draft", sources.draft) if spec.variant == "assisted" else None
    eos = lineup.tokenizer.eos_token_ids
    lineup.runners[spec.name] = HFRunner(target, eos, args.temperature, assistant, args.top_p)
    lineup.weight_bytes[spec.name] = WeightBytes(weight_bytes(target), weight_bytes(assistant) if assistant else 0)
    helper = ", draft as assistant_model" if assistant is not None else ""
    lineup.backends[spec.name] = f"transformers {hf_version} generate ({args.dtype}{helper})"


def _add_llamacpp(lineup: Lineup, spec: ModeSpec, args: argparse.Namespace, sources: Sources, n_ctx: int) -> None:
    """llama.cpp peers: llama-server for spec when given (native speculation), else llama-cpp-python."""
    draft = sources.draft if spec.variant == "spec" else None
    if _skips_hf_dirs(lineup, spec, [sources.target] + ([draft] if draft else []), "llama.cpp"):
        return
    use_server = bool(args.llama_server) and (spec.variant == "spec" or not lc.llama_cpp_available())
    if not use_server and not lc.llama_cpp_available():
        lineup.skipped[spec.name] = "neither llama-cpp-python (pip install llama-cpp-python) nor --llama-server"
        return
    eos = lineup.tokenizer.eos_token_ids
    if use_server:
        log = Path(args.out) / f"llama-server-{spec.name}.log"
        runner = lc.LlamaServerRunner(args.llama_server, sources.target, args.threads, n_ctx, eos,
                                      (args.temperature, args.top_p), log, draft)
        lineup.backends[spec.name] = f"llama-server {args.llama_server}"
    else:
        k = TreeConfig().chain_length if args.chain_length is None else args.chain_length
        runner = lc.LlamaPyRunner(sources.target, args.threads, n_ctx, eos, (args.temperature, args.top_p), draft, k)
        lineup.backends[spec.name] = f"llama-cpp-python {lc.llama_cpp_version()}" + (
            f" (draft model, k={k})" if draft else "")
    lineup.runners[spec.name] = runner
    _gguf_peer_bytes(lineup, spec, sources, draft)


def _add_ikllama(lineup: Lineup, spec: ModeSpec, args: argparse.Namespace, sources: Sources, n_ctx: int) -> None:
    """ik_llama.cpp peers: its llama-server (given, or the `make install-ikllama` build for this CPU)."""
    draft = sources.draft if spec.variant == "spec" else None
    if _skips_hf_dirs(lineup, spec, [sources.target] + ([draft] if draft else []), "ik_llama.cpp"):
        return
    binary = args.ik_llama_server or lc.ik_llama_server()
    if binary is None:
        lineup.skipped[spec.name] = "ik_llama.cpp is not built for this CPU: make install-ikllama (or --ik-llama-server)"
        return
    log = Path(args.out) / f"ik-llama-server-{spec.name}.log"
    own_log = Path(args.out) / f"ik-llama-{spec.name}"  # its log file (".log" added), else llama.log in the cwd
    tok = lineup.tokenizer
    lineup.runners[spec.name] = lc.LlamaServerRunner(
        binary, sources.target, args.threads, n_ctx, tok.eos_token_ids, (args.temperature, args.top_p), log, draft,
        extra=(*lc.IK_FLAGS, "--log-file", str(own_log)), encode=tok.encode)
    lineup.backends[spec.name] = f"ik_llama.cpp llama-server {binary} ({' '.join(lc.IK_FLAGS)})"
    _gguf_peer_bytes(lineup, spec, sources, draft)


def _skips_hf_dirs(lineup: Lineup, spec: ModeSpec, files: list[Path], peer: str) -> bool:
    """True (the mode recorded as skipped) when one of the files a llama.cpp-family peer would load is
    an HF directory, which these peers cannot read."""
    if any(p.is_dir() for p in files):
        lineup.skipped[spec.name] = f"{peer} needs GGUF files; the model is an HF directory"
        return True
    return False


def _gguf_peer_bytes(lineup: Lineup, spec: ModeSpec, sources: Sources, draft: Path | None) -> None:
    """The weight bytes a llama.cpp-family peer streams: the GGUF files as stored."""
    lineup.weight_bytes[spec.name] = WeightBytes(gguf_weight_bytes(sources.target),
                                                 gguf_weight_bytes(draft) if draft else 0)
