"""SwiftSpec's asynchronous, disaggregated engine (paper Algorithm 1), front end = target leader.

This process is global rank 0: it leads the target group, verifies and decides every token.  The
other ranks (draft group, target followers) are its worker group (distributed/worker_group.py), spawned by
`generate --mode async` itself or started by torchrun; their loops are in distributed/workers.py.  A
worker that dies or hangs fails the running request with an EngineFault, never the process, and
recover() restarts the workers.  This module is the loop: prefill, then round after round receive
the draft's subtree, forward it, verify it, commit, and send the verified tokens back.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from swiftspec.cache.prompt_store import PromptStore
from swiftspec.config import NO_DRAFT, EngineConfig
from swiftspec.distributed.protocol import DistTransport, DraftTree, GroupBroadcast, Profile, Start, Verified
from swiftspec.distributed.supervisor import Limits
from swiftspec.distributed.worker_group import WorkerGroup
from swiftspec.engines.base import Generation, GenerationStats, RequestState, Rounds
from swiftspec.engines.startup import StartupProfile, Warmup, async_profile
from swiftspec.errors import EngineFault
from swiftspec.parallel.cores import Lane, plan_cores
from swiftspec.parallel.rendezvous import Joined
from swiftspec.runner.load import check_pair
from swiftspec.sampling import Draws, SamplingParams, pick_tokens, with_seed
from swiftspec.speculate import TreeVerifier
from swiftspec.trace import CODE, Timeline, TraceFile, request_trace, summarize
from swiftspec.tree import mask_from_parents
from swiftspec.weights.loaded_model import LoadedModel
from swiftspec.weights.loader import load_tokenizer, model_args
from swiftspec.weights.source import resolve_source

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Flow:
    """Where one request stands on the link between the two leaders."""

    tree_in_flight: bool = True  # the draft has sent (or will send) a tree we have not received
    stop_sent: bool = False


class AsyncEngine:
    """Target leader: receives subtrees, verifies them, sends back the verified tokens.

    Cores (CPU).  This process is also the front end's, so the engine leaves its caller's thread as
    it is.  The rounds, which overlap the draft group's drafting on its own cores, run on a lane
    pinned to the target's share (parallel/cores.py), made once here.  The prefill comes while the
    draft group waits: a lone target rank runs it on the calling thread as that thread is set (all
    cores by default), as the serial engines run; a tensor-parallel one on the lane, in step with
    its followers.
    """

    def __init__(self, config: EngineConfig, joined: Joined | None = None,
                 target: LoadedModel | None = None, startup: StartupProfile | None = None,
                 store: PromptStore | None = None) -> None:
        """joined: a draft host already linked through parallel/rendezvous.py (no workers to spawn);
        target: the target model, when the caller has loaded it already (tensor-parallel size 1);
        startup: d and the verify times when known already (auto's; startup.async_profile);
        store: a prompt cache store shared with the caller's other engine (None: the config's own)."""
        self.config = config
        self.workers = WorkerGroup(config, joined, target, store)  # under torchrun, ranks > 0 never return
        self.layout = self.workers.layout
        self.verify_size = config.tree.verify_size
        self.max_seq_len = config.target_load.max_seq_len
        self.trace: TraceFile | None = None  # set while a caller wants each request's timeline
        self.mode = "async"
        self.limits = Limits()  # generous until profiled
        on_cpu = not config.target_load.device.startswith("cuda")
        cores = (joined and joined.cores) or plan_cores(self.layout, 0, config.draft_cores)
        self.lane = Lane(cores if on_cpu else None, "target")
        self.prefill_lane = self.lane if self.layout.target_tp > 1 else Lane()
        try:
            self.workers.start()
            self.tokenizer = self.target.tokenizer
            if joined is None and config.draft != NO_DRAFT:  # a draft host's tokenizer was checked at its handshake
                self._check_draft()
            self.profile = async_profile(config.tree, self, startup)
            self.limits = self._hang_limits(self.profile)
        except BaseException:
            self.close()
            raise

    @property
    def target(self) -> LoadedModel:  # this rank's (shard of the) target
        return self.workers.target

    def _check_draft(self) -> None:
        """The draft the workers load must pair with the target (runner.load.check_pair); read from
        its tokenizer and header alone."""
        path = resolve_source(self.config.draft)
        check_pair(self.tokenizer, load_tokenizer(path), self.target.args.vocab_size, model_args(path).vocab_size)

    @property
    def verifier(self) -> TreeVerifier:
        return self.workers.verifier

    @property
    def link(self) -> DistTransport:
        """To the draft group's leader."""
        return self.workers.link

    @property
    def followers(self) -> GroupBroadcast | None:
        """To the target group's tensor-parallel ranks (None when the target runs on one)."""
        return self.workers.followers

    @property
    def fault(self) -> str | None:
        """Why the engine cannot serve until recover() (a worker died or hung); None when it can."""
        return self.workers.fault

    def recover(self) -> bool:
        """After a fault, restart the workers (raises EngineFault if that fails). True if it restarted."""
        return self.workers.recover()

    def generate(
        self,
        prompt: list[int],
        params: SamplingParams,
        max_new_tokens: int,
        should_stop: Callable[[], bool] | None = None,
        reuse: bool = True,
    ) -> Generation:
        req = RequestState(prompt, max_new_tokens, self.max_seq_len, self.tokenizer.eos_token_ids, should_stop, reuse)
        return Generation(self._run(req, prompt, params, self.profile), req.stats)

    @property
    def prompt_store(self) -> PromptStore | None:
        return self.verifier.runner.store

    def cached_prefix(self, prompt: list[int]) -> int:
        return self.verifier.runner.cached_prefix(prompt) if self.followers is None else 0

    @property
    def depth(self) -> int:
        return self.profile.depth

    def _run(self, req: RequestState, prompt: list[int], params: SamplingParams, plan: StartupProfile) -> Rounds:
        """generate() of a request already set up, its rounds as `plan` says (d, verify costs);
        guarded by the worker group: fails at once while a fault stands, and turns a failure in the
        middle into a recorded fault."""
        with self.workers.serving():
            yield from self._generate(req, prompt, params, plan)

    def _generate(self, req: RequestState, prompt: list[int], params: SamplingParams,
                  plan: StartupProfile) -> Iterator[list[int]]:
        """Algorithm 1, target side: prefill, start the draft, then verify round after round."""
        timeline, flow = Timeline(), Flow()
        params = with_seed(params)  # the target's and the draft's draws (sampling.Draws)
        draws = Draws.for_request(params)
        limit = self.limits.prefill(len(prompt))  # the first round also waits for the draft's prefill
        with self.workers.watch("the prefill", limit):
            first = self._prefill(prompt, params, draws, plan, timeline, req)
        if first is None:  # stopped during the prefill, or asked for no token: the draft was never started
            return
        try:
            out = req.emit(first)
            if out:
                yield out
            while not req.done:
                with self.workers.watch("a decode round", limit):
                    emitted, verified = self.step(params, draws, timeline, flow)
                    out = req.emit(emitted)
                    self._send_verified(dataclasses.replace(verified, stop=req.done), timeline, flow)
                limit = self.limits.round_s
                req.stats.rounds += 1
                req.stats.accept_lengths.append(len(emitted))
                if out:
                    yield out
        except GeneratorExit:  # the consumer abandoned the stream
            self._end(timeline, flow, req.stats, limit)
            raise
        self._end(timeline, flow, req.stats, limit)

    def _prefill(self, prompt: list[int], params: SamplingParams, draws: Draws, plan: StartupProfile,
                 timeline: Timeline, req: RequestState) -> list[int] | None:
        """Prefill the target (its followers too) and pick the first token; Start the draft on it.
        None, with no draft started, when the request stopped during the prefill (a lone target
        rank asks between chunks) or asked for no token."""
        prompt_t = torch.tensor(prompt, dtype=torch.long)
        if self.followers is not None:
            self.followers.send(Start(prompt=prompt_t, first_token=0, depth=0, params=params))
        # tensor-parallel followers prefill the whole prompt, keeping nothing: the leader does the same
        alone = self.followers is None
        with timeline.span("prefill"):
            logits = req.prefilled(self.prefill_lane.run(self.verifier.prefill, prompt, req.reuse and alone,
                                                         req.should_stop if alone else None))  # [1, V]
            if logits is None:
                return None
            first = pick_tokens(logits, params, draws, len(prompt)).tolist()  # [1]
        costs = torch.tensor(plan.verify_s, dtype=torch.float64)  # [bs], or [0] without adaptive verification
        self.link.send(Start(prompt=prompt_t, first_token=first[0], depth=plan.depth, params=params, verify_costs=costs))
        return first

    def step(self, params: SamplingParams, draws: Draws, timeline: Timeline,
             flow: Flow) -> tuple[list[int], Verified]:
        """One round on the target's critical path: receive, then forward, verify, commit (on the lane)."""
        with timeline.span("wait_tree"):
            tree = self.link.recv()  # the draft's best bs-node subtree, grown while we verified
            flow.tree_in_flight = False
        if not isinstance(tree, DraftTree):
            raise EngineFault(f"protocol error: expected a draft tree, got {type(tree).__name__}")
        if self.followers is not None:
            self.followers.send(tree)
        emitted, verified = self.lane.run(self._verify_tree, tree, params, draws, timeline)
        timeline.count(len(emitted), tree.tokens.numel())
        return emitted, verified

    def _verify_tree(self, tree: DraftTree, params: SamplingParams, draws: Draws,
                     timeline: Timeline) -> tuple[list[int], Verified]:
        """Forward the tree, verify it and commit the accepted path: the tokens emitted."""
        with timeline.span("forward"):
            mask = mask_from_parents(tree.parents)  # [n, n]
            dev = self.verifier.runner.device
            logits = self.verifier.forward_tree(tree.tokens.to(dev), tree.depths.to(dev), mask.to(dev))
        with timeline.span("verify"):
            acc = self.verifier.verify(tree.tokens.to(dev), tree.parents.to(dev), tree.depths.to(dev), logits, params, draws)
            emitted = acc.tokens.tolist()  # the one host sync of the round
            nodes = acc.path[: len(emitted)]
            self.verifier.commit(nodes)
        return emitted, Verified(tokens=torch.tensor(emitted), nodes=nodes.cpu(), stop=False)

    def _send_verified(self, verified: Verified, timeline: Timeline, flow: Flow) -> None:
        with timeline.span("send_verified"):
            self.link.send(verified)
            if self.followers is not None:
                self.followers.send(verified)
        flow.tree_in_flight, flow.stop_sent = not verified.stop, verified.stop

    def _end(self, timeline: Timeline, flow: Flow, stats: GenerationStats, limit: float) -> None:
        """Leave both groups idle and in step: take the tree still in flight, stop the draft if it
        was not told yet, and read its report (busy time and spans)."""
        with self.workers.watch("the end of a request", limit):
            if flow.tree_in_flight:
                self.link.recv()
            if not flow.stop_sent:
                empty = torch.zeros(0, dtype=torch.long)
                self._send_verified(Verified(tokens=empty, nodes=empty, stop=True), timeline, flow)
            reply = self.link.recv()
        if not isinstance(reply, Profile):
            raise EngineFault(f"protocol error: expected the draft's report, got {type(reply).__name__}")
        stats.draft_s = reply.seconds
        stats.verify_s = sum(e - s for c, s, e in timeline.events if c in (CODE["forward"], CODE["verify"]))
        stats.spans = summarize(timeline.as_tensor(), reply.events)
        if self.trace is not None:
            self.trace.add(request_trace(timeline, reply.events))

    def warmup(self, prompt: list[int], plan: StartupProfile) -> Warmup:
        """A 24-token greedy request as `plan` says (startup.Probe); per round, the target's
        forward and the draft's expansion (the draft expands once more than the target verifies)."""
        req = RequestState(prompt, 24, self.max_seq_len, self.tokenizer.eos_token_ids)
        for _ in self._run(req, prompt, SamplingParams(), plan):
            pass
        stats, spans = req.stats, req.stats.spans
        t_target = spans["target"]["spans_s"].get("forward", 0.0) / max(1, stats.rounds)
        t_draft = spans["draft"]["spans_s"].get("expand", 0.0) / max(1, stats.rounds + 1)
        return Warmup(stats=stats, t_target_s=t_target, t_draft_s=t_draft)

    def verify_times(self, prompt: list[int]) -> list[float]:
        """Seconds to verify 1..bs nodes (startup.Probe).  Only a lone target leader can time its
        forwards alone (tensor-parallel followers mirror every forward): otherwise [], all bs."""
        if self.layout.target_tp > 1:
            return []
        return self.lane.run(self.verifier.verify_times, prompt, self.verify_size)

    def _hang_limits(self, profile: StartupProfile) -> Limits:
        """Hang limits from the profile's warm request: seconds per decode round and per prompt token."""
        limits = Limits.profiled(profile.round_s, profile.prefill_token_s, self.config.worker_timeout)
        log.info("async: %.1f ms per round; a round that takes over %.1f s means a hung worker",
                 1e3 * profile.round_s, limits.round_s)
        return limits

    def close(self) -> None:
        """Shut the workers down (killed if they are out of step or slow to exit); leave the groups."""
        self.workers.close()
        self.lane.close()
