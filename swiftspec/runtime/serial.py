"""Serial speculative decoding: draft and target take turns (chain and SpecExec-style tree modes)."""

from __future__ import annotations

import time
from typing import Callable, Iterator

import torch

from swiftspec.config import TreeConfig
from swiftspec.draft import TreeDrafter
from swiftspec.runtime.base import WARMUP_PROMPT, GenerationStats, RequestState, log, serial_depth
from swiftspec.runtime.target import TreeVerifier
from swiftspec.sampling import SamplingParams, make_generator, pick_tokens

PROFILE_DEPTH = 2  # d of the start-up warm-up that times one expansion and one verification


class SerialEngine:
    """Each round: d draft expansions, one target forward over the best bs-node subtree, re-root."""

    def __init__(self, target, drafter: TreeDrafter, cfg: TreeConfig, max_seq_len: int) -> None:
        self.cfg = cfg
        self.target = TreeVerifier(target.model, max_seq_len, cfg.verify_size)
        self.drafter = drafter
        self.tokenizer = target.tokenizer
        self.max_seq_len = max_seq_len
        self.stats = GenerationStats()
        self.depth = cfg.depth or self._profile_depth()

    def _profile_depth(self) -> int:
        """Time a short warm-up at d = PROFILE_DEPTH (the second of two: the first pays one-time
        costs), then serial_depth (logged)."""
        self.depth = PROFILE_DEPTH
        prompt = self.tokenizer.encode(WARMUP_PROMPT)
        for _ in range(2):
            for _ in self.generate(prompt, SamplingParams(), 16):
                pass
        rounds = max(1, self.stats.rounds)
        t_verify, t_expand = self.stats.verify_s / rounds, self.stats.draft_s / (PROFILE_DEPTH * rounds)
        depth = serial_depth(t_verify, t_expand, self.cfg.verify_size)
        log.warning("tree: t_target %.1f ms, t_draft %.1f ms per expansion; using d=%d",
                    1e3 * t_verify, 1e3 * t_expand, depth)
        return depth

    def generate(
        self,
        prompt: list[int],
        params: SamplingParams,
        max_new_tokens: int,
        should_stop: Callable[[], bool] | None = None,
    ) -> Iterator[list[int]]:
        req = RequestState(prompt, max_new_tokens, self.max_seq_len, self.tokenizer.eos_token_ids, should_stop)
        self.stats = req.stats
        rng = make_generator(params.seed, self.target.runner.device)
        first = pick_tokens(self.target.prefill(prompt), params, rng).tolist()  # [1]
        out = req.emit(first)
        if out:
            yield out
        if req.done:
            return
        self.drafter.start(prompt, first[0], params)
        while not req.done:
            out = req.emit(self.step(params, rng, req.stats))
            if out:
                yield out

    def step(self, params: SamplingParams, rng: torch.Generator, stats: GenerationStats) -> list[int]:
        """One round, as named steps; returns the emitted tokens (accepted + bonus)."""
        t0 = time.perf_counter()
        self.drafter.draft(self.depth, focus=self.cfg.verify_size)  # <= d forwards of the w best leaves
        sub = self.drafter.subtree(self.cfg.verify_size)  # best bs nodes at the root
        t1 = time.perf_counter()
        logits = self.target.forward_tree(sub.tokens, sub.depths, sub.mask)  # [bs, V]
        acc = self.target.verify(sub.tokens, sub.parents, logits, params, rng)
        emitted = acc.tokens.tolist()  # the one host sync of the round
        self.target.commit(acc.path[: len(emitted)])
        t2 = time.perf_counter()
        self.drafter.advance(emitted)  # re-root, commit the path, compact the survivors
        stats.draft_s += (t1 - t0) + (time.perf_counter() - t2)
        stats.verify_s += t2 - t1
        stats.rounds += 1
        stats.accept_lengths.append(len(emitted))
        return emitted

    def close(self) -> None:
        self.target = self.drafter = None
