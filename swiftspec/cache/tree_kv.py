"""Slot bookkeeping for the tree-aware KV cache: a contiguous prefix region, then a tree region.

Layout of one KVCache (slots along the sequence axis):

    [0, prefix_len)                       KV of verified tokens, in order
    [prefix_len, prefix_len + tree_len)   KV of live tree nodes (any order; node_slot says where)

`text` names the token of every prefix slot, so that the next request can keep the KV of the prefix it
shares with this one (ModelRunner.prefill): prefix slot i holds the KV of text[i], at position i.

Commit moves the KV of newly verified nodes into the next prefix slots; compaction moves the
surviving subtree's KV up to sit right after the new prefix. Nothing still valid is recomputed.
"""

from __future__ import annotations

import torch

from swiftspec.cache.kv_cache import KVCache
from swiftspec.tree import Reroot, TokenTree


class TreeKV:
    """Which cache slot holds the KV of each verified token and each tree node."""

    def __init__(self, cache: KVCache, max_nodes: int) -> None:
        self.cache = cache
        self.max_nodes = max_nodes
        self.prefix_len = 0
        self.tree_len = 0
        self.text: list[int] = []  # the token of each prefix slot: len(text) == prefix_len
        # exact reuse (ModelRunner.prefill): the leading slots whose KV a cold prefill of any prompt
        # that starts with them computes with the same bits (rows of prefill calls; without
        # ModelRunner.any_prefix, whole chunks), and the length of
        # the prompt whose every slot, its last chunk's too, still holds what its prefill computed
        self.cold = 0
        self.whole = 0
        # node_slot[i]: absolute slot of tree node i's KV, -1 when the node has none yet.
        self.node_slot = torch.full((max_nodes,), -1, dtype=torch.long, device=cache.k.device)  # [max_nodes]

    @property
    def kv_len(self) -> int:
        """Slots in use: every attention reads cache slots [0, kv_len)."""
        return self.prefix_len + self.tree_len

    def reset(self, prefix_len: int = 0) -> None:
        """Forget the tree (and keep the first prefix_len verified tokens)."""
        if prefix_len > self.prefix_len:
            raise RuntimeError(f"cannot keep {prefix_len} prefix tokens of {self.prefix_len}")
        self.prefix_len = prefix_len
        del self.text[prefix_len:]
        self.cold = min(self.cold, prefix_len)
        self.whole = self.whole if prefix_len >= self.whole else 0
        self.tree_len = 0
        self.node_slot.fill_(-1)

    def adopt(self, text: list[int], cold: int) -> None:
        """The prefix slots [0, len(text)) now hold the KV of text (copied in by the caller), the
        first `cold` of them as a cold prefill computes them; no tree."""
        self.reset(0)
        self.prefix_len = len(text)
        self.text = list(text)
        self.cold = cold

    def append_prefix(self, tokens: list[int]) -> torch.Tensor:
        """Slots for verified tokens appended to the prefix; the tree region must be empty."""
        if self.tree_len:
            raise RuntimeError("append_prefix needs an empty tree region")
        n = len(tokens)
        slots = torch.arange(self.prefix_len, self.prefix_len + n, device=self.node_slot.device)  # [n]
        self.prefix_len += n
        self.text += tokens
        return slots

    def alloc(self, nodes: torch.Tensor) -> torch.Tensor:
        """Give tree nodes [n] the next free tree slots; returns those slots [n]."""
        n = nodes.numel()
        if self.kv_len + n > self.cache.max_len:
            raise RuntimeError("KV cache is full")
        slots = torch.arange(self.kv_len, self.kv_len + n, device=self.node_slot.device)  # [n]
        self.node_slot[nodes] = slots
        self.tree_len += n
        return slots

    def commit(self, path: torch.Tensor, tokens: list[int], survivors_old: torch.Tensor,
               survivors_new: torch.Tensor) -> None:
        """Make path nodes [m] verified prefix (in order) and keep survivors [e] as the new tree.

        path: old node indices whose KV becomes the next m prefix slots (all must have KV);
        tokens: their m tokens.
        survivors_old / survivors_new: old and new node indices of surviving nodes that have KV.
        Everything else in the tree region is dropped.
        """
        m, e = path.numel(), survivors_old.numel()
        src = torch.cat([self.node_slot[path], self.node_slot[survivors_old]])  # [m + e]
        dst = torch.arange(self.prefix_len, self.prefix_len + m + e, device=src.device)  # [m + e]
        self.cache.move(src, dst)  # gather-then-scatter: overlapping and identity moves are safe
        self.node_slot.fill_(-1)
        self.node_slot[survivors_new] = dst[m:]
        self.prefix_len += m
        self.text += tokens
        self.tree_len = e

    def reroot(self, tree: TokenTree, step: Reroot, emitted: list[int]) -> list[int]:
        """Apply a re-rooting of `tree` after `emitted` was verified: the walked path's KV becomes
        prefix, the new root's subtree is compacted behind it, the rest is dropped.

        Returns the verified tokens (excluding the new root) whose KV was never computed, in
        order: the walked nodes that were never expanded (a trailing run: an unexpanded leaf, or
        grafted lookup nodes), plus any emitted tokens the walk could not follow. The caller
        recomputes exactly these.
        """
        path = step.path  # [m] old root .. last walked node before the new root
        has_kv = tree.expanded[path]  # nodes are expanded ancestors first: only a trailing run lacks KV
        missing = tree.tokens[path[~has_kv]].tolist() + list(emitted[path.numel() - 1 : -1])
        if step.tree is None:
            survivors_old = path[:0]
        else:
            survivors_old = torch.nonzero((step.index_map >= 0) & tree.expanded).flatten()
        kept = path[has_kv]
        self.commit(kept, tree.tokens[kept].tolist(), survivors_old, step.index_map[survivors_old])
        return missing
