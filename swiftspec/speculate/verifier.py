"""The target side: prefill, one forward over a draft subtree with its tree mask, verify, commit."""

from __future__ import annotations

import time
from typing import Callable

import torch

from swiftspec.cache.prompt_store import PromptStore
from swiftspec.runner.cuda_graph import attach
from swiftspec.runner.model_runner import ModelRunner, Prefill
from swiftspec.sampling import Draws, SamplingParams
from swiftspec.verify import Acceptance, verify_greedy, verify_sampled

VERIFY_PROFILE_RUNS = 2  # timed passes over the verification sizes (after an untimed one); the best counts


class TreeVerifier:
    """Owns the target model's cache. Its tree region only ever holds the subtree being verified."""

    def __init__(self, model: torch.nn.Module, max_seq_len: int, verify_size: int,
                 store: PromptStore | None = None) -> None:
        """store: the prompt cache's earlier texts (None: only the last text's KV is kept)."""
        self.runner = ModelRunner(model, max_seq_len + verify_size + 1, max_nodes=verify_size, store=store, exact=True)
        attach(self.runner, (verify_size,))  # CUDA graphs for the verification shape (no-op on CPU)
        self.nodes = torch.zeros(0, dtype=torch.long)  # [n] tokens of the subtree in the tree region

    def prefill(self, prompt: list[int], reuse: bool = True, stop: Callable[[], bool] | None = None) -> Prefill | None:
        """Compute the KV of the prompt's tokens that the prompt cache does not hold (reuse=False:
        of all of them); the logits after its last token.  None once stop() said so between chunks."""
        return self.runner.prefill(prompt, reuse, stop)

    def forward_tree(self, tokens: torch.Tensor, depths: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Target logits [n, V] for subtree nodes tokens [n] (root first) with ancestor mask [n, n].

        The root is the last verified token: its KV is computed here, never before.
        """
        kv = self.runner.kv
        n = tokens.numel()
        self.nodes = tokens
        slots = kv.alloc(torch.arange(n, device=tokens.device))  # [n]
        seen = torch.ones(n, kv.prefix_len, dtype=torch.bool, device=tokens.device)  # the prefix
        full_mask = torch.cat([seen, mask], dim=1)  # [n, prefix_len + n]
        return self.runner.forward(tokens, kv.prefix_len + depths, slots, full_mask)

    def verify(self, tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, logits: torch.Tensor,
               params: SamplingParams, draws: Draws) -> Acceptance:
        """Accept a path of the subtree tokens [n] (parents, depths [n]; the leader decides, `commit`
        then keeps its KV): greedy, or the target's position-keyed draws (verify_sampled).  The
        token after a node at depth k sits at position prefix_len + k + 1 (the root at prefix_len)."""
        if params.greedy:
            return verify_greedy(tokens, parents, logits)
        n = tokens.shape[0]
        uniforms = draws.uniforms(self.runner.kv.prefix_len + 1, n, logits.device)[depths]  # [n]
        return verify_sampled(tokens, parents, logits, params, uniforms)

    def commit(self, accepted: torch.Tensor) -> None:
        """Move the KV of accepted subtree nodes [a+1] (root first) into the prefix."""
        empty = accepted[:0]
        self.runner.kv.commit(accepted, self.nodes[accepted].tolist(), empty, empty)

    def verify_times(self, prompt: list[int], size: int) -> list[float]:
        """Seconds to verify n = 1..size nodes (the target forward and greedy verification of a
        chain after `prompt`, prefilled here): the best of VERIFY_PROFILE_RUNS passes over the
        sizes, after one untimed size-node verification pays the one-time costs."""
        self.prefill(prompt, reuse=False)
        self._time_verify(prompt, size)
        passes = [[self._time_verify(prompt, n) for n in range(1, size + 1)] for _ in range(VERIFY_PROFILE_RUNS)]
        return [min(times) for times in zip(*passes)]

    def _time_verify(self, prompt: list[int], n: int) -> float:
        """Seconds to verify a chain of n prompt tokens after the prefilled prefix, then drop it."""
        kv, device = self.runner.kv, self.runner.device
        tokens = torch.tensor((prompt * n)[:n], device=device)  # [n]
        chain = torch.arange(n, device=device)  # [n]: depths, and parents + 1
        mask = torch.ones(n, n, dtype=torch.bool, device=device).tril()  # [n, n]
        t = time.perf_counter()
        logits = self.forward_tree(tokens, chain, mask)
        self.verify(tokens, chain - 1, chain, logits, SamplingParams(), Draws(0)).tokens.tolist()  # waits
        elapsed = time.perf_counter() - t
        kv.reset(kv.prefix_len)  # drop the nodes
        return elapsed
