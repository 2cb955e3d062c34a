"""Serial speculative decoding: draft and target take turns (chain and SpecExec-style tree modes)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import torch

from swiftspec.cache.prompt_store import PromptStore
from swiftspec.config import TreeConfig
from swiftspec.engines.base import Generation, GenerationStats, RequestState, Rounds
from swiftspec.engines.startup import StartupProfile, Warmup, serial_profile
from swiftspec.sampling import Draws, SamplingParams, pick_tokens, with_seed
from swiftspec.speculate import TreeDrafter, TreeVerifier
from swiftspec.speculate.costs import RoundCosts, RoundTimes, promised
from swiftspec.trace import Timeline, TraceFile, request_trace
from swiftspec.weights.loaded import LoadedModel

SAMPLED_FLOOR = 0.45  # sampled rounds expand and verify only nodes at least this likely under the draft


@dataclass(frozen=True, slots=True)
class RoundStamps:
    """perf_counter() readings at the step boundaries of one serial round."""

    start: float  # drafting begins
    select: float  # subtree selection begins
    forward: float  # the target forward begins
    verify: float  # verification (and the KV commit) begins
    reroot: float  # the draft re-roots
    end: float


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
                out = req.emit(self.step(params, draws, req.stats, depth, costs, timelines))
                if out:
                    yield out
        finally:
            if self.trace is not None:
                self.trace.add(request_trace(target_tl, draft_tl))

    def step(self, params: SamplingParams, draws: Draws, stats: GenerationStats, depth: int,
             costs: RoundCosts, timelines: tuple[Timeline, Timeline]) -> list[int]:
        """One round, as named steps, recorded on the request's (target, draft) timelines; returns
        the emitted tokens (accepted + bonus)."""
        t0 = time.perf_counter()
        adapt = self.cfg.adaptive and params.greedy  # rounds shaped by measured costs (never the tokens)
        floor = costs.min_weight() if adapt else self._fixed_floor(params)
        expansions = self.drafter.draft(depth, focus=self.cfg.verify_size, min_weight=floor)  # <= d forwards
        t_select = time.perf_counter()
        verify_costs = costs.verify_costs() if adapt else None  # verify only the nodes that repay it
        sub = self.drafter.subtree(self._verify_size(floor), verify_costs, t_select - t0 + costs.other_s, costs.trust())
        t1 = time.perf_counter()
        logits = self.target.forward_tree(sub.tokens, sub.depths, sub.mask)  # [n <= bs, V]
        t_verify = time.perf_counter()
        acc = self.target.verify(sub.tokens, sub.parents, sub.depths, logits, params, draws)
        emitted = acc.tokens.tolist()  # the emit point: the round's result reaches the host
        promise = promised(self.drafter.tree.weights, sub.nodes)
        self.target.commit(acc.path[: len(emitted)])
        t2 = time.perf_counter()
        self.drafter.advance(emitted)  # re-root, commit the path, compact the survivors
        t3 = time.perf_counter()
        nodes = sub.tokens.shape[0]
        _record(timelines, RoundStamps(t0, t_select, t1, t_verify, t2, t3), len(emitted), nodes)
        costs.update(RoundTimes(t1 - t0, expansions, nodes, t2 - t1, t3 - t0, len(emitted), promise))
        stats.draft_s += (t1 - t0) + (t3 - t2)
        stats.verify_s += t2 - t1
        stats.rounds += 1
        stats.accept_lengths.append(len(emitted))
        return emitted

    def _fixed_floor(self, params: SamplingParams) -> float:
        """The floor of rounds the cost rules do not shape: a sampled request (with --adaptive)
        neither expands nor verifies nodes less likely than SAMPLED_FLOOR under the draft (rounds
        by the cost rules ran 0.68x ar on sampled chat, by a floor of 0.3 0.93x; 0.45 against 0.3:
        docs/bench/chat-sampled); otherwise every round drafts d deep and verifies bs nodes."""
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


def _record(timelines: tuple[Timeline, Timeline], t: RoundStamps, emitted: int, nodes: int) -> None:
    """The round's spans on the (target, draft) timelines, and its counters."""
    target, draft = timelines
    draft.add("expand", t.start, t.select)
    draft.add("select", t.select, t.forward)
    target.add("forward", t.forward, t.verify)
    target.add("verify", t.verify, t.reroot)
    draft.add("reroot", t.reroot, t.end)
    target.count(emitted, nodes)
