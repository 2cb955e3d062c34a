"""Benchmark harness: mode names, the Runner interface every engine and peer offers, and the timed loop.

Runs are interleaved per prompt (every mode on prompt 1, then every mode on prompt 2, ...) so that
noise from other work on the machine falls on all modes alike; only modes of one group (`;` in
--modes) are interleaved, groups run one after another. Every mode sees the same prompt token ids
and the same seed for a given prompt.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tqdm import tqdm

from swiftspec.config import AUTO, MODES, WEIGHT_FORMATS
from swiftspec.errors import UserError
from swiftspec.sampling import SamplingParams
from swiftspec.trace import TraceFile

PEER_MODES = ("hf-ar", "hf-assisted", "llamacpp-ar", "llamacpp-spec", "ikllama-ar", "ikllama-spec")
AR_PEERS = ("llamacpp-ar", "ikllama-ar")  # the "vs best peer" column takes the faster of these


@dataclass(frozen=True, slots=True)
class ModeSpec:
    """One benchmarked mode: ours ("ar", "tree@int4", ...) or a peer ("hf-ar", "llamacpp-spec", ...)."""

    name: str  # as given on the command line; the report's key
    kind: str  # "ours" | "hf" | "llamacpp" | "ikllama"
    variant: str  # ours: engine mode ("auto" until the bench resolves it); hf: "ar" | "assisted"; llamacpp, ikllama: "ar" | "spec"
    weights: str | None = None  # ours: --weights override for this mode
    group: int = 0  # modes of one group are loaded together and interleaved; groups run one after another
    draft_weights: str | None = None  # ours: the draft format auto chose for this mode

    @property
    def speculative(self) -> bool:
        return self.variant in ("chain", "tree", "async", "assisted", "spec")


def parse_modes(text: str) -> list[ModeSpec]:
    """Parse --modes: comma lists of modes, `;` between groups that are loaded one after another.

    A suffix `@bf16|@int8|@int4|@gguf` sets the weight format of one of our modes (`tree@int4`); `auto`
    runs the engine that `--mode auto` chooses.
    """
    specs: list[ModeSpec] = []
    groups = [g for g in text.split(";") if g.strip()]
    for group, part in enumerate(groups):
        for name in (n.strip() for n in part.split(",")):
            if not name:
                continue
            if any(s.name == name for s in specs):
                raise UserError(f"mode {name!r} is listed twice")
            specs.append(_parse_one(name, group))
    if not specs:
        raise UserError("--modes is empty")
    return specs


def check_groups(specs: list[ModeSpec]) -> None:
    """One async engine per group: a process joins one torch.distributed world at a time."""
    for group in sorted({s.group for s in specs}):
        names = [s.name for s in specs if s.group == group and s.kind == "ours" and s.variant == "async"]
        if len(names) > 1:
            raise UserError(f"modes {', '.join(names)} are async engines in one group; put each in its own "
                            "`;`-separated group")


def _parse_one(name: str, group: int) -> ModeSpec:
    base, _, weights = name.partition("@")
    if base in MODES + (AUTO,):
        if weights and weights not in WEIGHT_FORMATS:
            raise UserError(f"mode {name!r}: weight format must be one of {', '.join(WEIGHT_FORMATS)}")
        return ModeSpec(name, "ours", base, weights or None, group)
    if base in PEER_MODES and not weights:
        kind, _, variant = base.partition("-")
        return ModeSpec(name, kind, variant, None, group)
    raise UserError(f"unknown bench mode {name!r} (choose from {', '.join(MODES + (AUTO,) + PEER_MODES)})")


@dataclass(slots=True)
class RunResult:
    """One prompt through one mode. Times are wall-clock seconds from the call to the last token."""

    tokens: list[int]  # new tokens, EOS excluded
    ttft_s: float  # until the first new tokens arrived
    total_s: float
    first_tokens: int = 1  # tokens that arrived together at ttft_s (several when the prefill also verifies)
    rounds: int = 0  # target forwards counted for the acceptance length (see `acceptance_length`)
    round_tokens: int = 0  # tokens those forwards emitted
    draft_s: float | None = None  # None where the mode cannot split its time
    verify_s: float | None = None
    draft_forwards: int | None = None  # draft model forwards, where the mode can count them
    busy: dict[str, float] | None = None  # async: fraction of the wall time each group was busy

    @property
    def acceptance_length(self) -> float:
        """Tokens emitted per target forward (1.0 for autoregressive modes)."""
        return self.round_tokens / self.rounds if self.rounds else 1.0

    @property
    def decode_tokens(self) -> int:
        """Tokens that arrived after the first ones."""
        return max(len(self.tokens) - self.first_tokens, 0)

    @property
    def tokens_per_s(self) -> float:
        """Decode speed: tokens after the first arrival over the time after it (prefill excluded)."""
        decode_s = self.total_s - self.ttft_s
        return self.decode_tokens / decode_s if self.decode_tokens and decode_s > 0 else 0.0

    @property
    def e2e_tokens_per_s(self) -> float:
        """End-to-end speed: all new tokens over the whole request, prefill included."""
        return len(self.tokens) / self.total_s if self.total_s > 0 else 0.0

    @property
    def tpot_s(self) -> float:
        """Time per output token after the first arrival (the inverse of the decode speed)."""
        return (self.total_s - self.ttft_s) / self.decode_tokens if self.decode_tokens else 0.0


class Runner(Protocol):
    """Anything the harness can time: one of our engines or a peer implementation."""

    def generate(self, prompt: list[int], max_new_tokens: int, seed: int) -> RunResult: ...

    def close(self) -> None: ...


class EngineRunner:
    """Times one of our engines through the Engine protocol (its stats give rounds and the time split)."""

    def __init__(self, engine, temperature: float, top_p: float = 1.0) -> None:  # engine: swiftspec.engines.Engine
        self.engine = engine
        self.temperature = temperature
        self.top_p = top_p

    def generate(self, prompt: list[int], max_new_tokens: int, seed: int) -> RunResult:
        params = SamplingParams(temperature=self.temperature, top_p=self.top_p, seed=seed)
        tokens: list[int] = []
        start = time.perf_counter()
        ttft, first = 0.0, 0
        generation = self.engine.generate(prompt, params, max_new_tokens)
        for chunk in generation:
            if chunk and not tokens:
                ttft, first = time.perf_counter() - start, len(chunk)
            tokens.extend(chunk)
        total = time.perf_counter() - start
        stats = generation.stats
        return RunResult(
            tokens=tokens,
            ttft_s=ttft,
            total_s=total,
            first_tokens=first,
            rounds=len(stats.accept_lengths),
            round_tokens=sum(stats.accept_lengths),
            draft_s=stats.draft_s,
            verify_s=stats.verify_s,
            busy=_busy_fractions(stats.spans),
        )

    def close(self) -> None:
        self.engine.close()


def _busy_fractions(summary: dict) -> dict[str, float] | None:
    """Each group's busy fraction from an async request's span summary (None for other modes)."""
    if not summary or "target" not in summary:
        return None
    return {side: summary[side]["busy_fraction"] for side in ("target", "draft")}


def run_interleaved(
    runners: dict[str, Runner],
    prompts: list[list[int]],
    max_new_tokens: int,
    seed: int,
    warmup: list[list[int]],
    label: str = "bench",
    trace_dir: Path | None = None,
) -> dict[str, list[RunResult]]:
    """Warm every runner up, then time prompt by prompt, every mode in turn; results per mode name.

    warmup: the prompts of the warm-up runs (one run of each per mode, at most 32 new tokens, not
    recorded), none of them a timed prompt: a timed prompt warmed up first would find its own
    prefix in the prompt caches (ours and llama-server's) and, in our speculative modes, the
    warm-up's answer in the earlier text that prompt lookup reads.  With trace_dir, each timed run
    of our engines writes <trace_dir>/<mode>-prompt<i>.json.
    """
    results: dict[str, list[RunResult]] = {name: [] for name in runners}
    with tqdm(total=(len(warmup) + len(prompts)) * len(runners), desc=label, unit="run", file=sys.stderr) as bar:
        for w, ids in enumerate(warmup):
            for name, runner in runners.items():
                bar.set_postfix_str(f"{name} warm-up {w + 1}")
                runner.generate(ids, min(max_new_tokens, 32), seed)
                bar.update(1)
        for i, prompt in enumerate(prompts):
            for name, runner in runners.items():
                bar.set_postfix_str(f"{name} prompt {i + 1}")
                traced = trace_dir is not None and isinstance(runner, EngineRunner)
                if traced:
                    runner.engine.trace = TraceFile(trace_dir / f"{name}-prompt{i}.json", name)
                results[name].append(runner.generate(prompt, max_new_tokens, seed + i))
                if traced:
                    runner.engine.trace = None
                bar.update(1)
    return results
