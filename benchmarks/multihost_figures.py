"""Figures for docs/bench/multihost.md on tiny random models: the cost model's forecast (engines/auto/placements.py,
from a fresh auto profile) beside measured tok/s of serial tree and async on this machine, and of async
across two network namespaces (tests/support/netns_hosts.py; run as root).

usage: PYTHONPATH=$PWD:$PWD/tests/support python benchmarks/multihost_figures.py TARGET_DIR DRAFT_DIR [--netns]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from swiftspec.config import EngineConfig, LoadConfig, TreeConfig
from swiftspec.engines import build_engine
from swiftspec.engines.auto.placements import Setting, forecast, report
from swiftspec.engines.auto.profile import profile_pair
from swiftspec.sampling import SamplingParams

PROMPTS = [[5, 17, 92, 311], [44, 45, 46, 47, 48, 49], [101, 7, 250, 9, 13]]
N = 64
LOAD = LoadConfig(dtype="float32", max_seq_len=512)


def measure(engine) -> float:
    """Decode tok/s over the prompts (after one warm-up request)."""
    list(engine.generate(PROMPTS[0], SamplingParams(), 16))
    tokens, seconds = 0, 0.0
    for p in PROMPTS:
        generation = engine.generate(p, SamplingParams(), N)
        list(generation)
        tokens += generation.stats.new_tokens - 1
        seconds += generation.stats.total_s - generation.stats.ttft_s
    return tokens / seconds


def netns(target: str, draft: str) -> float:
    from netns_hosts import Hosts, Target, start_draft, stop  # noqa: PLC0415 (tests/support, only for --netns)

    hosts, log = Hosts(), Path("/tmp")
    try:
        t = Target(hosts, Path(target), Path(draft), log / "mh-target.log")
        d = start_draft(hosts, Path(draft), log / "mh-draft.log")
        try:
            assert t.ask(cmd="rejoin", wait_s=60)["joined"]
            t.ask(cmd="gen", prompts=PROMPTS[:1], n=16)
            got = t.ask(cmd="gen", prompts=PROMPTS, n=N)
            return sum(len(o) for o in got["outs"]) / got["seconds"]  # includes prefills
        finally:
            t.close()
            stop(d)
    finally:
        hosts.close()


def main() -> None:
    target, draft = sys.argv[1], sys.argv[2]
    tree = TreeConfig(depth=2)
    base = EngineConfig(target=target, draft=draft, target_load=LOAD, draft_load=LOAD, tree=tree)
    start = time.perf_counter()
    profile = profile_pair(base, (LOAD.weights,))
    print(f"profiled in {time.perf_counter() - start:.1f} s")
    one = forecast(profile, tree, Setting())
    rows = {"predicted": {"tree": one.tree.tokens_per_s, "async (one host)": one.async_.tokens_per_s},
            "lines": report(profile, tree, rtt_s=0.0001)}
    measured = {}
    for mode in ("ar", "tree", "async"):
        import dataclasses

        engine = build_engine(dataclasses.replace(base, mode=mode))
        try:
            measured[mode] = measure(engine)
        finally:
            engine.close()
    if "--netns" in sys.argv:
        measured["async (two namespaces)"] = netns(target, draft)
    rows["measured"] = measured
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
