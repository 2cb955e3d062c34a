"""Serial speculative decoding: draft and target take turns (chain and SpecExec-style tree modes)."""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from swiftspec.cache.prompt_store import PromptStore
from swiftspec.config import TreeConfig
from swiftspec.engines.base import Generation, GenerationStats, RequestState, Rounds
from swiftspec.engines.startup import StartupProfile, Warmup, serial_profile
from swiftspec.sampling import Draws, SamplingParams, pick_tokens, with_seed
from swiftspec.speculate import TreeDrafter, TreeVerifier
from swiftspec.speculate.costs import RoundCosts, RoundTimes, promised
from swiftspec.speculate.fallback import Fallback
from swiftspec.trace import Timeline, TraceFile, request_trace
from swiftspec.weights.loaded_model import LoadedModel

SAMPLED_FLOOR = 0.45  # sampled rounds expand and verify only nodes at least this likely under the draft


class SerialEngine:
    """Each round: d draft expansions, one target forward over the best bs-node subtree, re-root."""

    fault: str | None = None  # runs in this process alone: nothing to lose

    def __init__(self, target: LoadedModel, drafter: TreeDrafter, cfg: TreeConfig, max_seq_len: int,
                 startup: StartupProfile | None = None, store: PromptStore | None = None) -> None:
        """startup: the start-up profile when it is known already (auto's); None: measured here.
        store: the prompt cache's earlier texts of the target (None: only the last text's KV is kept)."""
        self.cfg = cfg
        self.target = TreeVerifier(target.model, max_seq_len, cfg.verify_size, store)
        self.drafter = drafter
        self.tokenizer = target.tokenizer
        self.max_seq_len = max_seq_len
        self.trace: TraceFile | None = None  # set while a caller wants each request's timeline
        self.mode = "tree"  # build_engine names chain (and auto's choice) where it builds one
        self.profile = serial_profile(cfg, self, startup)
        self.costs = RoundCosts(verify_s=list(self.profile.verify_s))  # the running costs of every request

    @property
    def depth(self) -> int:
        return self.profile.depth

    def warmup(self, prompt: list[int], plan: StartupProfile) -> Warmup:
        """A 16-token greedy request as `plan` says, with round costs of its own (startup.Probe);
        per round, the target's forward and verification, and per expansion the draft's."""
        req = RequestState(prompt, 16, self.max_seq_len, self.tokenizer.eos_token_ids)
        costs = RoundCosts(verify_s=list(plan.verify_s))
        for _ in self._run(req, prompt, SamplingParams(), plan.depth, costs):
            pass
        return Warmup(stats=req.stats, t_target_s=req.stats.verify_s / max(1, req.stats.rounds),
                      t_draft_s=costs.expand_s)

    def verify_times(self, prompt: list[int]) -> list[float]:
        """Seconds to verify 1..bs nodes after the prompt (startup.Probe)."""
        return self.target.verify_times(prompt, self.cfg.verify_size)

    def generate(
        self,
        prompt: list[int],
        params: SamplingParams,
        max_new_tokens: int,
        should_stop: Callable[[], bool] | None = None,
        reuse: bool = True,
    ) -> Generation:
        req = RequestState(prompt, max_new_tokens, self.max_seq_len, self.tokenizer.eos_token_ids, should_stop, reuse)
        return Generation(self._run(req, prompt, params, self.depth, self.costs), req.stats)

    @property
    def prompt_store(self) -> PromptStore | None:
        return self.target.runner.store

    def cached_prefix(self, prompt: list[int]) -> int:
        return self.target.runner.cached_prefix(prompt)

    def _run(self, req: RequestState, prompt: list[int], params: SamplingParams, depth: int,
             costs: RoundCosts) -> Rounds:
        """The request's rounds at d = depth; each round reads and updates `costs`."""
        timelines = target_tl, draft_tl = Timeline(), Timeline()  # this request's spans
        fallback = Fallback() if self.cfg.fallback else None  # whether each round drafts
        params = with_seed(params)  # the target's and the draft's draws (sampling.Draws)
        draws = Draws.for_request(params)
        try:
            with target_tl.span("prefill"):
                logits = req.prefilled(self.target.prefill(prompt, req.reuse, req.should_stop))  # [1, V]
            if logits is None:
                return
            first = pick_tokens(logits, params, draws, len(prompt)).tolist()  # [1]
            out = req.emit(first)
            if out:
                yield out
            if req.done:
                return
            with draft_tl.span("prefill"):
                self.drafter.start(prompt, first[0], params)
            while not req.done:
                out = req.emit(self.step(params, draws, req.stats, depth, costs, timelines, fallback))
                if out:
                    yield out
        finally:
            if self.trace is not None:
                self.trace.add(request_trace(target_tl, draft_tl))

    def step(self, params: SamplingParams, draws: Draws, stats: GenerationStats, depth: int,
             costs: RoundCosts, timelines: tuple[Timeline, Timeline], fallback: Fallback | None = None) -> list[int]:
        """One round: draft, select, verify, commit, re-root; returns the emitted tokens (accepted +
        bonus).  The clock times each named step for the timelines, the costs and the stats.
        Where `fallback` says so, the round drafts nothing and verifies the root alone (plain decoding)."""
        clock = RoundClock()
        drafting = fallback is None or fallback.drafts()
        depth, size = (depth, self.cfg.verify_size) if drafting else (0, 1)
        adapt = self.cfg.adaptive and params.greedy  # rounds shaped by measured costs (never the tokens)
        floor = costs.min_weight() if adapt else self._fixed_floor(params)
        with clock("expand"):
            expansions = self.drafter.draft(depth, focus=size, min_weight=floor)  # <= d forwards
        with clock("select"):
            verify_costs = costs.verify_costs() if adapt else None  # verify only the nodes that repay it
            sub = self.drafter.subtree(min(size, self._verify_size(floor)), verify_costs,
                                       clock.elapsed() + costs.other_s, costs.trust())
        with clock("forward"):
            logits = self.target.forward_tree(sub.tokens, sub.depths, sub.mask)  # [n <= bs, V]
        with clock("verify"):
            acc = self.target.verify(sub.tokens, sub.parents, sub.depths, logits, params, draws)
            emitted = acc.tokens.tolist()  # the emit point: the round's result reaches the host
            promise = promised(self.drafter.tree.weights, sub.nodes)
            self.target.commit(acc.path[: len(emitted)])
        with clock("reroot"):
            self.drafter.advance(emitted)  # re-root, commit the path, compact the survivors
        clock.record(timelines, costs, stats, Outcome(expansions, sub.tokens.shape[0], len(emitted), promise))
        if fallback is not None:
            plain = costs.verify_costs()
            fallback.record(drafting, clock.elapsed(), len(emitted), 0.0 if plain is None else float(plain[0]))
            stats.plain_rounds += not drafting
        return emitted

    def _fixed_floor(self, params: SamplingParams) -> float:
        """The floor of rounds the cost rules do not shape: a sampled request (with --adaptive)
        neither expands nor verifies nodes less likely than SAMPLED_FLOOR under the draft (rounds
        by the cost rules ran 0.68x ar on sampled chat, by a floor of 0.3 0.93x; 0.45 against 0.3:
        docs/bench/sampled.md); otherwise every round drafts d deep and verifies bs nodes."""
        return math.log(SAMPLED_FLOOR) if self.cfg.adaptive and not params.greedy else -math.inf

    def _verify_size(self, floor: float) -> int:
        """bs, or where a fixed floor holds the nodes at least that likely under the draft (the best
        ones form a subtree: a child is never likelier than its parent)."""
        if floor == -math.inf:
            return self.cfg.verify_size
        return max(1, min(self.cfg.verify_size, int((self.drafter.tree.weights >= floor).sum())))

    def recover(self) -> bool:
        return False  # one process: no worker to lose

    def close(self) -> None:
        self.target = self.drafter = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a round did, beside its times."""

    expansions: int  # draft forwards
    nodes: int  # nodes verified
    emitted: int  # tokens emitted
    promised: float  # accepted tokens the verified nodes' path probabilities promised


class RoundClock:
    """perf_counter() readings at the boundaries of one serial round's named steps, which follow
    each other without a gap: `with clock("expand"): ...` ends the step "expand" when its block does."""

    DRAFT = ("expand", "select", "reroot")  # the steps on the draft's timeline; the others are the target's

    def __init__(self) -> None:
        self.start = self.last = time.perf_counter()  # last: the end of the last finished step
        self.spans: dict[str, tuple[float, float]] = {}  # step -> (begin, end)

    @contextmanager
    def __call__(self, step: str) -> Iterator[None]:
        yield
        end = time.perf_counter()
        self.spans[step] = (self.last, end)
        self.last = end

    def elapsed(self) -> float:
        """Seconds from the round's start to the end of its last finished step."""
        return self.last - self.start

    def seconds(self, *steps: str) -> float:
        return sum(self.spans[s][1] - self.spans[s][0] for s in steps)

    def record(self, timelines: tuple[Timeline, Timeline], costs: RoundCosts, stats: GenerationStats,
               done: Outcome) -> None:
        """The round's spans and counters on the (target, draft) timelines, its times in the running
        costs, and its share of the request's stats."""
        target, draft = timelines
        for step, (begin, end) in self.spans.items():
            (draft if step in self.DRAFT else target).add(step, begin, end)
        target.count(done.emitted, done.nodes)
        drafting, verifying = self.seconds("expand", "select"), self.seconds("forward", "verify")
        costs.update(RoundTimes(drafting, done.expansions, done.nodes, verifying, self.elapsed(), done.emitted,
                                done.promised))
        stats.draft_s += drafting + self.seconds("reroot")
        stats.verify_s += verifying
        stats.rounds += 1
        stats.accept_lengths.append(done.emitted)
