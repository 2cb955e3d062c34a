"""Greedy equivalence with our `ar` mode, and whether a divergence is a numerical tie.

Two greedy runs match when their token lists are identical (same tokens, same stop: EOS at the
same place or both at the token budget). Otherwise the first divergence is the first index where the
tokens differ, or the shorter length when one list is a prefix of the other (one run stopped there).

Tie rule: our target (same source, dtype and weight format as `ar`) is run once on prompt + the
common prefix. With l1 >= l2 its two largest logits there, the divergence is a tie when
    l1 - l2 <= eps(dtype) * max(|l1|, |l2|)
i.e. the gap is within one rounding step of the working dtype (bf16 eps = 2^-7), so different but
correct summation orders (kernels, batch shapes, other implementations) may flip the argmax.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from swiftspec.config import LoadConfig
from swiftspec.runner.load import load_target
from swiftspec.runner.model_runner import ModelRunner

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True, slots=True)
class Divergence:
    """Where a mode first left `ar`'s greedy tokens; None fields where the probe could not run."""

    prompt: int  # index into the benchmark prompts
    token_index: int  # index into the new tokens
    tie: bool | None
    ar_token: int | None  # None: `ar` stopped here
    mode_token: int | None  # None: the mode stopped here
    logit_gap: float | None = None  # l1 - l2 of our target at that point
    tolerance: float | None = None  # eps(dtype) * max(|l1|, |l2|)

    def to_json(self) -> dict:
        return asdict(self)


def first_mismatch(ref: list[int], other: list[int]) -> int | None:
    """First index where the lists differ (the shorter length for a strict prefix); None when equal."""
    for i, (a, b) in enumerate(zip(ref, other)):
        if a != b:
            return i
    return None if len(ref) == len(other) else min(len(ref), len(other))


class TieProbe:
    """Our target, loaded on first use, answering top-2 logits after a token sequence."""

    def __init__(self, source: str, load: LoadConfig) -> None:
        self.source = source
        self.load = load
        self.eps = torch.finfo(_DTYPES[load.dtype]).eps
        self._runner = None  # swiftspec.runner.model_runner.ModelRunner, built on first use

    def top2(self, ids: list[int]) -> torch.Tensor:
        """The two largest next-token logits after `ids`, float32 [2], largest first."""
        if self._runner is None:
            model = load_target(self.source, self.load).model  # in the mode's weight format
            self._runner = ModelRunner(model, self.load.max_seq_len, max_nodes=1)
        self._runner.kv.reset()
        logits = self._runner.extend(ids)[0].float()  # [V]
        return logits.topk(2).values

    def is_tie(self, gap: float, top2: torch.Tensor) -> bool:
        return gap <= self.tolerance(top2)

    def tolerance(self, top2: torch.Tensor) -> float:
        return self.eps * float(top2.abs().max())

    def close(self) -> None:
        self._runner = None


def compare_to_ar(
    ar: list[list[int]],
    mode: list[list[int]],
    prompts: list[list[int]],
    probe: TieProbe | None,
) -> list[Divergence]:
    """The first divergence of `mode` from `ar` on each prompt where they differ (empty: all match)."""
    found = []
    for p, (ref, got) in enumerate(zip(ar, mode)):
        i = first_mismatch(ref, got)
        if i is None:
            continue
        ar_token = ref[i] if i < len(ref) else None
        mode_token = got[i] if i < len(got) else None
        if probe is None or len(prompts[p]) + i >= probe.load.max_seq_len:
            found.append(Divergence(p, i, None, ar_token, mode_token))
            continue
        top2 = probe.top2(prompts[p] + ref[:i])
        gap = float(top2[0] - top2[1])
        found.append(Divergence(p, i, probe.is_tie(gap, top2), ar_token, mode_token, gap, probe.tolerance(top2)))
    return found
