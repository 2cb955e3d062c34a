"""The `swiftspec bench` command: our modes and peer implementations side by side on the same prompts
and weights.

Writes <out>/report.json (its content: build_report), report.md and report.png. The CLI adds the
shared model flags (cli.engine_args) and then `add_arguments`, and passes `run` the engine config of
those flags.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

import torch

from swiftspec.bench import auto_report
from swiftspec.bench.divergence import TieProbe, compare_to_ar
from swiftspec.bench.harness import ModeSpec, RunResult, check_groups, parse_modes, run_interleaved
from swiftspec.bench.perplexity import for_bench
from swiftspec.bench.plot import write_plot
from swiftspec.bench.prompts import Prompt, load_prompts, split_warmup
from swiftspec.bench.report import machine_info, print_roofline, write_json, write_markdown
from swiftspec.bench.roofline import measure_bandwidth
from swiftspec.bench.runners import Lineup, build_lineup, mode_config, resolve_sources
from swiftspec.bench.summary import DEFINITIONS, ModeInputs, add_speedups, mode_entry
from swiftspec.config import EngineConfig
from swiftspec.errors import UserError
from swiftspec.fim import FimInput, find_fim_tokens, plain_prompt
from swiftspec.runner.load import CONTEXT_STEP, with_context
from swiftspec.weights.loader import load_tokenizer

ALL_MODES = "ar,chain,tree,async,auto,hf-ar,hf-assisted,llamacpp-ar,llamacpp-spec"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Bench flags (the model, dtype and tree flags come from add_engine_arguments)."""
    parser.add_argument("--modes", default=ALL_MODES,
                        help="comma list of ar, chain, tree, async, auto (optionally @bf16/@int8/@int4), hf-ar, "
                             "hf-assisted, llamacpp-ar, llamacpp-spec, ikllama-ar, ikllama-spec; `;` separates groups loaded one after "
                             f"another when all modes do not fit in memory at once (default: {ALL_MODES})")
    parser.add_argument("--prompts", type=int, default=10, help="number of prompts (first N; default 10)")
    parser.add_argument("--dataset", default=None,
                        help='"humaneval" (default), "chat" (40 bundled chat questions), "longcode" (8 source files '
                             'of 2.1k-3.5k tokens to continue), "fim" (8 fill-in-the-middle cuts), "longdoc" (8 questions '
                             'about documents of 2.4k-4.5k tokens; use --chat) or a JSONL of '
                             '{"prompt": ...[, "suffix": ...]}')
    parser.add_argument("--chat", action="store_true",
                        help="send each prompt through the target's chat template as a user message, as serve does")
    parser.add_argument("--max-tokens", type=int, default=128, help="new tokens per prompt (default 128)")
    parser.add_argument("--out", default="bench_out", help="output directory (default bench_out)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0,
                        help="nucleus sampling for every mode and peer (default 1.0 = off)")
    parser.add_argument("--seed", type=int, default=0, help="prompt i is run with seed + i in every mode")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per mode first (default 1)")
    parser.add_argument("--llama-server", default=None, help="llama-server binary for the llama.cpp peers")
    parser.add_argument("--ik-llama-server", default=None,
                        help="ik_llama.cpp's llama-server for the ikllama peers (default: the build of "
                             "`make install-ikllama` for this CPU)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="CPU threads for every mode and the bandwidth test (default: all cores)")
    parser.add_argument("--trace-dir", default=None,
                        help="write one trace (Chrome trace-event JSON) per mode and prompt into this directory")
    parser.add_argument("--reprofile", action="store_true", help="auto: profile this machine and pair again")
    parser.add_argument("--perplexity", default=None, metavar="TEXT",
                        help="also measure the perplexity of each weight format the run used (and of llama.cpp "
                             "where its peer ran) on this text, windowed like llama-perplexity; report.md shows "
                             "it beside tok/s")
    parser.add_argument("--perplexity-windows", type=int, default=4, help="512-token windows scored (default 4)")


def run(args: argparse.Namespace, base: EngineConfig) -> int:
    """Load the modes (group by group), run them interleaved per prompt, and write the report.
    base: the engine flags' config (mode ar); each mode's config is derived from it."""
    specs = parse_modes(args.modes)
    _check_args(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    specs, decisions = auto_report.resolve(specs, base, args.draft_weights)
    check_groups(specs)
    sources = resolve_sources(base, specs)

    lineup = Lineup(tokenizer=load_tokenizer(sources.target))
    prompts, warmup = split_warmup(load_prompts(args.prompts + args.warmup, args.dataset), args.prompts, args.warmup)
    ids = [_encode(lineup.tokenizer, p, args.chat) for p in prompts]
    warm = [_encode(lineup.tokenizer, p, args.chat) for p in warmup]
    base = _context(base, ids + warm, args.max_tokens)
    bandwidths = [measure_bandwidth(args.threads)]  # before any model takes memory
    results: dict[str, list[RunResult]] = {}
    groups = sorted({s.group for s in specs})
    for g in groups:
        build_lineup(lineup, [s for s in specs if s.group == g], base, args, sources,
                     {name: d.startup for name, d in decisions.items()})
        try:
            label = "bench" if len(groups) == 1 else f"bench group {g + 1}/{len(groups)}"
            results.update(run_interleaved(lineup.runners, ids, args.max_tokens, args.seed, warm, label,
                                           Path(args.trace_dir) if args.trace_dir else None))
        finally:
            lineup.close()  # frees memory for the next group and the tie probe
    # Measured again after the runs: the bound must hold, so keep the faster (less disturbed) figure.
    bandwidths.append(measure_bandwidth(args.threads))
    report = build_report(specs, lineup, results, ids, max(bandwidths), base, args)
    report["bandwidth_samples_gb_s"] = [b / 1e9 for b in bandwidths]
    report["auto"] = auto_report.auto_entries(decisions, specs, report["modes"], base.target_load.weights)
    if args.perplexity:
        report["perplexity"] = _perplexity(args, base, specs, results)
    write_json(report, out / "report.json")
    write_markdown(report, out / "report.md")

    write_plot(report, out / "report.png")
    print_roofline(report)
    print(f"bench: wrote {out / 'report.json'}, {out / 'report.md'}, {out / 'report.png'}", file=sys.stderr)
    return 0


def _perplexity(args: argparse.Namespace, base: EngineConfig, specs: list[ModeSpec],
                results: dict[str, list[RunResult]]) -> dict[str, dict]:
    """Quality beside speed: the perplexity of every weight format our modes ran (models loaded
    one at a time, after the timed runs)."""
    ran = [s for s in specs if s.name in results]
    formats = sorted({s.weights or base.target_load.weights for s in ran if s.kind == "ours"})
    llama = any(s.kind == "llamacpp" for s in ran)
    return for_bench(base.target, args.perplexity, formats, llama, args.perplexity_windows, args.threads)


def _check_args(args: argparse.Namespace) -> None:
    if args.max_tokens < 1:
        raise UserError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    if args.threads < 1:
        raise UserError(f"--threads must be >= 1, got {args.threads}")
    if args.warmup < 0:
        raise UserError(f"--warmup must be >= 0, got {args.warmup}")
    if args.temperature < 0:
        raise UserError(f"--temperature must be >= 0, got {args.temperature}")
    if not 0 < args.top_p <= 1:
        raise UserError(f"--top-p must be in (0, 1], got {args.top_p}")
    if args.perplexity and not Path(args.perplexity).is_file():
        raise UserError(f"--perplexity: no such file {args.perplexity}")


def _encode(tokenizer, prompt: Prompt, chat: bool) -> list[int]:
    """Prompt ids: the raw text, (chat) a user message rendered by the chat template, or (a prompt
    with a suffix) the fill-in-the-middle prompt that serve's `suffix` makes."""
    if prompt.suffix is not None:
        tokens = find_fim_tokens(tokenizer)
        if chat or tokens is None:
            raise UserError("fill-in-the-middle prompts (a suffix) need a model with FIM tokens, without --chat")
        return plain_prompt(tokenizer, tokens, FimInput(prefix=prompt.text, suffix=prompt.suffix))
    return tokenizer.chat([{"role": "user", "content": prompt.text}]) if chat else tokenizer.encode(prompt.text)


def _context(base: EngineConfig, ids: list[list[int]], max_tokens: int) -> EngineConfig:
    """base with a context that holds every prompt and its new tokens: the given --max-seq-len
    (checked), else just what the prompts need (every mode loaded at once keeps a KV cache this long)."""
    need = max(len(p) for p in ids) + max_tokens
    limit = base.target_load.max_seq_len
    if limit and need > limit:
        raise UserError(f"a prompt has {need - max_tokens} tokens; with --max-tokens {max_tokens} it exceeds "
                        f"--max-seq-len {limit}")
    if limit:
        return base
    return with_context(base, -(-need // CONTEXT_STEP) * CONTEXT_STEP)


def build_report(
    specs: list[ModeSpec],
    lineup: Lineup,
    results: dict[str, list[RunResult]],
    prompts: list[list[int]],
    bandwidth: float,
    base: EngineConfig,
    args: argparse.Namespace,
) -> dict:
    """report.json's content.  The tokens of each mode are compared with our `ar` of the same
    weight format (`tree@int4` with `ar@int4`; the first `ar` mode when there is none): greedy,
    every mode (our target runs once per divergent mode to classify ties); sampled, our modes,
    which draw every position's token with the same seeded uniform (sampling.Draws)."""
    ran = [s for s in specs if s.name in results]
    ars = [s for s in ran if s.kind == "ours" and s.variant == "ar"]

    def comparable(spec: ModeSpec) -> bool:
        return bool(ars) and (args.temperature == 0 or spec.kind == "ours")
    probes: dict[str, TieProbe] = {}

    def divergences(spec: ModeSpec) -> list:
        ref = next((a for a in ars if a.weights == spec.weights), ars[0])
        if ref.name not in probes:
            probes[ref.name] = TieProbe(base.target, mode_config(base, ref, args.draft_weights).target_load)
        return compare_to_ar([r.tokens for r in results[ref.name]], [r.tokens for r in results[spec.name]],
                             prompts, probes[ref.name])

    modes = {}
    try:
        for spec in ran:
            divs = divergences(spec) if comparable(spec) else []
            inputs = ModeInputs(spec=spec, results=results[spec.name], backend=lineup.backends[spec.name],
                                weights=lineup.weight_bytes[spec.name],
                                draft_forwards_estimate=lineup.draft_forwards.get(spec.name, 0.0),
                                matches_ar=not divs if comparable(spec) else None, divergences=divs)
            modes[spec.name] = mode_entry(inputs, [len(p) for p in prompts], bandwidth)
            modes[spec.name]["weights"] = spec.weights or base.target_load.weights if spec.kind == "ours" else None
    finally:
        for probe in probes.values():
            probe.close()
    add_speedups(modes)
    return {
        "machine": machine_info(args.threads),
        "settings": _settings(args, base, len(prompts)),
        "definitions": DEFINITIONS,
        "bandwidth_gb_s": bandwidth / 1e9,
        "modes": modes,
        "skipped": dict(lineup.skipped),
    }


def _settings(args: argparse.Namespace, base: EngineConfig, n_prompts: int) -> dict:
    return {
        "modes": args.modes,
        "prompts": n_prompts,
        "dataset": args.dataset or "HumanEval",
        "perplexity_text": args.perplexity,
        "chat_template": args.chat,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "seed": args.seed,
        "warmup": args.warmup,
        "threads": args.threads,
        "target": base.target,
        "draft": base.draft,
        "dtype": base.target_load.dtype,
        "weights": base.target_load.weights,
        "max_seq_len": base.target_load.max_seq_len,
        "tree": dataclasses.asdict(base.tree),
    }
