"""Acceptance length of the serial tree per draft-head choice and with/without prompt lookup, on chat
and HumanEval prompts (greedy; acceptance only, no timing).  The models load once and every variant
decodes each prompt in turn.

Run: SWIFTSPEC_CACHE=... .venv/bin/python benchmarks/acceptance.py [--chat 8] [--code 5] [--max-tokens 128]
     [--variants full@0,code@0,mixed@0,prompt@0,full@1,mixed@1] [--weights int4] [--depth 0] [--adaptive 1]
A variant is HEAD@LOOKUP (LOOKUP: 1 = prompt-lookup candidates in the tree, 0 = none).
Heads: full (whole LM head), code / mixed (the 32768 most frequent ids of that table, code:65536 for
another size; the pruned head gives way to the full head where the text leaves it), prompt (mixed
plus every id of the prompt, rebuilt per request).  The mixed table is not shipped: build it first
with `tools/make_vocab_table.py --corpus mixed`.  Prints acceptance per variant and dataset, the
share of output tokens each head contains, and the prompt-lookup rates learned.
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from swiftspec import kernels
from swiftspec.bench.prompts import load_prompts
from swiftspec.config import LoadConfig, TreeConfig
from swiftspec.engines.serial import SerialEngine
from swiftspec.runner.load import load_target
from swiftspec.sampling import SamplingParams
from swiftspec.speculate import TreeDrafter
from swiftspec.speculate.vocab import pruned_vocab
from swiftspec.weights.loader import load_model

SIZE = 32768


def prompt_sets(args) -> dict[str, list[str]]:
    return {"chat": [p.text for p in load_prompts(args.chat, "chat")] if args.chat else [],
            "code": [p.text for p in load_prompts(args.code)] if args.code else []}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chat", type=int, default=8)
    ap.add_argument("--code", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--variants", default="full@0,code@0,mixed@0,prompt@0,full@1,mixed@1")
    ap.add_argument("--weights", default="int4")
    ap.add_argument("--depth", type=int, default=0)
    ap.add_argument("--adaptive", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load = LoadConfig(weights=args.weights)
    target = load_target("qwen2.5-coder-1.5b-instruct", load)
    draft = load_model("qwen2.5-coder-0.5b-instruct", load)
    full_rows = draft.model.lm_head.weight.data  # [V, H] bf16, kept for the pruned heads
    kernels.prepare_model_(draft.model, args.weights)
    tok = target.tokenizer
    texts = prompt_sets(args)
    prompts = {name: [tok.chat([{"role": "user", "content": t}]) if name == "chat" else tok.encode(t) for t in ts]
               for name, ts in texts.items()}
    variants = [(v.partition("@")[0], int(v.partition("@")[2] or 1)) for v in args.variants.split(",")]
    heads = [h for h, _ in variants]
    pruned = set(heads) - {"full", "prompt"} | ({"mixed"} if "prompt" in heads else set())
    vocabs = {h: pruned_vocab(tok, int(h.partition(":")[2] or SIZE), full_rows.shape[0], h.partition(":")[0])
              for h in pruned}
    engines = {}
    for head, lookup in variants:
        cfg = TreeConfig(lookup=bool(lookup), depth=args.depth, adaptive=bool(args.adaptive))
        vocab = vocabs.get("mixed" if head == "prompt" else head)
        rows = None if vocab is None else kernels.prepare_weight(full_rows[vocab].contiguous(), args.weights)
        drafter = TreeDrafter(draft.model, cfg, load.max_seq_len, vocab, rows)
        engines[(head, lookup)] = SerialEngine(target, drafter, cfg, load.max_seq_len)
    results = {key: {name: [0, 0] for name in prompts} for key in engines}
    outputs = {name: [] for name in prompts}
    for name, ids_list in prompts.items():
        for i, ids in enumerate(ids_list):
            for (head, lookup), eng in engines.items():
                if head == "prompt":
                    per_request(eng.drafter, vocabs["mixed"], ids, full_rows, args.weights)
                generation = eng.generate(ids, SamplingParams(), args.max_tokens)
                out = [t for chunk in generation for t in chunk]
                stats, r = generation.stats, results[(head, lookup)][name]
                r[0] += stats.rounds
                r[1] += sum(stats.accept_lengths)
                print(f"{name}[{i}] head={head} lookup={lookup}: {stats.acceptance_length:.2f} "
                      f"({sum(stats.accept_lengths)}/{stats.rounds})", flush=True)
            outputs[name].append((ids, out))
    report(results, outputs, vocabs, engines)


def per_request(drafter: TreeDrafter, base: torch.Tensor, prompt: list[int], full_rows: torch.Tensor,
                weights: str) -> None:
    """The mixed head plus every id of the prompt (a test of the per-request choice)."""
    vocab = torch.tensor(sorted(set(base.tolist()) | set(prompt)), dtype=torch.long)
    drafter.vocab_map = vocab
    drafter.runner.head = kernels.prepare_weight(full_rows[vocab].contiguous(), weights)


def report(results, outputs, vocabs, engines) -> None:
    print("\nacceptance (tokens per target forward):")
    for key, per in results.items():
        cells = ", ".join(f"{n} {e / max(1, r):.3f} ({r} rounds)" for n, (r, e) in per.items())
        print(f"  head={key[0]:6s} lookup={key[1]}: {cells}")
    print("\nshare of output tokens inside each pruned head:")
    for name, pairs in outputs.items():
        toks = [t for _, out in pairs for t in out]
        for head, vocab in vocabs.items():
            inside = set(vocab.tolist())
            print(f"  {name}: {head} {sum(t in inside for t in toks) / max(1, len(toks)):.4f}")
        if "mixed" in vocabs:
            prompt_plus = [sum(t in (set(vocabs["mixed"].tolist()) | set(ids)) for t in out) for ids, out in pairs]
            print(f"  {name}: prompt {sum(prompt_plus) / max(1, len(toks)):.4f}")
    for key, eng in engines.items():
        lookup = eng.drafter.lookup
        if lookup is not None:
            rates = {dataclasses.astuple(k): f"{lookup.rates.hits.get(k, 0):.0f}/{lookup.rates.trials[k]:.0f}"
                     for k in sorted(lookup.rates.trials, key=dataclasses.astuple)}
            print(f"\nlookup rates head={key[0]} (n, depth, alternative): hits/trials {rates}")


if __name__ == "__main__":
    main()
