"""Serial speculative decoding: draft and target take turns (chain and SpecExec-style tree modes)."""

from __future__ import annotations

import time
from typing import Callable, Iterator

import torch

from swiftspec.config import TreeConfig
from swiftspec.draft import TreeDrafter
from swiftspec.runtime.base import GenerationStats, RequestState
from swiftspec.runtime.target import TreeVerifier
from swiftspec.sampling import SamplingParams, make_generator, pick_tokens

# d when --depth is 0.  Measured on the default pair, 2 CPU cores, 3 HumanEval prompts: bf16
# target and draft d=3: 9.7, d=5: 10.7 tok/s; bf16 target + int8 draft d=5: 16.7, d=7: 12.8;
# int4 target and draft (10 prompts): d=3: 28, d=4: 24.
# (The paper's floor(t_target / t_draft) rule is for the async engine, where drafting overlaps
# verification; serially it picks d=7 here.)
SERIAL_DEPTH = 5


class SerialEngine:
    """Each round: d draft expansions, one target forward over the best bs-node subtree, re-root."""

    def __init__(self, target, drafter: TreeDrafter, cfg: TreeConfig, max_seq_len: int) -> None:
        self.cfg = cfg
        self.target = TreeVerifier(target.model, max_seq_len, cfg.verify_size)
        self.drafter = drafter
        self.tokenizer = target.tokenizer
        self.max_seq_len = max_seq_len
        self.stats = GenerationStats()
        self.depth = cfg.depth or SERIAL_DEPTH

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
        self.drafter.draft(self.depth)  # d forwards of the w best leaves
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
