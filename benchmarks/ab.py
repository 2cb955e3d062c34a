"""A/B of engine settings in one process: every engine decodes each prompt in turn, so machine
noise hits them alike (the bench CLI loads one mode at a time within a group).

Run: .venv/bin/python benchmarks/ab.py SPEC [SPEC ...] [--prompts 6] [--max-tokens 128]
  SPEC = mode:draft_weights:depth:adaptive[:target_weights[:verify_size[:adaptive_verify]]],
  e.g. chain:int8:4:0 tree:int8:7:1 tree:int4:0:1:int4:8:0
Prints decode tok/s (prefill excluded), acceptance length and time per round for each SPEC.
"""

from __future__ import annotations

import argparse

import torch

from swiftspec.bench.prompts import load_prompts
from swiftspec.config import EngineConfig, LoadConfig, TreeConfig
from swiftspec.engines import build_engine
from swiftspec.sampling import SamplingParams


def engine(spec: str):
    fields = spec.split(":")
    mode, draft_weights, depth, adaptive = fields[:4]
    target_weights, verify_size, verify = (fields[4:] + ["bf16", "8", "1"][len(fields[4:]):])[:3]
    tree = TreeConfig(depth=int(depth), adaptive=bool(int(adaptive)), verify_size=int(verify_size),
                      adaptive_verify=bool(int(verify)))
    return build_engine(EngineConfig(
        mode=mode, tree=tree,
        target_load=LoadConfig(weights=target_weights), draft_load=LoadConfig(weights=draft_weights)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("specs", nargs="+")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    torch.set_num_threads(2)
    prompts = [p.text for p in load_prompts(args.prompts)]
    engines = {spec: engine(spec) for spec in args.specs}
    totals = {spec: [0, 0.0, 0, 0] for spec in args.specs}  # tokens, seconds, rounds, emitted
    for eng in engines.values():  # warm-up
        for _ in eng.generate(eng.tokenizer.encode(prompts[0]), SamplingParams(), 16):
            pass
    for text in prompts:
        for spec, eng in engines.items():
            generation = eng.generate(eng.tokenizer.encode(text), SamplingParams(), args.max_tokens)
            for _ in generation:
                pass
            st, t = generation.stats, totals[spec]
            t[0] += st.new_tokens - 1
            t[1] += st.total_s - st.ttft_s
            t[2] += st.rounds
            t[3] += sum(st.accept_lengths)
    for spec, (tokens, seconds, rounds, emitted) in totals.items():
        print(f"{spec}: {tokens / seconds:.2f} tok/s, acceptance {emitted / max(1, rounds):.2f}, "
              f"{1e3 * seconds / max(1, rounds):.1f} ms/round")


if __name__ == "__main__":
    main()
