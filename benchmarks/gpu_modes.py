"""Decode speed of the engines on a random pair, for benchmarks/gpu_check.py: steps 3 (ar, chain, tree,
async on the device) and 5 (tree against async on disjoint CPU core sets, int4).

MEASURED: tok/s, rounds and the time per round of each engine on the random pair (greedy, fixed
round shapes: gpu_pair.fixed_tree).  A random pair's acceptance is chance, so PREDICTED tok/s =
the measured rounds per second x the acceptance length that the same mode reached with the real
pair on the CPU (HumanEval, greedy), read from a bench report of this repository.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from gpu_async import DraftJob, async_engine, engine_config
from gpu_pair import PairShapes, Placement, RandomModel, fixed_tree, random_model, random_target, serial_engine

from swiftspec.sampling import SamplingParams
from swiftspec.trace import TraceFile, summarize


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """What each engine decodes: prompts of random ids, greedy, a fixed number of new tokens."""

    prompts: int
    prompt_len: int
    tokens: int
    seed: int = 0

    def prompt_ids(self, vocab_size: int) -> list[list[int]]:
        gen = torch.Generator().manual_seed(self.seed)
        return torch.randint(0, vocab_size, (self.prompts, self.prompt_len), generator=gen).tolist()


@dataclass(frozen=True, slots=True, kw_only=True)
class ModeSetup:
    """Everything an engine of steps 3 and 5 is built from."""

    shapes: PairShapes
    place: Placement
    depth: int  # d of the fixed rounds
    max_seq_len: int
    draft_vocab: int


def acceptance_table(report: Path) -> dict[str, float]:
    """{mode: acceptance length} of a `swiftspec bench` report.json (mode names as it writes them:
    "tree", "tree@int4", ...)."""
    modes = json.loads(report.read_text())["modes"]
    return {name: float(m["acceptance_length"]) for name, m in modes.items() if m.get("acceptance_length")}


def decode(engine, work: Workload, vocab_size: int, first_round: bool) -> dict[str, float]:
    """One warm-up request, then the workload; mean tok/s, acceptance, ms per round and rounds/s.
    first_round: the engine counts the prefill's token as a round (ar does)."""
    prompts = work.prompt_ids(vocab_size)
    for _ in engine.generate(prompts[0][:16], SamplingParams(), 8):
        pass
    rows, rounds = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        engine.trace = TraceFile(Path(tmp) / "trace.json", "gpu-check")
        for prompt in prompts:
            gen = engine.generate(prompt, SamplingParams(), work.tokens)
            for _ in gen:
                pass
            s = gen.stats
            decode_s = s.total_s - s.ttft_s
            forwards = s.rounds - (1 if first_round else 0)
            rounds += forwards
            rows.append((s.tokens_per_s, s.acceptance_length, forwards / decode_s if decode_s > 0 else 0.0))
        requests, engine.trace = engine.trace.requests, None
    tok_s, acc, rate = (statistics.mean(col) for col in zip(*rows))
    return {"measured tok/s": tok_s, "measured acceptance": acc, "measured ms/round": 1e3 / rate if rate else 0.0,
            "rounds/s": rate, "span ms/round": span_ms(requests, rounds)}


def span_ms(requests: list, rounds: int) -> dict[str, float]:
    """Where a round's time goes: ms per decode round of each group's spans (trace.summarize's
    seconds per span, prefill left out), summed over the traced requests."""
    totals: dict[str, float] = {}
    for req in requests:
        none = torch.empty(0, 3, dtype=torch.float64)
        summary = summarize(req.tracks.get("target", none), req.tracks.get("draft", none))
        for group in req.tracks:
            for span, sec in summary[group]["spans_s"].items():
                if span != "prefill":
                    totals[f"{group} {span}"] = totals.get(f"{group} {span}", 0.0) + sec
    return {key: round(1e3 * sec / max(rounds, 1), 3) for key, sec in sorted(totals.items())}


def with_prediction(row: dict[str, float], mode: str, weights: str, table: dict[str, float]) -> dict:
    """row plus the predicted tok/s: its rounds/s x the real pair's acceptance for this mode."""
    key = mode if weights == "bf16" else f"{mode}@{weights}"
    acc = 1.0 if mode == "ar" else table.get(key, table.get(mode))
    if acc is None:
        return row | {"predicted tok/s": None, "cpu acceptance (real pair)": None}
    return row | {"cpu acceptance (real pair)": acc, "predicted tok/s": row["rounds/s"] * acc}


def release() -> None:
    """Free what a finished engine held before the next one is built."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_mode(mode: str, target: RandomModel, setup: ModeSetup, work: Workload,
             cores: tuple[list[int], list[int]] | None = None) -> dict[str, float]:
    """Decode `work` with one engine over `target` and a fresh random draft; cores: the (target,
    draft) core sets of an async run on the CPU."""
    tree = fixed_tree(setup.depth)
    vocab = setup.shapes.target.vocab_size
    if mode != "async":
        draft = None if mode == "ar" else random_model(setup.shapes.draft, setup.place)
        engine = serial_engine(mode, target, draft, tree, setup.max_seq_len, setup.place, setup.draft_vocab)
        try:
            return decode(engine, work, vocab, first_round=mode == "ar")
        finally:
            engine.close()
            del engine, draft
            release()
    job = DraftJob(config=engine_config(tree, setup.place, setup.max_seq_len), shapes=setup.shapes,
                   place=setup.place, draft_vocab=setup.draft_vocab,
                   cores=None if cores is None else tuple(cores[1]), port=0)
    try:
        with async_engine(target, job, None if cores is None else cores[0]) as engine:
            return decode(engine, work, vocab, first_round=False)
    finally:
        release()


def modes_step(setup: ModeSetup, work: Workload, table: dict[str, float], guard: Callable) -> dict:
    """Step 3: ar, chain, tree and async on the device (on the CPU, async splits the cores in two)."""
    target = random_target(setup.shapes.target, setup.place)
    cores = None
    if setup.place.device == "cpu":
        mine = sorted(os.sched_getaffinity(0))
        half = max(1, len(mine) // 2)
        cores = (mine[:half], mine[half:] or mine[:1])
    out = {}
    for mode in ("ar", "chain", "tree", "async"):
        out[mode] = guard(mode, lambda m=mode: with_prediction(
            run_mode(m, target, setup, work, cores if m == "async" else None), m, setup.place.weights, table))
    return {"modes": out}


def cpu_split_step(setup: ModeSetup, work: Workload, splits: list[tuple[int, int]], table: dict[str, float],
                   guard: Callable) -> dict:
    """Step 5: the serial tree on every core, then async with the target and draft groups on
    disjoint core sets (target cores first), int4 on the CPU."""
    mine = sorted(os.sched_getaffinity(0))
    target = random_target(setup.shapes.target, setup.place)
    out = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(len(mine))
    try:
        out[f"tree ({len(mine)} cores)"] = guard("tree", lambda: with_prediction(
            run_mode("tree", target, setup, work), "tree", setup.place.weights, table))
    finally:
        torch.set_num_threads(threads)
    for t, d in splits:
        name = f"async {t}+{d}"
        if t + d > len(mine):
            out[name] = {"skipped": f"needs {t + d} cores, this machine has {len(mine)}"}
            print(f"  {name}: skipped (needs {t + d} cores, this machine has {len(mine)})", flush=True)
            continue
        out[name] = guard(name, lambda t=t, d=d: with_prediction(
            run_mode("async", target, setup, work, (mine[:t], mine[t:t + d])), "async", setup.place.weights, table))
    return {"modes": out}
