"""How test_serial_lossless/test_async's sampling criterion (spec_stats.goodness_of_fit) behaves
at a given number of seeded requests: its false-failure rate and its power.  Not a test; run

    PYTHONPATH=$PWD:tests/engines python tests/engines/spec_power.py 2500 1250:5.0

for the numbers the tests' docstrings quote (N:Z: N requests, threshold at z = Z instead of
spec_stats.Z_1E6; a few minutes on one core).

- false failures: the statistic of n draws from the target's exact distribution of the first 3
  tokens after LOOPING_PROMPT (the sharp pair, temperature 0.8, top-p 0.95), simulated 2e6
  times; the share above the threshold.  The cells goodness_of_fit pools are one cell here (a
  multinomial's pooled counts are the multinomial of the pooled probabilities), so this is the
  criterion's own rate, not the chi-square approximation's 1e-6.
- power: the share of 4000 simulated runs that fail when a share x of the requests draws its
  tokens from the draft's exact distribution instead (TV 0.98 from the target's).
"""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from spec_stats import Z_1E6, chi_square_threshold, exact_distribution, sharp_pair
from swiftspec.config import LoadConfig
from swiftspec.sampling import SamplingParams
from swiftspec.weights.loader import load_model

LOOPING_PROMPT = [11, 42, 7, 11, 42, 7, 11, 42, 7, 11]
PARAMS = SamplingParams(temperature=0.8, top_p=0.95)
NULL_DRAWS = 2_000_000
SHARES = (0.06, 0.08, 0.10, 0.12, 0.14, 0.16, 0.20)


def distributions() -> tuple[np.ndarray, np.ndarray]:
    """The target's and the draft's exact distributions over the same cells."""
    torch.set_num_threads(1)
    fp32 = LoadConfig(dtype="float32", max_seq_len=256)
    target, draft = (load_model(str(d), fp32) for d in sharp_pair(Path(tempfile.mkdtemp())))
    eos = target.tokenizer.eos_token_ids
    p, q = (exact_distribution(m.model, LOOPING_PROMPT, PARAMS, eos, 3) for m in (target, draft))
    cells = sorted(set(p) | set(q))
    P, Q = np.array([p.get(c, 0.0) for c in cells]), np.array([q.get(c, 0.0) for c in cells])
    return P / P.sum(), Q / Q.sum()


class Criterion:
    """goodness_of_fit at n requests on count vectors: the cells expecting >= 5 samples, then one
    pooled cell (every other cell, and draws outside the exact distribution's support)."""

    def __init__(self, P: np.ndarray, n: int, z: float = Z_1E6) -> None:
        self.P, self.n, self.big = P, n, P * n >= 5
        self.expected = self.collapse(P) * n
        self.dof = int(self.big.sum())
        self.threshold = chi_square_threshold(self.dof, z)

    def collapse(self, r: np.ndarray) -> np.ndarray:
        return np.append(r[self.big], r[~self.big].sum())

    def stats(self, counts: np.ndarray) -> np.ndarray:
        e = self.expected
        s = ((counts[:, :-1] - e[:-1]) ** 2 / e[:-1]).sum(1)
        return s + (counts[:, -1] - e[-1]) ** 2 / max(e[-1], 1.0)

    def false_failures(self, rng: np.random.Generator, draws: int = NULL_DRAWS) -> float:
        chunk = 100_000
        fails = 0
        for _ in range(draws // chunk):
            counts = rng.multinomial(self.n, self.collapse(self.P), size=chunk)
            fails += int((self.stats(counts) >= self.threshold).sum())
        return fails / draws

    def power(self, rng: np.random.Generator, r: np.ndarray, runs: int = 4000) -> float:
        return float((self.stats(rng.multinomial(self.n, self.collapse(r), size=runs)) >= self.threshold).mean())


def main(runs: list[tuple[int, float]]) -> None:
    P, Q = distributions()
    print(f"{len(P)} cells, TV(target, draft) = {0.5 * abs(P - Q).sum():.3f}")
    rng = np.random.default_rng(0)
    for n, z in runs:
        c = Criterion(P, n, z)
        ffr = c.false_failures(rng)
        power = " ".join(f"{x:.2f}:{c.power(rng, (1 - x) * P + x * Q):.2f}" for x in SHARES)
        print(f"n={n}, z={z}: {c.dof} cells >= 5, threshold {c.threshold:.1f}, false failures {ffr:.2e} "
              f"({round(ffr * NULL_DRAWS)} of {NULL_DRAWS:.0e}; chi-square's {0.5 * math.erfc(z / 2 ** 0.5):.1e}); "
              f"power at draft share {power}", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:] or ["2500", "1250:5.0"]
    main([(int(a.split(":")[0]), float(a.split(":")[1]) if ":" in a else Z_1E6) for a in args])
