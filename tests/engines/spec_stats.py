"""Helpers for the losslessness tests: a sharp tiny model pair, the exact distribution of the first
tokens under the target, and a chi-square goodness-of-fit threshold."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from swiftspec.runner.model_runner import ModelRunner
from swiftspec.sampling import SamplingParams, process_logits
from swiftspec.testing.tiny import make_perturbed_draft, make_tiny_checkpoint

END = -1  # marks "the request ended at EOS" in a sample of the first tokens


def sharp_pair(root: Path, gain: float = 4.0) -> tuple[Path, Path]:
    """A tiny target whose next-token distributions have a few likely tokens, and a perturbed draft."""
    target = make_tiny_checkpoint(root / "sharp", arch="qwen2", vocab_size=300, tie_word_embeddings=False)
    weights = load_file(target / "model.safetensors")
    weights["lm_head.weight"] = weights["lm_head.weight"] * gain
    save_file(weights, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target, make_perturbed_draft(target, root / "sharp-draft", noise=0.2)


def exact_distribution(model: torch.nn.Module, prompt: list[int], params: SamplingParams,
                       eos: frozenset[int], n: int, floor: float = 1e-5) -> dict[tuple, float]:
    """P(first n tokens) under the processed target distribution, by enumeration (mass below
    `floor` is dropped). A sequence that hits EOS is padded with END."""
    runner = ModelRunner(model, 64, max_nodes=1)
    out: dict[tuple, float] = {}

    def walk(seq: tuple, p: float) -> None:
        if len(seq) == n or (seq and seq[-1] == END):
            out[seq + (END,) * (n - len(seq))] = p
            return
        runner.kv.reset()
        probs = process_logits(runner.extend(prompt + [t for t in seq]), params)[0]  # [V]
        for tok in (probs > floor / max(p, 1e-12)).nonzero().flatten().tolist():
            walk(seq + (END if tok in eos else tok,), p * float(probs[tok]))

    walk((), 1.0)
    return out


Z_1E6 = 4.753  # the 1e-6 upper tail of the standard normal


def chi_square_threshold(dof: int, z: float = Z_1E6) -> float:
    """Upper quantile of chi-square(dof) by Wilson-Hilferty; z = 4.753 is the 1e-6 normal tail.
    (goodness_of_fit's cells expecting 5-10 samples fatten the statistic's tail: with that
    threshold a correct sampler fails it a few times in a million runs, spec_power.py.)"""
    a = 2.0 / (9.0 * dof)
    return dof * (1.0 - a + z * math.sqrt(a)) ** 3


def goodness_of_fit(samples: list[tuple], exact: dict[tuple, float]) -> tuple[float, float]:
    """Chi-square statistic and threshold; cells expecting < 5 samples are pooled into one.  The
    criterion's own false-failure rate, and its power, at n samples: tests/engines/spec_power.py."""
    n = len(samples)
    counts = Counter(samples)
    big = {cell for cell, p in exact.items() if p * n >= 5}
    stat, pooled_obs, pooled_exp = 0.0, 0, 0.0
    for cell in set(exact) | set(counts):
        obs, exp = counts.get(cell, 0), exact.get(cell, 0.0) * n
        if cell in big:
            stat += (obs - exp) ** 2 / exp
        else:
            pooled_obs, pooled_exp = pooled_obs + obs, pooled_exp + exp
    stat += (pooled_obs - pooled_exp) ** 2 / max(pooled_exp, 1.0)
    return stat, chi_square_threshold(len(big))


def first_tokens(engine, prompt: list[int], params: SamplingParams, n: int) -> tuple:
    toks = [t for chunk in engine.generate(prompt, params, n) for t in chunk][:n]
    return tuple(toks) + (END,) * (n - len(toks))
