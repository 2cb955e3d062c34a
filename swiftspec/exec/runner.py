"""A loaded model with its static KV cache: one forward call over explicit tokens, slots and mask."""

from __future__ import annotations

import torch

from swiftspec import kernels
from swiftspec.cache.kv_cache import KVCache
from swiftspec.cache.tree_kv import TreeKV

PREFILL_CHUNK = 256  # prompt tokens per prefill forward


def causal_mask(start: int, n: int, device: torch.device | str) -> torch.Tensor:
    """[n, start + n] bool: token i (at slot start + i) sees every slot <= start + i."""
    cols = torch.arange(start + n, device=device)
    rows = torch.arange(start, start + n, device=device)
    return cols[None, :] <= rows[:, None]


class ModelRunner:
    """Owns a model and its KV cache; every attention reads slots [0, mask.shape[1])."""

    def __init__(self, model: torch.nn.Module, max_len: int, max_nodes: int,
                 head: torch.Tensor | None = None) -> None:
        self.model = model
        self.cache: KVCache = model.new_cache(max_len)
        self.device = self.cache.k.device
        self.kv = TreeKV(self.cache, max_nodes)
        self.head = head  # [V', H] (or packed) rows of a pruned LM head; None = the model's own
        # a pruned head's extension: packed rows [R, H] (or None) and the columns [E] of its logits
        # that score E more tokens after the pruned head's (kernels.select_tiles)
        self.extra: tuple[kernels.PackedWeight, torch.Tensor] | None = None
        self.graphs = None  # CUDA: a runtime.cuda_graph.GraphRunner replaying captured shapes

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, H] -> float32 logits [T, V] (or [T, V' + E] over a pruned head's rows and the extra rows)."""
        if self.head is None:
            return self.model.logits(hidden)
        logits = kernels.linear(hidden, self.head).float()  # [T, V']
        if self.extra is None:
            return logits
        rows, cols = self.extra
        return torch.cat([logits, kernels.linear(hidden, rows)[:, cols].float()], dim=-1)  # [T, V' + E]

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64
        slots: torch.Tensor,  # [T] int64, cache slots receiving the new KV
        mask: torch.Tensor,  # [T, S] bool, True = may attend to slot
        rows: torch.Tensor | None = None,  # [R] rows whose logits are wanted (default: all)
    ) -> torch.Tensor:
        """Logits [R, V] float32."""
        if self.graphs is not None and self.graphs.covers(tokens.numel(), mask.shape[1]):
            return self.graphs.forward(tokens, positions, slots, mask, rows)
        hidden = self.model(tokens, positions, self.cache, slots, mask)  # [T, H]
        if rows is not None:
            hidden = hidden[rows]
        return self.logits(hidden)

    def extend(self, tokens: list[int]) -> torch.Tensor:
        """Append verified tokens to the prefix (tree must be empty); logits of the last one [1, V].

        The same call serves a prompt's prefill and a one-token decode step.  A long prompt runs in
        chunks of PREFILL_CHUNK tokens, so that no mask or attention buffer grows with its square."""
        for start in range(0, len(tokens) - PREFILL_CHUNK, PREFILL_CHUNK):
            self._append(tokens[start : start + PREFILL_CHUNK])
        rest = tokens[(len(tokens) - 1) // PREFILL_CHUNK * PREFILL_CHUNK :]
        return self._append(rest, logits=True)

    @torch.inference_mode()
    def _append(self, tokens: list[int], logits: bool = False) -> torch.Tensor | None:
        """Run tokens [T] at the next prefix slots; the last one's logits [1, V] if asked."""
        start = self.kv.prefix_len
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)  # [T]
        slots = self.kv.append_prefix(len(tokens))  # [T]
        mask = causal_mask(start, len(tokens), self.device)  # [T, start + T]
        if not logits:
            self.model(ids, slots, self.cache, slots, mask)
            return None
        return self.forward(ids, slots, slots, mask, rows=torch.tensor([len(tokens) - 1], device=self.device))
