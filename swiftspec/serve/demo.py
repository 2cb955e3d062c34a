"""`swiftspec demo`: complete a HumanEval prompt with the default pair, async SwiftSpec beside `ar`."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from swiftspec.bench.prompts import load_prompts
from swiftspec.sampling import SamplingParams


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--modes", default="ar,async", help="engines to compare; the last one's text is shown")
    parser.add_argument("--prompt-index", type=int, default=0, help="which HumanEval prompt")
    parser.add_argument("--max-tokens", type=int, default=128)


def run(args: argparse.Namespace, config) -> int:  # config: EngineConfig with the model flags
    from swiftspec.runtime import build_engine
    from swiftspec.tokenizer import IncrementalDecoder

    prompt = load_prompts(args.prompt_index + 1)[args.prompt_index].text
    rows = []
    modes = args.modes.split(",")
    for mode in modes:
        engine = build_engine(dataclasses.replace(config, mode=mode))
        try:
            ids = engine.tokenizer.encode(prompt)
            decoder = IncrementalDecoder(engine.tokenizer)
            show = mode == modes[-1]
            if show:
                sys.stdout.write(f"--- HumanEval/{args.prompt_index}, completed by `{mode}` ---\n{prompt}")
            for tokens in engine.generate(ids, SamplingParams(), args.max_tokens):
                text = "".join(decoder.push(t) for t in tokens)
                if show:
                    sys.stdout.write(text)
                    sys.stdout.flush()
            s = engine.stats
            rows.append((mode, s.tokens_per_s, s.acceptance_length, s.new_tokens))
        finally:
            engine.close()
    print("\n--- greedy, same prompt, one run each ---")
    print(f"{'mode':8} {'tok/s':>8} {'accept len':>11} {'tokens':>7} {'vs ' + modes[0]:>8}")
    for mode, tps, acc, n in rows:
        print(f"{mode:8} {tps:8.2f} {acc:11.2f} {n:7d} {tps / rows[0][1]:7.2f}x")
    return 0
