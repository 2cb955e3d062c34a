"""Logits processing (temperature, top-k, top-p, min-p) and sampling without host syncs:
position-keyed draws (Draws, sample_at) for the engines, the exponential race (sample) for
verify.stochastic.

Target and draft go through the same `process_logits`, so p and q see identical processors.
"""

from __future__ import annotations

import dataclasses
import secrets
from dataclasses import dataclass

import torch
from torch import Tensor

from swiftspec.config import ConfigError


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingParams:
    """Per-request sampling settings; temperature 0 means greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 <= self.min_p < 1.0:
            raise ConfigError(f"min_p must be in [0, 1), got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def process_logits(logits: Tensor, params: SamplingParams) -> Tensor:
    """Turn raw logits into the distribution we sample from: float32 probs, rows sum to 1.

    Order: temperature, top-k (keeps every token tied with the k-th), softmax, top-p, min-p,
    renormalise. Greedy gives the one-hot of the argmax (lowest index on ties).
    """
    logits = logits.float()  # [..., V]
    vocab = logits.shape[-1]
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), vocab).float()
    logits = logits / params.temperature
    if 0 < params.top_k < vocab:
        kth = logits.topk(params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(-1)
    if params.top_p < 1.0:
        probs = _top_p(probs, params.top_p)
    if params.min_p > 0.0:
        floor = params.min_p * probs.amax(-1, keepdim=True)
        probs = probs.masked_fill(probs < floor, 0.0)
    return probs / probs.sum(-1, keepdim=True)


TOP_P_FLOOR = 2.0**-14  # CPU top-p first looks for the nucleus among the tokens at least this likely
TOP_P_MARGIN = 2.0**-20  # their mass must pass top_p by this much (rounding of the sort's cumsum past them)


def _top_p(probs: Tensor, top_p: float) -> Tensor:
    """Keep the smallest most-likely set whose mass reaches top_p (the top token always stays; ties
    in index order).  On CPU the nucleus is found among the tokens of probability >= TOP_P_FLOOR
    where they hold it (a sort of a 150k vocabulary costs ~25 ms a row), else by sorting all."""
    if probs.device.type == "cpu" and probs.dim() == 2:
        kept = _top_p_candidates(probs, top_p)
        if kept is not None:
            return kept
    sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)  # [..., V]
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    drop = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, mass_before >= top_p)
    return probs.masked_fill(drop, 0.0)


def _top_p_candidates(probs: Tensor, top_p: float) -> Tensor | None:
    """_top_p of probs [N, V] from its tokens of probability >= TOP_P_FLOOR (at most 2^14 a row),
    the same result as a stable sort of the whole row: they are its sorted order's first tokens, so
    their stable sort and cumsum are the sort's own.  None where they may not decide it (they hold
    less than top_p + TOP_P_MARGIN)."""
    rows, where = (probs >= TOP_P_FLOOR).nonzero(as_tuple=True)  # [M] each, row-major: ids ascending
    counts = torch.bincount(rows, minlength=probs.shape[0])  # [N]
    if int(counts.min()) == 0:
        return None
    starts = counts.cumsum(0) - counts  # [N]
    slot = torch.arange(len(rows)) - starts[rows]  # [M]: place in its row
    width = int(counts.max())
    values = torch.zeros(probs.shape[0], width, dtype=probs.dtype)  # [N, C]: zero-padded candidates, id order
    values[rows, slot] = probs[rows, where]
    ordered, order = values.sort(dim=-1, descending=True, stable=True)  # [N, C]
    mass = ordered.cumsum(-1)
    if not bool((mass[:, -1] >= top_p + TOP_P_MARGIN).all()):
        return None
    drop = torch.zeros_like(values, dtype=torch.bool).scatter(-1, order, mass - ordered >= top_p)  # [N, C]
    kept = torch.zeros_like(probs)
    kept[rows, where] = values.masked_fill(drop, 0.0)[rows, slot]
    return kept


def sample(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """Draw one token per row of probs [..., V] -> [...] int64, without a host sync.

    Exponential race: argmax(p_i / E_i) with E_i ~ Exp(1) picks i with probability p_i.
    """
    race = torch.empty(probs.shape, dtype=torch.float32, device=probs.device)
    race.exponential_(generator=generator)
    # Exp(1) can round to 0; 0/0 would be NaN, which argmax treats as the maximum.
    race.clamp_min_(torch.finfo(torch.float32).tiny)
    return (probs.float() / race).argmax(-1)


MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """One step of SplitMix64 (Steele, Lea and Flood 2014): a 64-bit integer hash."""
    z = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


@dataclass(frozen=True, slots=True)
class Draws:
    """The uniforms that sampled tokens are drawn with: one per position in the sequence, a hash of
    the request's seed and that position alone.

    A sampled token is the inverse CDF of its distribution at its position's uniform (sample_at).
    So which token a position gets does not depend on how decoding reached it: an autoregressive
    step, a chain or any verified tree (verify.verify_sampled) draw the same token, and a seeded
    request gives the same text in every mode, whatever shape its rounds take.  Each position's
    uniform is used once along the emitted sequence, so tokens follow the target's distribution."""

    seed: int  # 64-bit

    @classmethod
    def for_request(cls, params: SamplingParams) -> Draws:
        """The draws of a request's seed (with_seed gives every sampled request one)."""
        return cls((params.seed or 0) & MASK64)

    def uniforms(self, position: int, count: int, device: torch.device | str = "cpu") -> Tensor:
        """[count] float64 in [0, 1): the uniforms of positions position .. position + count - 1."""
        key = _splitmix64(self.seed)
        values = [(_splitmix64(key ^ p) >> 11) * 2.0**-53 for p in range(position, position + count)]
        return torch.tensor(values, dtype=torch.float64, device=device)


def with_seed(params: SamplingParams) -> SamplingParams:
    """params with a seed: a sampled request without one gets one from OS entropy (63 bits), so
    that its target and its draft read the same Draws."""
    if params.greedy or params.seed is not None:
        return params
    return dataclasses.replace(params, seed=secrets.randbits(63))


SAMPLE_BLOCK = 128  # sample_at finds a row's block of this many tokens first, then the token in it


def sample_at(probs: Tensor, uniforms: Tensor) -> Tensor:
    """The inverse CDF of each row of probs [N, V] at uniforms [N] float64 in [0, 1) -> [N] int64:
    the first token whose cumulative probability (vocabulary order, float64) passes u times the
    row's total.  Token i is picked for u in an interval of width p_i, so never a token of no mass.

    In two steps, so that no float64 copy of a whole row is scanned (a 151,936-token cumsum costs
    ~1.4 ms a row): the cumulative sums of blocks of SAMPLE_BLOCK tokens find the block, then
    the cumulative sum inside that block the token.  The result is a function of the row alone."""
    rows, vocab = probs.shape
    pad = -vocab % SAMPLE_BLOCK
    blocks = torch.nn.functional.pad(probs.float(), (0, pad)).view(rows, -1, SAMPLE_BLOCK)  # [N, B, S]
    ends = blocks.sum(-1, dtype=torch.float64).cumsum(-1)  # [N, B]: mass up to the end of each block
    total = ends[:, -1:]  # [N, 1]
    target = torch.minimum(uniforms[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))  # [N, 1]
    block = torch.searchsorted(ends, target, right=True).clamp_max(ends.shape[1] - 1)  # [N, 1]
    start = torch.where(block > 0, ends.gather(-1, (block - 1).clamp_min(0)), torch.zeros_like(total))  # [N, 1]
    inside = blocks.gather(1, block[:, :, None].expand(rows, 1, SAMPLE_BLOCK))[:, 0]  # [N, S]
    local = torch.searchsorted(inside.double().cumsum(-1), target - start, right=True)  # [N, 1]
    # Rounding between the block sums and the cumsum inside may run past the block's last token of
    # mass (never more than a few ulps): then take that token.
    last = SAMPLE_BLOCK - 1 - (inside > 0).flip(-1).int().argmax(-1, keepdim=True)  # [N, 1]
    return (block * SAMPLE_BLOCK + torch.minimum(local, last)).squeeze(-1)


def pick_tokens(logits: Tensor, params: SamplingParams, draws: Draws, position: int) -> Tensor:
    """Tokens of positions position .. position + N - 1 from logits [N, V] -> [N] int64 (one row
    per position): argmax when greedy, else sample_at with the positions' uniforms (Draws)."""
    if params.greedy:
        return logits.argmax(-1)
    probs = process_logits(logits, params)
    return sample_at(probs, draws.uniforms(position, probs.shape[0], probs.device))


DRAFT_CANDIDATES = 64  # a sampled draft row is processed over its this many likeliest tokens


@dataclass(frozen=True, slots=True)
class DraftNucleus:
    """A sampled draft row's distribution over its DRAFT_CANDIDATES likeliest tokens, in token-id
    order (the order sample_at's inverse CDF reads, as the target's)."""

    ids: Tensor  # [N, C] int64 ascending token ids (of the draft's head)
    probs: Tensor  # [N, C] float32, rows sum to 1


def draft_nucleus(logits: Tensor, params: SamplingParams) -> DraftNucleus:
    """process_logits for a sampled draft, over each row's DRAFT_CANDIDATES likeliest tokens only
    (temperature, top-k, softmax, top-p, min-p among them): the draft only guesses, and a full
    151,936-token row costs ~1.3 ms, a forward's rows ~10 ms, against ~0.5 ms for all of them here.
    Where the nucleus lies among the candidates (top-p < 1 at usual temperatures) it is the draft's
    whole processed distribution.  Without top-p the tokens outside the candidates hold mass between
    them, which the inverse CDF must count (or the draft's draw stops matching the target's): then
    the whole row, which process_logits serves cheaply (no nucleus to find)."""
    if params.top_p >= 1.0:
        probs = process_logits(logits, params)  # [N, V]
        return DraftNucleus(ids=torch.arange(probs.shape[-1], device=probs.device).expand(probs.shape), probs=probs)
    top = logits.float().topk(min(DRAFT_CANDIDATES, logits.shape[-1]), dim=-1)  # [N, C] descending
    scores = top.values / params.temperature
    if 0 < params.top_k < scores.shape[-1]:
        scores = scores.masked_fill(scores < scores[:, params.top_k - 1 : params.top_k], float("-inf"))
    probs = scores.softmax(-1)
    if params.top_p < 1.0:
        probs = probs.masked_fill(probs.cumsum(-1) - probs >= params.top_p, 0.0)
    if params.min_p > 0.0:
        probs = probs.masked_fill(probs < params.min_p * probs[:, :1], 0.0)
    ids, order = top.indices.sort(-1)
    return DraftNucleus(ids=ids, probs=(probs / probs.sum(-1, keepdim=True)).gather(-1, order))
