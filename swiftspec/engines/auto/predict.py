"""What `--mode auto` measured (a PairProfile) and the speed it predicts for each engine; pure.

A round of each speculative engine is simulated along built-in texts whose every position holds
where the draft ranked the target's greedy token and how sure the draft was (teacher forcing, one
prefill per model), and timed with the forward costs measured per row count.
"""

from __future__ import annotations

from dataclasses import dataclass

from swiftspec.config import TreeConfig
from swiftspec.engines.startup import async_depth


@dataclass(frozen=True, slots=True, kw_only=True)
class Costs:
    """Seconds per forward at measured row counts (ascending); linear in between and beyond."""

    rows: tuple[int, ...]
    seconds: tuple[float, ...]

    def at(self, n: int) -> float:
        pts = list(zip(self.rows, self.seconds))
        if n <= pts[0][0] or len(pts) == 1:
            return pts[0][1]
        lo, hi = pts[-2], pts[-1]
        for a, b in zip(pts, pts[1:]):
            if n <= b[0]:
                lo, hi = a, b
                break
        return lo[1] + (hi[1] - lo[1]) * (n - lo[0]) / (hi[0] - lo[0])

    def scaled(self, factor: float) -> "Costs":
        return Costs(rows=self.rows, seconds=tuple(s * factor for s in self.seconds))

    def best(self, other: "Costs") -> "Costs":
        """The faster of two measurements of the same model, row count by row count."""
        return Costs(rows=self.rows, seconds=tuple(min(self.at(n), other.at(n)) for n in self.rows))


@dataclass(frozen=True, slots=True, kw_only=True)
class Position:
    """One position of a built-in text, predicted by both models from the same prefix."""

    on_path: bool  # the text's token there is the target's greedy token
    rank: int  # 1-based rank of the target's greedy token among the draft's top-k; 0 = not among them
    logprobs: tuple[float, ...]  # the draft's top-k log-probabilities, best first


@dataclass(frozen=True, slots=True, kw_only=True)
class DraftProfile:
    """The draft in one weight format: its forward costs and its guesses along the texts."""

    weights: str
    alone: Costs  # on every core the engine uses (serial modes)
    grouped: Costs  # on the draft group's cores (async)
    texts: tuple[tuple[Position, ...], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class PairProfile:
    """A machine and model pair, measured once (engines/auto/profile.py) and cached."""

    device: str  # "cpu" | "cuda"
    cores: int  # CPU cores (threads) of the serial engines
    target_cores: int  # of them, the async target group's (the draft group has the rest)
    devices: int  # CUDA devices (0 on CPU): async gives each group its own when there are two
    target_bytes: int  # weight bytes one target forward reads
    draft_bytes: dict[str, int]  # per draft weight format
    target_alone: Costs
    target_grouped: Costs
    drafts: tuple[DraftProfile, ...]
    seconds: float  # how long profiling took

    @property
    def disturbed(self) -> bool:
        """Other work competed for the cores while profiling: a target forward on all of them ran
        slower than on the target group's share (it never does on an idle machine), so the
        figures describe that moment's load, not the machine."""
        alone, grouped = self.target_alone.at(1), self.target_grouped.at(1)
        return self.device == "cpu" and self.cores > self.target_cores and alone > BUSY_RATIO * grouped + BUSY_SLACK_S


BUSY_RATIO = 1.5  # PairProfile.disturbed: all cores slower than the group's share by more than this,
BUSY_SLACK_S = 0.005  # and by more than this (a tiny model's forward is all thread overhead)


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """What the forward costs and the texts do not show, fitted to the default pair's measured
    rounds (docs/bench/auto.md#the-run-of-2026-11-30, docs/bench/auto.md): per-round work
    outside the forwards, how much of its tree a serial round finds already grown, and what async
    loses by growing its tree ahead, unfocused, before it knows which branch the target accepts."""

    chain_s: float = 0.003  # per chain round
    tree_s: float = 0.025  # per serial tree round (selection, adaptive bookkeeping, re-rooting)
    async_s: float = 0.035  # per async round: the draft re-roots, selects and sends while the target waits
    # Adaptive serial rounds expand about first_expansions + reuse * a times when they accept a
    # draft tokens (a least-squares fit over 110 rounds of 8 HumanEval prompts, AVX-512 host,
    # 2026-12-04: docs/bench/auto.md; the 0.45 of 2026-11-30, with one first expansion,
    # predicted 2.3x ar where 1.53x was measured).
    first_expansions: float = 2.3
    reuse: float = 0.59
    focus_rows: int = 4  # rows of a focused serial expansion (only leaves that can still be verified)
    async_accept: float = 0.82  # accepted draft tokens per async round, against a serial tree's


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """One engine (with one draft format) as the profile predicts it."""

    mode: str
    draft_weights: str | None  # None for ar
    tokens_per_s: float
    tokens_per_round: float
    slowdown: float = 1.0  # async: its target forward's time against the serial engines' (cores and bus)
    bus: float = 1.0  # async: the part of the slowdown from sharing the memory bus (or one GPU)

    @property
    def label(self) -> str:
        return self.mode if self.draft_weights is None else f"{self.mode} ({self.draft_weights} draft)"


def chain_round(text: tuple[Position, ...], start: int, k: int) -> int:
    """Draft tokens a k-token chain gets accepted from `start` (the draft's first choices)."""
    accepted = 0
    for p in text[start : start + k]:
        if p.rank != 1:
            break
        accepted += 1
        if not p.on_path:  # the draft agreed with the target, but the text goes on elsewhere
            break
    return accepted


def tree_round(text: tuple[Position, ...], start: int, size: int, depth: int) -> int:
    """Draft tokens a `size`-node tree (root included) of at most `depth` levels gets accepted.

    The tree holds the nodes of highest draft path probability: the target's path is covered at
    depth m while the path nodes so far and the siblings more likely than its m-th node fit."""
    path_lp, accepted = 0.0, 0
    siblings: list[float] = []
    for m, p in enumerate(text[start : start + depth], start=1):
        if p.rank == 0:
            break
        siblings += [path_lp + lp for r, lp in enumerate(p.logprobs, start=1) if r != p.rank]
        path_lp += p.logprobs[p.rank - 1]
        if m + sum(1 for s in siblings if s >= path_lp) > size - 1:
            break
        accepted += 1
        if not p.on_path:
            break
    return accepted


def simulate(texts: tuple[tuple[Position, ...], ...], round_fn) -> list[int]:  # round_fn(text, start) -> int
    """Accepted draft tokens of every round, decoding each text from its start to its end."""
    rounds = []
    for text in texts:
        i = 0
        while i < len(text):
            a = round_fn(text, i)
            rounds.append(a)
            i += a + 1  # the accepted tokens and the target's own next token
    return rounds


def _rate(rounds: list[float], seconds: list[float]) -> tuple[float, float]:
    """(tokens per second, tokens per round) of rounds accepting rounds[i] draft tokens each."""
    tokens = sum(a + 1 for a in rounds)
    return tokens / max(sum(seconds), 1e-9), tokens / max(1, len(rounds))


def predict_ar(profile: PairProfile) -> Prediction:
    return Prediction(mode="ar", draft_weights=None, tokens_per_s=1.0 / profile.target_alone.at(1),
                      tokens_per_round=1.0)


def predict_chain(profile: PairProfile, draft: DraftProfile, tree: TreeConfig, cal: Calibration) -> Prediction:
    """k one-row draft forwards (the first also computes the last round's bonus token), then one
    target forward over k + 1 nodes."""
    k = tree.chain_length
    rounds = simulate(draft.texts, lambda text, i: chain_round(text, i, k))
    round_s = draft.alone.at(2) + (k - 1) * draft.alone.at(1) + profile.target_alone.at(k + 1) + cal.chain_s
    tps, tpr = _rate(rounds, [round_s] * len(rounds))
    return Prediction(mode="chain", draft_weights=draft.weights, tokens_per_s=tps, tokens_per_round=tpr)


def predict_tree(profile: PairProfile, draft: DraftProfile, tree: TreeConfig, depth: int,
                 cal: Calibration) -> Prediction:
    """Serial tree rounds of at most `depth` expansions.  Adaptive rounds expand about as deep as
    the draft stays right (less what earlier rounds grew) and verify about the nodes that pay."""
    bs, adaptive = tree.verify_size, bool(tree.adaptive)
    rounds = simulate(draft.texts, lambda text, i: tree_round(text, i, bs, depth))
    expand_s = draft.alone.at(min(tree.width, cal.focus_rows))

    def round_s(a: int) -> float:
        expansions = min(depth, cal.first_expansions + cal.reuse * a) if adaptive else depth
        rows = min(bs, a + 2) if adaptive and tree.adaptive_verify else bs
        return expansions * expand_s + profile.target_alone.at(rows) + cal.tree_s

    tps, tpr = _rate(rounds, [round_s(a) for a in rounds])
    return Prediction(mode="tree", draft_weights=draft.weights, tokens_per_s=tps, tokens_per_round=tpr)


def bus_slowdown(profile: PairProfile, draft: DraftProfile, target_s: float, draft_s: float) -> float:
    """How much longer each group's forwards take when both run at once.

    CPU: both groups read their weights over one memory bus; when their demands (bytes per
    forward over seconds per forward) add up to more than the most one model drew alone, both slow
    down in proportion.  CUDA: none with a device per group; on one device the groups take turns."""
    if profile.device == "cuda":
        return 1.0 if profile.devices >= 2 else 2.0
    d_bytes = profile.draft_bytes[draft.weights]
    fastest = (profile.target_bytes / profile.target_alone.at(1), profile.target_bytes / profile.target_grouped.at(1),
               d_bytes / draft.alone.at(1), d_bytes / draft.grouped.at(1))
    bandwidth = max(fastest)  # the most any one forward drew
    demand = profile.target_bytes / target_s + d_bytes / draft_s
    return max(1.0, demand / bandwidth)


def predict_async(profile: PairProfile, draft: DraftProfile, tree: TreeConfig, cal: Calibration,
                  own_devices: bool = False) -> Prediction:
    """The draft grows the tree while the target verifies the last one: a round is the target's
    forward on its group's cores (over the nodes that pay, with adaptive verification), slowed by
    the shared bus, plus the rendezvous.  own_devices:
    as if each group had its own cores and memory (each model's faster measurement, no sharing)."""
    bs, w = tree.verify_size, tree.width
    if own_devices:
        target, drafter = profile.target_alone.best(profile.target_grouped), draft.alone.best(draft.grouped)
    else:
        target, drafter = profile.target_grouped, draft.grouped
    slow = 1.0 if own_devices else bus_slowdown(profile, draft, target.at(bs), drafter.at(w))
    verify_s, expand_s = slow * target.at(bs), slow * drafter.at(w)
    depth = tree.depth or async_depth(verify_s, expand_s)
    accepted = simulate(draft.texts, lambda text, i: tree_round(text, i, bs, depth))
    rounds = [cal.async_accept * a for a in accepted]
    # with adaptive verification the target verifies about the nodes that pay, as in predict_tree
    rows = [min(bs, a + 2) if tree.adaptive_verify else bs for a in accepted]
    tps, tpr = _rate(rounds, [slow * target.at(n) + cal.async_s for n in rows])
    return Prediction(mode="async", draft_weights=draft.weights, tokens_per_s=tps, tokens_per_round=tpr,
                      slowdown=verify_s / profile.target_alone.at(bs), bus=slow)
