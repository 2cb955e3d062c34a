"""The prompt cache's store: copies of the KV of earlier texts (prompt and output) of one model, for
later requests that begin with part of one; bounded in bytes, the least recently used out first.

The live KV cache is the first place a request looks (ModelRunner.prefill keeps the prefix it shares
with the previous text); the store holds the texts that a request overwrote, so that two files or two
conversations taken in turn both find theirs.  An entry that begins another one is redundant and
leaves the store, so a chat's turns keep one entry, its latest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from swiftspec.cache.kv_cache import KVCache

MIN_ENTRY_TOKENS = 16  # shorter texts cost more to copy and look up than they save


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of token arrays a [n] and b [m]."""
    n = min(a.size, b.size)
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


@dataclass(eq=False, slots=True)
class StoredText:
    """One text's tokens and the KV of each of them, as copies."""

    tokens: np.ndarray  # [n] int64
    k: torch.Tensor  # [L, n, Hkv, D]
    v: torch.Tensor  # [L, n, Hkv, D]
    cold: int = 0  # leading tokens whose KV is a cold prefill's, bit for bit (TreeKV.cold)
    used: int = 0  # the store's clock at its last use

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


@dataclass(frozen=True, slots=True)
class Match:
    """The stored text that shares the most leading tokens with a prompt, and how many."""

    entry: StoredText | None
    length: int


@dataclass(slots=True)
class StoreStats:
    """Counters for `swiftspec info` and /metrics."""

    lookups: int = 0  # prefills that asked the store
    hits: int = 0  # ... and took a stored text's KV
    saved: int = 0  # texts copied in
    evicted: int = 0  # texts dropped for room (redundant ones not counted)


@dataclass(eq=False)
class PromptStore:
    """Stored texts of one model, at most budget_bytes of KV in all."""

    budget_bytes: int
    entries: list[StoredText] = field(default_factory=list)
    stats: StoreStats = field(default_factory=StoreStats)
    _clock: int = 0

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries)

    def match(self, prompt: np.ndarray, usable=lambda entry, n: n, count: bool = True) -> Match:  # noqa: ANN001
        """The entry sharing the longest prefix with prompt [n] (None if none shares a token);
        usable(entry, n): how much of a shared prefix of n tokens may be kept.  count=False: an
        estimate, not a lookup (safe from another thread: it reads a copy of the list of entries)."""
        self.stats.lookups += count
        best = Match(None, 0)
        for entry in list(self.entries):
            n = usable(entry, common_prefix(entry.tokens, prompt))
            if n > best.length:
                best = Match(entry, n)
        return best

    def load(self, match: Match, cache: KVCache) -> None:
        """Copy the KV of the match's first match.length tokens into cache slots [0, length)."""
        n = match.length
        cache.k[:, :n].copy_(match.entry.k[:, :n])
        cache.v[:, :n].copy_(match.entry.v[:, :n])
        self.stats.hits += 1
        self._touch(match.entry)

    def save(self, text: list[int], cache: KVCache, cold: int = 0) -> None:
        """Copy the KV of text (held in cache slots [0, len(text))) in, unless a stored text begins
        with it; stored texts that it begins with are dropped, then the oldest until it fits."""
        tokens = np.asarray(text, dtype=np.int64)
        per_token = 2 * cache.k[:, :1].nbytes
        if tokens.size < MIN_ENTRY_TOKENS or tokens.size * per_token > self.budget_bytes:
            return
        for entry in self.entries:
            if entry.tokens.size >= tokens.size and common_prefix(entry.tokens, tokens) == tokens.size:
                self._touch(entry)
                return
        self.entries = [e for e in self.entries if common_prefix(e.tokens, tokens) < e.tokens.size]
        while self.entries and self.nbytes + tokens.size * per_token > self.budget_bytes:
            self.entries.remove(min(self.entries, key=lambda e: e.used))
            self.stats.evicted += 1
        n = tokens.size
        entry = StoredText(tokens, cache.k[:, :n].clone(), cache.v[:, :n].clone(), cold)
        self.entries.append(entry)
        self.stats.saved += 1
        self._touch(entry)

    def _touch(self, entry: StoredText) -> None:
        self._clock += 1
        entry.used = self._clock
