"""Prompt lookup in the draft tree: n-gram continuations of the verified text, grafted at the root as
branches that cost no draft forward, ranked with the draft's nodes by measured acceptance rates.

After each verification the grafted nodes whose parent was verified are scored (did the target's
next token equal theirs?) and the rates learn from it, across requests (no output depends on the
tree's shape: sampled tokens are position-keyed, sampling.Draws).
LookupDrafter drafts with prompt lookup alone (`--draft-model none`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from swiftspec.config import TreeConfig
from swiftspec.sampling import SamplingParams
from swiftspec.speculate.ngram import AGREED, DISAGREED, SECONDARY, AcceptRates, NgramIndex, RateKey
from swiftspec.tree import Reroot, Subtree, TokenTree, graft, new_tree, reroot, reweight, select_subtree

EARLIER_TOKENS = 2048  # most tokens of earlier text a request's lookup indexes


@dataclass(frozen=True, slots=True)
class _Record:
    """A grafted node awaiting its outcome (tree indices of the current tree)."""

    parent: int
    token: int
    key: RateKey


@dataclass(frozen=True, slots=True)
class _Candidates:
    """A trie of continuations, as graft() takes it (parents: -1 = the root, else an earlier entry)."""

    parents: list[int]
    tokens: list[int]
    keys: list[RateKey]


class PromptLookup:
    """The n-gram index of one request, the acceptance rates, and the grafted nodes being scored."""

    def __init__(self, cfg: TreeConfig) -> None:
        self.cfg = cfg
        self.index = NgramIndex(cfg.lookup_ngram)
        self.rates = AcceptRates(cfg.lookup_ngram)
        self.records: dict[int, _Record] = {}  # tree index -> record
        self.grafted = 0  # candidate tokens grafted since start-up (merged ones included)

    def start(self, tokens: list[int], earlier: list[int] = ()) -> None:
        """A new request whose verified text so far is `tokens` (prompt, then the root); `earlier`:
        text of earlier requests that this one does not repeat (the last answer, say), indexed
        before it, so that its continuations are candidates too."""
        self.index.reset([*earlier[len(earlier) - EARLIER_TOKENS:], *tokens] if earlier else tokens)
        self.records = {}

    def graft(self, tree: TokenTree, budget: int) -> TokenTree:
        """The tree with the continuations of the verified text grafted at its root."""
        trie = self._candidates()
        if not trie.tokens:
            return tree
        n = len(tree)
        parents = torch.tensor([0 if p < 0 else n + p for p in trie.parents], dtype=torch.int64)
        logprobs = torch.tensor([self.rates.logprob(k) for k in trie.keys], dtype=torch.float32)
        tokens = torch.tensor(trie.tokens, dtype=torch.int64)
        device = tree.tokens.device
        result = graft(tree, parents.to(device), tokens.to(device), logprobs.to(device), budget)
        placed = result.nodes.tolist()
        for i, node in enumerate(placed):
            parent = 0 if trie.parents[i] < 0 else placed[trie.parents[i]]
            if node >= 0 and parent >= 0:
                self.records[node] = _Record(parent, trie.tokens[i], trie.keys[i])
                self.grafted += 1
        return result.tree

    def _candidates(self) -> _Candidates:
        cfg = self.cfg
        trie = _Candidates([], [], [])
        child_of: dict[tuple[int, int], int] = {}
        for cont in self.index.continuations(cfg.lookup_tokens, cfg.lookup_branches):
            at = -1
            for depth, token in enumerate(cont.tokens, 1):
                node = child_of.get((at, token))
                if node is None:
                    alternative = any(p == at for p in trie.parents)
                    node = len(trie.tokens)
                    child_of[(at, token)] = node
                    trie.parents.append(at)
                    trie.tokens.append(token)
                    trie.keys.append(self.rates.key(cont.n, depth, alternative))
                at = node
        return trie

    def expanding(self, tree: TokenTree, leaves: list[int], child_tokens: list[list[int]]) -> TokenTree:
        """The draft is about to add its top-k children (child_tokens[i], [k] ids, best first)
        under leaves[i]: a grafted child of those leaves is now one the draft ranks first, lower, or
        not at all, and takes that rate (a proposed one then merges with the draft's child, keeping
        the larger log-prob)."""
        proposed = {leaf: row for leaf, row in zip(leaves, child_tokens)}
        nodes, logprobs = [], []
        for node, rec in self.records.items():
            if rec.parent in proposed and rec.key.draft == 0:
                row = proposed[rec.parent]
                state = AGREED if rec.token == row[0] else SECONDARY if rec.token in row else DISAGREED
                key = RateKey(rec.key.n, rec.key.depth, rec.key.alternative, state)
                self.records[node] = _Record(rec.parent, rec.token, key)
                nodes.append(node)
                logprobs.append(self.rates.logprob(key))
        return reweight(tree, nodes, logprobs) if nodes else tree

    def observe(self, step: Reroot, emitted: list[int]) -> None:
        """After a verification: score the grafted nodes whose parent was verified (the token that
        followed the parent is emitted[d] for the d-th verified node), carry the others over to the
        next tree, and add the emitted tokens to the index."""
        depth_of = {node: d for d, node in enumerate(step.path.tolist())}
        index_map = step.index_map.tolist()
        kept: dict[int, _Record] = {}
        for node, rec in self.records.items():
            d = depth_of.get(rec.parent)
            if d is not None:
                self.rates.record(rec.key, emitted[d] == rec.token)
            elif index_map[node] >= 0 and index_map[rec.parent] >= 0:
                kept[index_map[node]] = _Record(index_map[rec.parent], rec.token, rec.key)
        self.records = kept
        self.index.extend(emitted)


class LookupDrafter:
    """Drafts with prompt lookup alone: the tree holds only grafted continuations and is never
    expanded (no draft model, no KV cache).  Offers TreeDrafter's interface to the engines."""

    def __init__(self, cfg: TreeConfig) -> None:
        self.cfg = cfg
        self.lookup = PromptLookup(cfg)
        self.tree: TokenTree = new_tree(0)

    @property
    def size(self) -> int:
        return len(self.tree)

    def start(self, prompt: list[int], root: int, params: SamplingParams) -> None:
        self.lookup.start(prompt + [root])
        self.tree = self.lookup.graft(new_tree(root), self.cfg.budget)

    def draft(self, expansions: int, stop=None, focus: int = 0, min_weight: float = -math.inf) -> int:
        """Nothing to run: the candidates were grafted when the root was planted."""
        return 0

    def expand(self, focus: int = 0, min_weight: float = -math.inf, width: int = 0) -> bool:
        return False

    def subtree(self, size: int, costs: torch.Tensor | None = None, spent_s: float = 0.0,
                trust: float = 1.0) -> Subtree:
        return select_subtree(self.tree, size, costs, spent_s, trust)

    def advance(self, emitted: list[int]) -> None:
        step = reroot(self.tree, emitted)
        self.lookup.observe(step, emitted)
        tree = step.tree if step.tree is not None else new_tree(emitted[-1])
        self.tree = self.lookup.graft(tree, self.cfg.budget)
