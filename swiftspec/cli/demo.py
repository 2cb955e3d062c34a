"""`swiftspec demo`: complete a HumanEval prompt with the default pair: `ar`, the engine `--mode auto`
picks on this machine, and `async`, side by side; when async loses, one line says what it needs."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass

from swiftspec.bench.prompts import load_prompts
from swiftspec.config import AUTO, MODES, EngineConfig
from swiftspec.engines import build_engine
from swiftspec.engines.auto.choose import decide
from swiftspec.engines.startup import StartupProfile
from swiftspec.errors import UserError
from swiftspec.sampling import SamplingParams
from swiftspec.tokenizer import IncrementalDecoder


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--modes", default="ar,auto,async",
                        help="engines side by side (auto: the one --mode auto picks here); the text shown is "
                             "the auto choice's (else the last mode's)")
    parser.add_argument("--prompt-index", type=int, default=0, help="which HumanEval prompt")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--reprofile", action="store_true", help="auto: profile this machine and pair again")


@dataclass(frozen=True, slots=True)
class Row:
    """One engine's run of the prompt."""

    label: str
    tokens_per_s: float
    acceptance_length: float
    tokens: int


def _lineup(args: argparse.Namespace, config: EngineConfig):  # -> (list[(label, EngineConfig)], Decision | None)
    """The engines to run, in order, without repeats (auto's choice may be one of the others)."""
    names = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in names if m not in MODES + (AUTO,)]
    if bad or not names:
        raise UserError(f"demo --modes: unknown mode {bad[0]!r}" if bad else "demo --modes is empty")
    decision = None
    if AUTO in names:
        decision = decide(config)
        print(decision.line(), file=sys.stderr)
    lineup: list[tuple[str, EngineConfig]] = []
    for name in names:
        cfg = decision.config if name == AUTO else dataclasses.replace(config, mode=name)
        if name == "async" and decision is not None:
            best = next((p for p in decision.best_per_mode if p.mode == "async"), None)
            weights = best.draft_weights if best else cfg.draft_load.weights
            cfg = dataclasses.replace(cfg, draft_load=dataclasses.replace(cfg.draft_load, weights=weights))
        label = f"{cfg.mode} (auto)" if name == AUTO else name
        same = [i for i, (_, c) in enumerate(lineup) if c.mode == cfg.mode]
        if same:
            lineup[same[0]] = (f"{cfg.mode} (auto)", lineup[same[0]][1]) if name == AUTO else lineup[same[0]]
            continue
        lineup.append((label, cfg))
    return lineup, decision


def _run_one(cfg: EngineConfig, prompt: str, max_tokens: int, show: bool, header: str,
             startup: StartupProfile | None) -> Row:
    """startup: the engine's start-up profile, where auto's decision holds it (None: it measures its own)."""
    engine = build_engine(cfg, startup=startup)
    try:
        decoder = IncrementalDecoder(engine.tokenizer)
        if show:
            sys.stdout.write(f"{header}\n{prompt}")
        generation = engine.generate(engine.tokenizer.encode(prompt), SamplingParams(), max_tokens)
        for tokens in generation:
            text = "".join(decoder.push(t) for t in tokens)
            if show:
                sys.stdout.write(text)
                sys.stdout.flush()
        s = generation.stats
        return Row(cfg.mode, s.tokens_per_s, s.acceptance_length, s.new_tokens)
    finally:
        engine.close()


def run(args: argparse.Namespace, config: EngineConfig) -> int:  # config: the model flags, mode auto
    prompt = load_prompts(args.prompt_index + 1)[args.prompt_index].text
    lineup, decision = _lineup(args, config)
    shown = next((i for i, (label, _) in enumerate(lineup) if label.endswith("(auto)")), len(lineup) - 1)
    rows = []
    for i, (label, cfg) in enumerate(lineup):
        header = f"--- HumanEval/{args.prompt_index}, completed by `{label}` ---"
        startup = decision.startup if decision is not None and cfg == decision.config else None
        row = _run_one(cfg, prompt, args.max_tokens, i == shown, header, startup)
        rows.append(dataclasses.replace(row, label=label))
    print("\n--- greedy, same prompt, one run each ---")
    base = rows[0]
    print(f"{'mode':12} {'tok/s':>8} {'accept len':>11} {'tokens':>7} {'vs ' + base.label:>10}")
    for r in rows:
        print(f"{r.label:12} {r.tokens_per_s:8.2f} {r.acceptance_length:11.2f} {r.tokens:7d} "
              f"{r.tokens_per_s / max(base.tokens_per_s, 1e-9):9.2f}x")
    asy = next((r for r in rows if r.label.startswith("async")), None)
    if asy is not None and decision is not None and asy.tokens_per_s < max(r.tokens_per_s for r in rows):
        print(decision.async_needs())
    return 0
