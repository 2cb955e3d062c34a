"""SwiftSpec's asynchronous, disaggregated engine (paper Algorithm 1), front end = target leader.

This process is global rank 0: it leads the target group, verifies and decides every token.
`generate --mode async` spawns the other ranks itself (draft group, target followers) and watches
them (runtime/supervisor.py): a worker that dies or hangs fails the running request with an
EngineFault, never the process, and recover() respawns the workers. Under torchrun the same entry
point reads RANK/WORLD_SIZE/MASTER_ADDR and ranks > 0 run worker loops (runtime/async_worker.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.distributed as dist

from swiftspec.config import NO_DRAFT, EngineConfig
from swiftspec.exec.load import check_pair
from swiftspec.errors import EngineFault, LinkError
from swiftspec.parallel.groups import (
    Layout,
    all_ready,
    init_groups,
    joined,
    leave_groups,
    meeting_point,
)
from swiftspec.parallel.cores import Lane, plan_cores
from swiftspec.parallel.rendezvous import Joined
from swiftspec.runtime.async_worker import backend, load_for_rank, torchrun_init, worker_entry
from swiftspec.runtime.base import (
    WARMUP_PROMPT,
    Generation,
    GenerationStats,
    RequestState,
    Rounds,
    StartupProfile,
    choose_depth,
)
from swiftspec.runtime.protocol import DistTransport, DraftTree, GroupBroadcast, Profile, Shutdown, Start, Verified
from swiftspec.runtime.supervisor import POLL_S, Limits, Watchdog, WorkerPool
from swiftspec.spec import TreeVerifier
from swiftspec.runtime.trace import CODE, Timeline, TraceFile, request_trace, summarize
from swiftspec.sampling import SamplingParams, make_generator, pick_tokens
from swiftspec.tree import mask_from_parents
from swiftspec.weights import load_tokenizer, model_args, resolve_source

log = logging.getLogger(__name__)
CAUSE_GRACE_S = 1.0  # after a failed message, how long a dying worker's exit may take to show
SHUTDOWN_S = 10.0  # how long close() waits for the workers to exit on Shutdown


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

    def __init__(self, config: EngineConfig, joined: Joined | None = None, target=None) -> None:
        """joined: a draft host already linked through parallel/rendezvous.py (no workers to spawn);
        target: the target model, when the caller has loaded it already (tensor-parallel size 1)."""
        self.config = config
        self.layout = Layout(target_tp=config.target_tp, draft_tp=config.draft_tp)
        self.verify_size = config.tree.verify_size
        self.max_seq_len = config.target_load.max_seq_len
        self.trace: TraceFile | None = None  # set while a caller wants each request's timeline
        self.limits = Limits(load_s=joined.timeout_s) if joined else Limits()
        self._fault: str | None = None  # a request failed with the groups out of step
        self._torchrun = joined.store if joined else torchrun_init(config, self.layout)  # ranks > 0 never return
        self.pool = None if self._torchrun else WorkerPool(worker_entry, self.layout.world_size)
        self.watchdog = Watchdog(self.pool, self.layout.role)
        on_cpu = not config.target_load.device.startswith("cuda")
        cores = (joined and joined.cores) or plan_cores(self.layout, 0, config.draft_cores)
        self.lane = Lane(cores if on_cpu else None, "target")
        self.prefill_lane = self.lane if self.layout.target_tp > 1 else Lane()
        self.target, self.verifier = target, None
        self._closed = False
        try:
            self._launch()
            self.tokenizer = self.target.tokenizer
            if joined is None and config.draft != NO_DRAFT:  # a draft host's tokenizer was checked at its handshake
                self._check_draft()
            self.profile = StartupProfile(depth=config.tree.depth)  # no verify costs while profiling
            if not config.tree.depth:
                self.profile = self._choose_depth()
            self.profile = dataclasses.replace(self.profile, verify_s=self._profile_verify())
            self.limits = self._profile_limits()
        except BaseException:
            self.close()
            raise

    def _check_draft(self) -> None:
        """The draft the workers load must pair with the target (exec.load.check_pair); read from
        its tokenizer and header alone."""
        path = resolve_source(self.config.draft)
        check_pair(self.tokenizer, load_tokenizer(path), self.target.args.vocab_size, model_args(path).vocab_size)

    def _launch(self) -> None:
        """Start the workers and join them. A failed message becomes an EngineFault that names its
        cause; any failure leaves the fault recorded, so that the next recover() tries again."""
        try:
            with self.watchdog.watch("start-up", self.limits.load_s):
                self._start()
        except LinkError as exc:
            raise self._stop_workers(f"the async workers did not start: {self._cause(exc)}") from None
        except Exception as exc:
            self._stop_workers(f"the async workers did not start: {type(exc).__name__}: {exc}")
            raise

    def _start(self) -> None:
        """Spawn the workers, join both groups, load the target (again only when its shards need the
        new tensor-parallel group) and wait until every rank has loaded its model."""
        rendezvous = self._torchrun or self._spawn()
        groups = init_groups(self.layout, 0, backend(self.config), rendezvous, self.limits.load_s)
        if self.target is None or self.layout.target_tp > 1:
            self.target = self.verifier = None  # free the old shard first
            self.target = load_for_rank(self.config.target, self.config.target_load, groups)
        if self.verifier is None:
            self.verifier = TreeVerifier(self.target.model, self.max_seq_len, self.verify_size)
        self.link = DistTransport(self.layout.draft_leader)
        tp_group = groups.parallel.group
        self.followers = GroupBroadcast(tp_group, 0) if self.layout.target_tp > 1 else None  # TP ranks
        all_ready()

    def _spawn(self) -> dist.Store:
        """Start the workers and wait until each has joined the meeting point (a worker that dies
        first fails the start-up at once; init_groups itself cannot be left before its timeout)."""
        store = meeting_point(self.layout.world_size, self.limits.load_s)
        self.pool.spawn(self.config, self.layout, store.port)
        log.info("async workers: %s", ", ".join(f"rank {rank} ({self.layout.role(rank)}) pid {pid}"
                                                for rank, pid in self.pool.pids.items()))
        while joined(store) < self.layout.world_size - 1:
            if self.watchdog.fault is not None:
                raise LinkError("a worker did not join")
            time.sleep(POLL_S)
        return store

    @property
    def fault(self) -> str | None:
        """Why the engine cannot serve until recover() (a worker died or hung); None when it can."""
        return self._fault or self.watchdog.fault

    def recover(self) -> bool:
        """After a fault, restart the workers (raises EngineFault if that fails). True if it restarted."""
        fault = self.fault
        if fault is None:
            return False
        if self.pool is None:
            raise EngineFault(f"{fault}; workers started by torchrun cannot be respawned: restart the job")
        log.warning("restarting the async workers after: %s", fault)
        started = time.perf_counter()
        self.pool.stop(0.0)
        leave_groups()
        self._fault = None
        self.watchdog.clear()
        self._launch()
        log.warning("async workers restarted in %.1f s", time.perf_counter() - started)
        return True

    def generate(
        self,
        prompt: list[int],
        params: SamplingParams,
        max_new_tokens: int,
        should_stop: Callable[[], bool] | None = None,
    ) -> Generation:
        req = RequestState(prompt, max_new_tokens, self.max_seq_len, self.tokenizer.eos_token_ids, should_stop)
        return Generation(self._run(req, prompt, params, self.depth), req.stats)

    @property
    def depth(self) -> int:
        return self.profile.depth

    def _run(self, req: RequestState, prompt: list[int], params: SamplingParams, depth: int) -> Rounds:
        """generate() of a request already set up: fails at once while a fault stands, and turns a
        failure in the middle into a recorded fault."""
        fault = self.fault
        if fault is not None:
            raise EngineFault(f"the async workers are down ({fault}); the engine must recover first")
        try:
            yield from self._generate(req, prompt, params, depth)
        except LinkError as exc:  # only a failed message is a lost contact
            raise self._stop_workers(self._cause(exc)) from None
        except Exception as exc:  # keeps its type and message; the groups are out of step now
            self._stop_workers(f"the last request failed with {type(exc).__name__}: {exc}")
            raise

    def _cause(self, exc: LinkError) -> str:
        """Why a message failed: what the watchdog saw (a worker died or hung), else lost contact."""
        deadline = time.monotonic() + CAUSE_GRACE_S
        while self.watchdog.fault is None and self.pool is not None and time.monotonic() < deadline:
            time.sleep(POLL_S)
        return self.watchdog.fault or f"lost contact with the async workers: {exc}"

    def _stop_workers(self, reason: str) -> EngineFault:
        """Record the fault and kill every worker (recover() starts fresh ones)."""
        self._fault = self._fault or reason
        if self.pool is not None:
            self.pool.kill()
        return EngineFault(reason)

    def _generate(self, req: RequestState, prompt: list[int], params: SamplingParams, depth: int) -> Iterator[list[int]]:
        """Algorithm 1, target side: prefill, start the draft, then verify round after round."""
        timeline, flow = Timeline(), Flow()
        rng = make_generator(params.seed, self.verifier.runner.device)
        limit = self.limits.prefill(len(prompt))  # the first round also waits for the draft's prefill
        with self.watchdog.watch("the prefill", limit):
            first = self._prefill(prompt, params, rng, depth, timeline)
        try:
            out = req.emit(first)
            if out:
                yield out
            while not req.done:
                with self.watchdog.watch("a decode round", limit):
                    emitted, verified = self.step(params, rng, timeline, flow)
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

    def _prefill(self, prompt: list[int], params: SamplingParams, rng: torch.Generator, depth: int,
                 timeline: Timeline) -> list[int]:
        """Prefill the target (its followers too) and pick the first token; Start the draft on it."""
        prompt_t = torch.tensor(prompt, dtype=torch.long)
        if self.followers is not None:
            self.followers.send(Start(prompt=prompt_t, first_token=0, depth=0, params=params))
        with timeline.span("prefill"):
            first = pick_tokens(self.prefill_lane.run(self.verifier.prefill, prompt), params, rng).tolist()  # [1]
        costs = torch.tensor(() if params.reproducible else self.profile.verify_s, dtype=torch.float64)  # [bs] or [0]
        self.link.send(Start(prompt=prompt_t, first_token=first[0], depth=depth, params=params, verify_costs=costs))
        return first

    def step(self, params: SamplingParams, rng: torch.Generator, timeline: Timeline,
             flow: Flow) -> tuple[list[int], Verified]:
        """One round on the target's critical path: receive, then forward, verify, commit (on the lane)."""
        with timeline.span("wait_tree"):
            tree = self.link.recv()  # the draft's best bs-node subtree, grown while we verified
            flow.tree_in_flight = False
        if not isinstance(tree, DraftTree):
            raise EngineFault(f"protocol error: expected a draft tree, got {type(tree).__name__}")
        if self.followers is not None:
            self.followers.send(tree)
        emitted, verified = self.lane.run(self._verify_tree, tree, params, rng, timeline)
        timeline.count(len(emitted), tree.tokens.numel())
        return emitted, verified

    def _verify_tree(self, tree: DraftTree, params: SamplingParams, rng: torch.Generator,
                     timeline: Timeline) -> tuple[list[int], Verified]:
        """Forward the tree, verify it and commit the accepted path: the tokens emitted."""
        with timeline.span("forward"):
            mask = mask_from_parents(tree.parents)  # [n, n]
            dev = self.verifier.runner.device
            logits = self.verifier.forward_tree(tree.tokens.to(dev), tree.depths.to(dev), mask.to(dev))
        with timeline.span("verify"):
            acc = self.verifier.verify(tree.tokens.to(dev), tree.parents.to(dev), logits, params, rng)
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
        with self.watchdog.watch("the end of a request", limit):
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

    def _choose_depth(self) -> StartupProfile:
        """d by profiling: time both sides at d = 1, then keep the faster of floor(t_t/t_d) and +1."""
        prompt = self.tokenizer.encode(WARMUP_PROMPT)
        stats = self._warmup(prompt, 1)
        spans = stats.spans
        t_target = (spans["target"]["spans_s"].get("forward", 0.0)) / max(1, stats.rounds)
        expands = max(1, stats.rounds + 1)
        t_draft = spans["draft"]["spans_s"].get("expand", 0.0) / expands
        depth = choose_depth(t_target, t_draft, lambda d: self._warmup(prompt, d).tokens_per_s, "async")
        return StartupProfile(depth=depth, t_target_s=t_target, t_draft_s=t_draft)

    def _profile_verify(self) -> tuple[float, ...]:
        """Seconds to verify 1..bs nodes, which the draft weighs against each node's chance
        (TreeConfig.adaptive_verify; spec/costs.py).  Only a lone target leader can time its
        forwards alone (tensor-parallel followers mirror every forward): otherwise (), all bs."""
        if not self.config.tree.adaptive_verify or self.layout.target_tp > 1:
            return ()
        best = self.lane.run(self.verifier.verify_times, self.tokenizer.encode(WARMUP_PROMPT), self.verify_size)
        log.info("async: verifying 1..%d nodes takes %s ms", len(best), " ".join(f"{1e3 * s:.1f}" for s in best))
        return tuple(best)

    def _profile_limits(self) -> Limits:
        """Hang limits from a warm-up at the chosen d (the second of two: the first pays one-time
        costs): seconds per decode round and per prompt token."""
        prompt = self.tokenizer.encode(WARMUP_PROMPT)
        stats = [self._warmup(prompt, self.depth) for _ in range(2)][-1]
        round_s = (stats.total_s - stats.ttft_s) / max(1, stats.rounds)
        limits = Limits.profiled(round_s, stats.ttft_s / stats.prompt_tokens, self.config.worker_timeout)
        log.info("async: %.1f ms per round; a round that takes over %.1f s means a hung worker",
                 1e3 * round_s, limits.round_s)
        return limits

    def _warmup(self, prompt: list[int], depth: int) -> GenerationStats:
        """Run a 24-token greedy request at d = depth; its stats."""
        req = RequestState(prompt, 24, self.max_seq_len, self.tokenizer.eos_token_ids)
        for _ in self._run(req, prompt, SamplingParams(), depth):
            pass
        return req.stats

    def close(self) -> None:
        """Shut the workers down (killed if they are out of step or slow to exit); leave the groups."""
        if self._closed:
            return
        self._closed = True
        healthy = self.target is not None and self.fault is None
        self.watchdog.close()
        if healthy:
            with contextlib.suppress(LinkError):
                self.link.send(Shutdown())
                if self.followers is not None:
                    self.followers.send(Shutdown())
                self.link.flush()
        if self.pool is not None:
            self.pool.stop(SHUTDOWN_S if healthy else 0.0)
            self.pool.close()
        self.lane.close()
        leave_groups()
