"""Per-mode metrics from the timed runs: distributions, speedups, roofline and greedy equivalence.

Definitions (also written into the report):
- tokens_per_s: decode speed per prompt, (new tokens - tokens of the first arrival) / (total time -
  time to first token). Prefill is excluded so prompt length does not dominate; the first arrival
  is one token except where the prefill forward also verifies drafts (hf-assisted). A draft
  model's own prompt prefill falls in the decode window where it runs after the first token (our
  chain/tree, llamacpp-spec through llama-cpp-python). e2e_tokens_per_s keeps everything in.
- ttft_s: time from the call to the first new token (prefill + first sample).
- tpot_s: time per output token after the first arrival, the inverse of the decode speed.
- acceptance_length: tokens emitted per target forward, pooled over all rounds of all prompts.
- speedup_vs_*: ratio of mean decode speeds.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np

from swiftspec.bench.divergence import Divergence
from swiftspec.bench.harness import AR_PEERS, ModeSpec, RunResult
from swiftspec.bench.roofline import WeightBytes, bound

DEFINITIONS = {
    "tokens_per_s": "decode speed per prompt: (new_tokens - first_tokens) / (total_s - ttft_s), first_tokens = "
                    "tokens that arrived at ttft_s (1 unless the prefill also verifies); mean/median/p10/p90 "
                    "over prompts",
    "e2e_tokens_per_s": "new_tokens / total_s per prompt (prefill included)",
    "ttft_s": "mean time from the call to the first new token",
    "tpot_s": "mean time per output token after the first arrival",
    "acceptance_length": "tokens emitted per target forward, pooled over all rounds (1.0 for autoregressive)",
    "speedup": "mean tokens_per_s of the mode / mean tokens_per_s of the baseline",
    "vs best peer": "speedup against the faster of llamacpp-ar and ikllama-ar in this run",
    "matches_ar": "tokens identical to our ar mode of the same weight format (else the first ar mode) on every prompt; sampled: our modes only, same seed (null: not compared, or no ar mode)",
    "divergences": "first divergence from ar on every prompt where the tokens differ",
    "tie": "top-2 logit gap of our target at the divergence <= eps(dtype) * max(|l1|, |l2|)",
    "roofline": "bound = bandwidth / ((target_bytes + draft_bytes * draft_forwards_per_round) / acceptance_length); "
                "bandwidth = the faster of two streaming-read tests (before and after the runs)",
}


@dataclass(frozen=True, slots=True)
class ModeInputs:
    """Everything known about one mode after the runs."""

    spec: ModeSpec
    results: list[RunResult]
    backend: str
    weights: WeightBytes
    draft_forwards_estimate: float  # per round; used when the runs could not count them
    matches_ar: bool | None
    divergences: list[Divergence]  # per divergent prompt, in prompt order


def distribution(values: list[float]) -> dict[str, float]:
    """mean, median, p10, p90 (linear interpolation between order statistics)."""
    if not values:
        return {"mean": 0.0, "median": 0.0, "p10": 0.0, "p90": 0.0}
    arr = np.asarray(values, dtype=np.float64)
    return {
        "mean": float(arr.mean()),
        "median": float(np.median(arr)),
        "p10": float(np.percentile(arr, 10)),
        "p90": float(np.percentile(arr, 90)),
    }


def _mean_or_none(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present and len(present) == len(values) else None


def acceptance_length(results: list[RunResult]) -> float:
    rounds = sum(r.rounds for r in results)
    return sum(r.round_tokens for r in results) / rounds if rounds else 1.0


def draft_forwards_per_round(m: ModeInputs) -> float:
    """Counted draft forwards per round where the mode reports them, else the estimate."""
    counted = [r.draft_forwards for r in m.results]
    rounds = sum(r.rounds for r in m.results)
    if m.spec.speculative and rounds and all(c is not None for c in counted):
        return sum(counted) / rounds
    return m.draft_forwards_estimate if m.spec.speculative else 0.0


def mode_entry(m: ModeInputs, prompt_lengths: list[int], bandwidth: float) -> dict:
    """The report's `modes[name]` object (speedups are filled in by `add_speedups`)."""
    rs = m.results
    speed = distribution([r.tokens_per_s for r in rs])
    acc = acceptance_length(rs)
    roof = bound(m.weights, bandwidth, acc, draft_forwards_per_round(m))
    return {
        "kind": m.spec.kind,
        "backend": m.backend,
        "tokens_per_s": speed,
        "e2e_tokens_per_s": distribution([r.e2e_tokens_per_s for r in rs]),
        "ttft_s": statistics.fmean(r.ttft_s for r in rs),
        "ttft_s_dist": distribution([r.ttft_s for r in rs]),
        "tpot_s": statistics.fmean(r.tpot_s for r in rs),
        "acceptance_length": acc,
        "rounds": statistics.fmean(r.rounds for r in rs),
        "new_tokens": statistics.fmean(len(r.tokens) for r in rs),
        "draft_s": _mean_or_none([r.draft_s for r in rs]),
        "verify_s": _mean_or_none([r.verify_s for r in rs]),
        "busy_fraction": _busy_mean(rs),
        "matches_ar": m.matches_ar,
        "first_divergence": m.divergences[0].to_json() if m.divergences else None,
        "divergences": [d.to_json() for d in m.divergences],
        "roofline": {
            "target_weight_bytes": m.weights.target,
            "draft_weight_bytes": m.weights.draft,
            "draft_forwards_per_round": roof.draft_forwards_per_round,
            "bytes_per_token": roof.bytes_per_token,
            "bound_tokens_per_s": roof.tokens_per_s,
            "fraction_of_bound": speed["mean"] / roof.tokens_per_s if roof.tokens_per_s else None,
        },
        "per_prompt": [_prompt_entry(i, n, r) for i, (n, r) in enumerate(zip(prompt_lengths, rs))],
    }


def _prompt_entry(index: int, prompt_tokens: int, r: RunResult) -> dict:
    return {
        "prompt": index,
        "prompt_tokens": prompt_tokens,
        "new_tokens": len(r.tokens),
        "tokens_per_s": r.tokens_per_s,
        "e2e_tokens_per_s": r.e2e_tokens_per_s,
        "ttft_s": r.ttft_s,
        "first_tokens": r.first_tokens,
        "tpot_s": r.tpot_s,
        "total_s": r.total_s,
        "acceptance_length": r.acceptance_length,
        "rounds": r.rounds,
        "draft_s": r.draft_s,
        "verify_s": r.verify_s,
        "draft_forwards": r.draft_forwards,
        "tokens": r.tokens,
    }


def add_speedups(modes: dict[str, dict]) -> None:
    """speedup_vs_ar, speedup_vs_hf_ar and speedup_vs_peer (the faster of the AR_PEERS that ran) on every
    mode (None when the baseline did not run)."""
    for key, base in (("speedup_vs_ar", "ar"), ("speedup_vs_hf_ar", "hf-ar"), ("speedup_vs_peer", best_peer(modes))):
        ref = _mean_speed(modes, base)
        for entry in modes.values():
            entry[key] = entry["tokens_per_s"]["mean"] / ref if ref else None


def best_peer(modes: dict[str, dict]) -> str:
    """The faster of the AR_PEERS in this run (one that did not run has speed 0)."""
    return max(AR_PEERS, key=lambda name: _mean_speed(modes, name))


def _mean_speed(modes: dict[str, dict], name: str) -> float:
    return modes.get(name, {}).get("tokens_per_s", {}).get("mean", 0.0)


def _busy_mean(rs: list) -> dict[str, float] | None:
    """Mean busy fraction of the target and draft groups over the prompts (async modes only)."""
    busy = [r.busy for r in rs if r.busy]
    if not busy:
        return None
    return {side: statistics.fmean(b[side] for b in busy) for side in ("target", "draft")}
