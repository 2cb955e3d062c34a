"""SwiftSpec's asynchronous, disaggregated engine (paper Algorithm 1), front end = target leader.

This process is global rank 0: it leads the target group, verifies and decides every token.
`generate --mode async` spawns the other ranks itself (draft group, target followers); under
torchrun the same entry point reads RANK/WORLD_SIZE/MASTER_ADDR and ranks > 0 run worker loops.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import sys
import threading
import time
from typing import Callable, Iterator

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from swiftspec.config import NO_DRAFT, EngineConfig, LoadConfig
from swiftspec.errors import UserError
from swiftspec.parallel.groups import Groups, Layout, init_groups, pin, pinned, plan_cores
from swiftspec.runtime.base import WARMUP_PROMPT, GenerationStats, RequestState, choose_depth
from swiftspec.runtime.protocol import DistTransport, DraftTree, GroupBroadcast, Profile, Shutdown, Start, Verified
from swiftspec.runtime.target import TreeVerifier
from swiftspec.tree import mask_from_parents
from swiftspec.runtime.trace import CODE, Timeline, summarize, write_json
from swiftspec.sampling import SamplingParams, make_generator, pick_tokens

INIT_TIMEOUT_S = 600.0  # loading a model on a busy machine can take minutes


class WorkerFailure(UserError):
    """A worker process died; the engine cannot continue."""


class AsyncEngine:
    """Target leader: receives subtrees, verifies them, sends back the verified tokens."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.layout = Layout(target_tp=config.target_tp, draft_tp=config.draft_tp)
        self.verify_size = config.tree.verify_size
        self.stats = GenerationStats()
        self.trace_summary: dict = {}
        self._closing = False
        init_method = _torchrun_init(config, self.layout) or self._spawn_workers()
        self.groups = init_groups(self.layout, 0, _backend(config), init_method, INIT_TIMEOUT_S)
        target = _load_for_rank(config.target, config.target_load, self.groups)
        self.cores = plan_cores(self.layout, 0, config.draft_cores)  # pinned only inside generate()
        # The draft idles while the target prefills: a lone target leader may use every core then.
        self.prefill_cores = sorted(os.sched_getaffinity(0)) if self.layout.target_tp == 1 else self.cores
        self.tokenizer = target.tokenizer
        self.max_seq_len = config.target_load.max_seq_len
        self.verifier = TreeVerifier(target.model, self.max_seq_len, self.verify_size)
        self.on_cpu = self.verifier.runner.device.type == "cpu"
        self.link = DistTransport(self.layout.draft_leader)
        group = self.groups.parallel.group
        self.followers = GroupBroadcast(group, 0) if self.layout.target_tp > 1 else None  # TP ranks
        self.depth = config.tree.depth or self._choose_depth()

    def _spawn_workers(self) -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            init_method = f"tcp://127.0.0.1:{s.getsockname()[1]}"
        self.workers = mp.start_processes(_worker_entry, args=(self.config, self.layout, init_method),
                                          nprocs=self.layout.world_size - 1, join=False, start_method="spawn")
        threading.Thread(target=self._watchdog, daemon=True, name="swiftspec-watchdog").start()
        return init_method

    def _watchdog(self) -> None:
        """A dead worker ends the whole command with a clear error instead of a hang."""
        while not self._closing:
            for index, proc in enumerate(self.workers.processes):
                if not proc.is_alive() and not self._closing:
                    rank = index + 1
                    print(f"error: async worker rank {rank} ({self.layout.role(rank)} group) died "
                          f"(exit code {proc.exitcode}); stopping", file=sys.stderr, flush=True)
                    for other in self.workers.processes:
                        other.kill()
                    os._exit(3)
            time.sleep(0.2)

    def generate(
        self,
        prompt: list[int],
        params: SamplingParams,
        max_new_tokens: int,
        should_stop: Callable[[], bool] | None = None,
        depth: int | None = None,
    ) -> Iterator[list[int]]:
        req = RequestState(prompt, max_new_tokens, self.max_seq_len, self.tokenizer.eos_token_ids, should_stop)
        self.stats = req.stats
        try:
            with pinned(self.cores) if self.on_cpu else contextlib.nullcontext():
                yield from self._generate(req, prompt, params, depth or self.depth)
        except RuntimeError as exc:  # gloo/NCCL: a peer closed its connection or timed out
            raise self._failure(exc) from None

    def _failure(self, exc: Exception) -> WorkerFailure:
        """Stop every worker and name the one that died (or the communication error)."""
        self._closing = True
        time.sleep(0.5)  # let a dying worker's exit code settle
        procs = self.workers.processes if hasattr(self, "workers") else []
        dead = [(i + 1, p.exitcode) for i, p in enumerate(procs) if not p.is_alive()]
        for proc in procs:
            proc.kill()
        if dead:
            rank, code = dead[0]
            return WorkerFailure(f"async worker rank {rank} ({self.layout.role(rank)} group) died "
                                 f"(exit code {code}); generation stopped")
        return WorkerFailure(f"lost contact with the async workers: {str(exc).splitlines()[0]}")

    def _generate(self, req: RequestState, prompt: list[int], params: SamplingParams, depth: int) -> Iterator[list[int]]:
        """Algorithm 1, target side: prefill, start the draft, then verify round after round."""
        timeline = Timeline()
        rng = make_generator(params.seed, self.verifier.runner.device)
        prompt_t = torch.tensor(prompt, dtype=torch.long)
        if self.followers is not None:
            self.followers.send(Start(prompt=prompt_t, first_token=0, depth=0, params=params))
        with pinned(self.prefill_cores) if self.on_cpu else contextlib.nullcontext():
            first = pick_tokens(self.verifier.prefill(prompt), params, rng).tolist()  # [1]
        self.link.send(Start(prompt=prompt_t, first_token=first[0], depth=depth, params=params))
        self._tree_in_flight, stop_sent = True, False
        try:
            out = req.emit(first)
            if out:
                yield out
            while not req.done:
                emitted, verified = self.step(params, rng, timeline)
                out = req.emit(emitted)
                stop_sent = req.done
                self._send_verified(dataclasses.replace(verified, stop=req.done), timeline)
                self._tree_in_flight = not req.done
                req.stats.rounds += 1
                req.stats.accept_lengths.append(len(emitted))
                if out:
                    yield out
        finally:  # also when the consumer abandons the stream: leave both groups idle and in step
            if self._tree_in_flight:
                self.link.recv()
            if not stop_sent:
                empty = torch.zeros(0, dtype=torch.long)
                self._send_verified(Verified(tokens=empty, nodes=empty, stop=True), timeline)
            self._finish(timeline, req.stats)

    def step(self, params: SamplingParams, rng: torch.Generator, timeline: Timeline) -> tuple[list[int], Verified]:
        """One round on the target's critical path: receive, forward, verify, commit."""
        with timeline.span("wait_tree"):
            tree = self.link.recv()  # the draft's best bs-node subtree, grown while we verified
            self._tree_in_flight = False
        if not isinstance(tree, DraftTree):
            raise WorkerFailure(f"protocol error: expected a draft tree, got {type(tree).__name__}")
        if self.followers is not None:
            self.followers.send(tree)
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

    def _send_verified(self, verified: Verified, timeline: Timeline) -> None:
        with timeline.span("send_verified"):
            self.link.send(verified)
            if self.followers is not None:
                self.followers.send(verified)

    def _finish(self, timeline: Timeline, stats: GenerationStats) -> None:
        """The draft reports its busy time and spans once the request stops."""
        reply = self.link.recv()
        if not isinstance(reply, Profile):
            raise WorkerFailure(f"protocol error: expected the draft's report, got {type(reply).__name__}")
        stats.draft_s = reply.seconds
        stats.verify_s = sum(e - s for c, s, e in timeline.events if c in (CODE["forward"], CODE["verify"]))
        target_ev = timeline.as_tensor()
        self.trace_summary = summarize(target_ev, reply.events)
        if self.config.trace:
            write_json(self.config.trace, target_ev, reply.events)

    def _choose_depth(self) -> int:
        """d by profiling: time both sides at d = 1, then keep the faster of floor(t_t/t_d) and +1."""
        prompt = self.tokenizer.encode(WARMUP_PROMPT)
        self._warmup(prompt, 1)
        spans = self.trace_summary
        t_target = (spans["target"]["spans_s"].get("forward", 0.0)) / max(1, self.stats.rounds)
        expands = max(1, self.stats.rounds + 1)
        t_draft = spans["draft"]["spans_s"].get("expand", 0.0) / expands
        return choose_depth(t_target, t_draft, lambda d: self._warmup(prompt, d), "async")

    def _warmup(self, prompt: list[int], depth: int) -> float:
        for _ in self.generate(prompt, SamplingParams(), 24, depth=depth):
            pass
        return self.stats.tokens_per_s

    def close(self) -> None:
        if self._closing:
            if dist.is_initialized():
                dist.destroy_process_group()
            return
        self._closing = True
        self.link.send(Shutdown())
        if self.followers is not None:
            self.followers.send(Shutdown())
        workers = self.workers.processes if hasattr(self, "workers") else []
        for proc in workers:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
        dist.destroy_process_group()


def _backend(config: EngineConfig) -> str:
    """Messages between groups are small CPU tensors (gloo); tensor parallelism on GPU uses NCCL."""
    return "cpu:gloo,cuda:nccl" if config.target_load.device.startswith("cuda") else "gloo"


def _torchrun_init(config: EngineConfig, layout: Layout) -> str | None:
    """Under torchrun, join through its environment; ranks > 0 serve as workers, then exit."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    if int(os.environ["WORLD_SIZE"]) != layout.world_size:
        raise UserError(f"torchrun started {os.environ['WORLD_SIZE']} ranks; --target-tp + --draft-tp "
                        f"needs {layout.world_size}")
    rank = int(os.environ["RANK"])
    if rank:
        run_worker(config, layout, rank, "env://")
        sys.exit(0)
    return "env://"


def _load_for_rank(source: str, load: LoadConfig, groups: Groups):
    """Load this rank's shard of the model, on its own GPU when on CUDA."""
    from swiftspec.weights import load_model

    if load.device.startswith("cuda"):
        device = f"cuda:{groups.rank % torch.cuda.device_count()}"
        torch.cuda.set_device(device)
        load = dataclasses.replace(load, device=device)
    if groups.role == "target":
        from swiftspec.runtime import load_target

        return load_target(source, load, groups.parallel)
    return load_model(source, load, groups.parallel)


def _worker_entry(index: int, config: EngineConfig, layout: Layout, init_method: str) -> None:
    """A spawned rank (index + 1): die with the front end, join the groups, serve until Shutdown."""
    _die_with_parent()
    run_worker(config, layout, index + 1, init_method)


def run_worker(config: EngineConfig, layout: Layout, rank: int, init_method: str) -> None:
    from swiftspec.runtime.async_worker import GroupIO, draft_loop, target_follower_loop

    groups = init_groups(layout, rank, _backend(config), init_method, INIT_TIMEOUT_S)
    on_cpu = not config.target_load.device.startswith("cuda")
    all_cores = sorted(os.sched_getaffinity(0))
    if on_cpu:
        pin(plan_cores(layout, rank, config.draft_cores))
    group = GroupBroadcast(groups.parallel.group, groups.leader) if groups.parallel.tp_size > 1 else None
    link = DistTransport(groups.peer_leader) if groups.is_leader else None
    io = GroupIO(link, group)
    if groups.role == "draft":
        drafter = _make_drafter(config, groups)
        # The target waits while a lone draft rank prefills the prompt: it may use every core then.
        draft_loop(drafter, io, config.tree.verify_size, all_cores if on_cpu and layout.draft_tp == 1 else None)
    else:
        target = _load_for_rank(config.target, config.target_load, groups)
        target_follower_loop(TreeVerifier(target.model, config.target_load.max_seq_len, config.tree.verify_size), io)
    dist.destroy_process_group()


def _make_drafter(config: EngineConfig, groups: Groups):
    """The draft group's drafter: over the draft model, or prompt lookup alone (--draft-model none)."""
    from swiftspec.draft import LookupDrafter, build_drafter

    if config.draft == NO_DRAFT:
        return LookupDrafter(config.tree)
    draft = _load_for_rank(config.draft, config.draft_load, groups)
    return build_drafter(draft, config.tree, config.target_load.max_seq_len, config.draft_vocab,
                         config.draft_load.weights)


def _die_with_parent() -> None:
    """Linux: SIGKILL this worker when the front end exits, so no orphan survives it."""
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass
