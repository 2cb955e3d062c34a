"""The `swiftspec` command: generate, serve, worker, bench, demo, forecast, perplexity, trace, info and models.

The one module whose swiftspec imports sit inside functions: each command imports its front end
(serve, bench, the engines: torch, uvicorn, matplotlib) only when it runs, so that `swiftspec
--help` or a flag error answers at once."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from swiftspec.cli.engine_args import add_engine_arguments, engine_config_from_args
from swiftspec.cli.remote_args import add_remote_arguments
from swiftspec.config import EngineConfig
from swiftspec.errors import EngineFault, UserError


def _add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, default=128, help="new tokens to generate")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--min-p", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=None)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="swiftspec", description="Low-latency speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="stream a completion of PROMPT to stdout")
    gen.add_argument("prompt", help="prompt text ('-' reads standard input)")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    _add_sampling_arguments(gen)
    add_engine_arguments(gen)
    add_remote_arguments(gen)

    srv = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
    add_engine_arguments(srv)
    add_remote_arguments(srv)
    from swiftspec.serve import server

    server.add_arguments(srv)

    worker = sub.add_parser("worker", help="the draft host of async across machines (see --rendezvous)")
    add_engine_arguments(worker, with_mode=False)
    add_remote_arguments(worker, worker=True)

    bench = sub.add_parser("bench", help="benchmark modes and peers side by side")
    add_engine_arguments(bench, with_mode=False)
    from swiftspec.bench import command as bench_command

    bench_command.add_arguments(bench)

    demo = sub.add_parser("demo", help="complete a HumanEval prompt: ar, the auto choice and async side by side")
    add_engine_arguments(demo, with_mode=False)
    from swiftspec.cli import demo as demo_mod

    demo_mod.add_arguments(demo)

    ppl = sub.add_parser("perplexity", help="perplexity of each weight format on a text (llama-perplexity windows)")
    from swiftspec.bench import perplexity

    perplexity.add_arguments(ppl)

    trace = sub.add_parser("trace", help="summarize a --trace file, and draw its timeline (--png)")
    from swiftspec.cli import trace_view

    trace_view.add_arguments(trace)

    fc = sub.add_parser("forecast", help="predicted tok/s of each mode here, and of async with the draft on a second host")
    add_engine_arguments(fc, with_mode=False)
    from swiftspec.cli import forecast

    forecast.add_arguments(fc)

    info = sub.add_parser("info", help="CPU features, the ISA level in use and the path of each kernel")
    info.add_argument("--json", action="store_true", help="print the report as JSON")
    info.add_argument("--server", default=None, metavar="URL", help="also the prompt cache of the server at URL "
                      "(its /metrics: size, texts, hit rate; the key from $SWIFTSPEC_API_KEY)")

    models = sub.add_parser("models", help="the bundled default model pair; info: what a model file holds")
    models.add_argument("action", choices=("list", "pull", "info"))
    models.add_argument("names", nargs="*", help="models to pull (default: the default pair); info: GGUF files, "
                                                 "HF directories or bundled names")
    return parser


def _settled_config(args: argparse.Namespace, mode: str | None = None) -> EngineConfig:
    """The engine config of the flags, its open defaults settled once (engines.defaults.resolve_defaults)."""
    from swiftspec.engines.defaults import resolve_defaults

    return resolve_defaults(engine_config_from_args(args, mode))


def _generate(args: argparse.Namespace) -> int:
    from swiftspec.engines import build_engine
    from swiftspec.sampling import SamplingParams
    from swiftspec.tokenizer import IncrementalDecoder

    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            min_p=args.min_p, seed=args.seed)
    prompt_text = sys.stdin.read() if args.prompt == "-" else args.prompt
    engine = build_engine(_settled_config(args))
    try:
        tok = engine.tokenizer
        ids = tok.chat([{"role": "user", "content": prompt_text}]) if args.chat else tok.encode(prompt_text)
        decoder = IncrementalDecoder(tok)
        generation = engine.generate(ids, params, args.max_tokens)
        for tokens in generation:
            sys.stdout.write("".join(decoder.push(t) for t in tokens))
            sys.stdout.flush()
        sys.stdout.write(decoder.flush() + "\n")
        print(format_stats(generation.stats), file=sys.stderr)
    finally:
        engine.close()
    return 0


def format_stats(s) -> str:  # s: GenerationStats
    """The one stats line printed on stderr after a generation."""
    return (
        f"[swiftspec] prompt tokens: {s.prompt_tokens}, new tokens: {s.new_tokens}, "
        f"ttft: {s.ttft_s:.3f} s, {s.tokens_per_s:.2f} tok/s, acceptance length: {s.acceptance_length:.2f}, "
        f"rounds: {s.rounds}, draft: {s.draft_s:.2f} s, verify: {s.verify_s:.2f} s"
    )


def _info(args: argparse.Namespace) -> int:
    from swiftspec.cli.cache_info import prompt_cache_line
    from swiftspec.kernels.capability import capability
    from swiftspec.parallel.numa import placement_line, read_nodes

    report, placement = capability(), placement_line(read_nodes())  # placement: NUMA nodes and each async group's
    cache = prompt_cache_line(args.server)
    if args.json:
        print(json.dumps(report.to_json() | {"placement": placement, "prompt_cache": cache}, indent=2))
    else:
        print("\n".join(report.lines() + [placement, cache]))
    return 0


def _models(args: argparse.Namespace) -> int:
    from swiftspec.weights import bundled

    if args.action == "list":
        for row in bundled.list_models():
            print(row)
        return 0
    if args.action == "info":
        return _models_info(args.names)
    for name in args.names or bundled.DEFAULT_PAIR:
        print(bundled.pull(name))
    return 0


def _models_info(names: list[str]) -> int:
    """`models info PATH...`: each model's family, size, tensor types and how it would run."""
    from swiftspec.weights import bundled
    from swiftspec.weights.describe import describe

    if not names:
        raise UserError("models info needs a GGUF file, an HF directory or a bundled name")
    for name in names:
        spec = bundled.BUNDLED.get(name)
        path = bundled.model_path(spec, bundled.cache_dir()) if spec else Path(name).expanduser()
        if spec and not bundled.is_pulled(spec, bundled.cache_dir()):
            raise UserError(f"{name} is not pulled yet (swiftspec models pull {name})")
        print("\n".join(describe(path).lines()))
    return 0


def run(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "generate":
        return _generate(args)
    if args.command == "serve":
        from swiftspec.serve import server

        # defaults left open: the server settles them while it already listens (server.run)
        return server.run(server.server_config_from_args(args), engine_config_from_args(args))
    if args.command == "demo":
        from swiftspec.cli import demo

        return demo.run(args, _settled_config(args, mode="auto"))
    if args.command == "worker":
        from swiftspec.distributed.draft_host import serve_draft

        args.model = args.draft_model or EngineConfig().draft  # the draft host holds no target: formats follow the draft
        return serve_draft(_settled_config(args, mode="async"), once=args.once)
    if args.command == "bench":
        from swiftspec.bench import command as bench_command

        return bench_command.run(args, _settled_config(args, mode="ar"))
    if args.command == "trace":
        from swiftspec.cli import trace_view

        return trace_view.run(args)
    if args.command == "forecast":
        from swiftspec.cli import forecast

        return forecast.run(args, _settled_config(args, mode="auto"))
    if args.command == "info":
        return _info(args)
    if args.command == "perplexity":
        from swiftspec.bench import perplexity

        return perplexity.run(args)
    return _models(args)


def main(argv: list[str] | None = None) -> int:
    """Entry point: user errors and worker faults become one line on stderr and exit code 2 or 3,
    never a traceback."""
    try:
        return run(argv)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except EngineFault as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
