"""A/B of two checkouts (commits) of SwiftSpec, interleaved prompt by prompt on one machine.

Each checkout runs in its own worker process (its own PYTHONPATH and kernel build cache); the
driver loads the same mode in both, then sends every prompt to A and B in turn, so host noise hits
both alike, and compares decode tok/s (prefill excluded) and the greedy tokens.

Run: .venv/bin/python benchmarks/ab_commits.py A_DIR B_DIR --modes ar,tree,ar@int4,tree@int4 \\
         [--prompts 5] [--max-tokens 128] [--threads 2] [--dataset chat --chat] [--temperature 0.7 --top-p 0.9]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

WORKER = r"""
import json, sys, torch
from swiftspec.config import EngineConfig, LoadConfig
from swiftspec.engines import build_engine
try:
    from swiftspec.engines.defaults import default_draft_weights
except ImportError:  # a checkout from before issue 37 (one resolve_defaults)
    try:
        from swiftspec.runner.load import default_draft_weights
    except ImportError:  # a checkout from before the exec layer
        from swiftspec.engines import default_draft_weights
from swiftspec.sampling import SamplingParams
torch.set_num_threads(int(sys.argv[1]))
engine = None
for line in sys.stdin:
    msg = json.loads(line)
    if msg["cmd"] == "load":
        if engine is not None:
            engine.close()
        mode, _, weights = msg["spec"].partition("@")
        target = LoadConfig(weights=weights or "bf16")
        draft = LoadConfig(weights=default_draft_weights(target))
        engine = build_engine(EngineConfig(mode=mode, target_load=target, draft_load=draft))
        reply = {"ok": True}
    else:
        generation = engine.generate(msg["ids"], SamplingParams(**msg.get("sampling", {})), msg["max_tokens"])
        tokens = [t for c in generation for t in c]
        # a checkout from before issue 20 leaves the stats on the engine
        s = generation.stats if hasattr(generation, "stats") else engine.stats
        reply = {"tokens": tokens, "tok_s": s.tokens_per_s, "ttft_s": s.ttft_s, "accept": s.acceptance_length}
    print(json.dumps(reply), flush=True)
"""


class Worker:
    """One checkout's engine process, driven over stdin/stdout JSON lines."""

    def __init__(self, checkout: Path, threads: int, cache: Path) -> None:
        env = dict(os.environ, PYTHONPATH=str(checkout), SWIFTSPEC_CACHE=str(cache))
        models = Path(os.environ.get("SWIFTSPEC_CACHE", Path.home() / ".cache/swiftspec")) / "models"
        cache.mkdir(parents=True, exist_ok=True)
        if not (cache / "models").exists():
            (cache / "models").symlink_to(models)
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, str(threads)], cwd=checkout, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, msg: dict) -> dict:
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"worker in {self.proc.args} died")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def sampling(args: argparse.Namespace, prompt: int) -> dict:
    """SamplingParams fields of prompt i's request: greedy, or seeded with seed + i."""
    if args.temperature == 0:
        return {}
    return {"temperature": args.temperature, "top_p": args.top_p, "seed": args.seed + prompt}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--modes", default="ar,tree,ar@int4,tree@int4")
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0, help="sampled: prompt i is run with seed + i")
    ap.add_argument("--dataset", default=None, help="as bench --dataset (default: HumanEval)")
    ap.add_argument("--chat", action="store_true", help="send each prompt through the chat template")
    args = ap.parse_args()
    from swiftspec.bench.prompts import load_prompts
    from swiftspec.weights.loader import load_tokenizer
    from swiftspec.weights.source import resolve_source

    tok = load_tokenizer(resolve_source("qwen2.5-coder-1.5b-instruct"))
    texts = [p.text for p in load_prompts(args.prompts, args.dataset)]
    prompts = [tok.chat([{"role": "user", "content": t}]) if args.chat else tok.encode(t) for t in texts]
    sides = {name: Worker(Path(d).resolve(), args.threads, Path(f"/tmp/ab-cache-{name}"))
             for name, d in (("A", args.a), ("B", args.b))}
    print(f"A = {args.a}\nB = {args.b}\n\n| mode | A tok/s | B tok/s | B / A | A accept | B accept | same tokens |")
    print("|---|---|---|---|---|---|---|")
    for spec in args.modes.split(","):
        for w in sides.values():
            w.ask({"cmd": "load", "spec": spec})
        runs = {name: [] for name in sides}
        for i, ids in enumerate(prompts):
            for name, w in sides.items():
                runs[name].append(w.ask({"cmd": "gen", "ids": ids, "max_tokens": args.max_tokens, "sampling": sampling(args, i)}))
        a, b = (statistics.fmean(r["tok_s"] for r in runs[n]) for n in ("A", "B"))
        acc = [statistics.fmean(r["accept"] for r in runs[n]) for n in ("A", "B")]
        same = all(x["tokens"] == y["tokens"] for x, y in zip(runs["A"], runs["B"]))
        print(f"| {spec} | {a:.1f} | {b:.1f} | {b / a:.3f} | {acc[0]:.2f} | {acc[1]:.2f} | {same} |", flush=True)
    for w in sides.values():
        w.close()


if __name__ == "__main__":
    main()
