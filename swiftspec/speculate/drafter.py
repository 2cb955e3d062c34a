"""TreeDrafter: parallel tree growth (w leaves per forward) over an evolving tree-aware KV cache.

The tree's root is the last verified token. A node is *expanded* once the draft has run a forward
on it: its KV then sits in the cache's tree region and its children are in the tree. After each
verification the drafter re-roots at the last verified token, commits the accepted path's KV to the
prefix and compacts the surviving subtree; only a verified token that was never expanded (at most
one per round, the *pending* token, or a run of grafted lookup nodes) is recomputed, folded into
the next forward.  With prompt lookup on, the continuations of the verified text are grafted at
each new root (speculate/lookup.py); the draft expands them like its own nodes once they rank high.
A pruned head serves a request only while its text (the prompt, then every verified token) stays
inside the pruned vocabulary but for a TEXT_SLACK share; past that the request drafts with the
full head, so a workload the table does not cover (chat, other languages) loses no acceptance.
The few tokens of the text outside the table join the pruned head for that request (the full
head's tiles that hold them), so code that names a rare identifier keeps the smaller head and
can propose it.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from swiftspec import kernels
from swiftspec.config import SINK_TOKENS, TreeConfig
from swiftspec.fim import find_fim_tokens
from swiftspec.kernels.packed import TILE_N
from swiftspec.runner.cuda_graph import attach
from swiftspec.runner.model_runner import ModelRunner, causal_mask
from swiftspec.sampling import Draws, SamplingParams, draft_nucleus, sample_at
from swiftspec.speculate.lookup import PromptLookup
from swiftspec.speculate.vocab import MAX_EXTRA_ROWS, TEXT_SLACK, pruned_vocab
from swiftspec.tokenizer import Tokenizer
from swiftspec.tree import (
    Subtree,
    TokenTree,
    coupled_children,
    depths,
    draft_mask,
    grow,
    new_tree,
    reroot,
    select_leaves,
    select_subtree,
    topk_children,
)
from swiftspec.weights.loaded_model import LoadedModel

# The least chance the tree gives a sampled request's draft draw (tree.coupled_children): 0, so it
# ranks as the row's likeliest token would (a floor of 0.7 kept flat rows' draws in every tree:
# 8 nodes and 7 expansions a round, 0.68x ar on sampled chat, docs/bench/sampled.md).
COUPLED_DRAW_CHANCE = 0.0


class TreeDrafter:
    """Owns the draft model's cache and the live token tree."""

    def __init__(self, model: torch.nn.Module, cfg: TreeConfig, max_seq_len: int,
                 vocab: torch.Tensor | None = None, head: torch.Tensor | None = None, focus: int | None = None) -> None:
        """vocab [V'] sorted token ids and head [V', H] their LM-head rows: a pruned head.  focus: the
        token (FIM's suffix marker) around whose last place a windowed draft context centres."""
        self.cfg = cfg
        self.focus = focus
        self.runner = ModelRunner(model, max_seq_len + cfg.budget + 8, max_nodes=cfg.budget, head=head)
        self.vocab_map = None if vocab is None else vocab.to(self.runner.device)  # draft row -> token id
        self.pruned = (self.vocab_map, head)
        self.inside = None if vocab is None else frozenset(vocab.tolist())  # ids the pruned head scores
        # CUDA graphs: w leaves, and w leaves behind the verified tokens still missing KV
        attach(self.runner, (cfg.width, cfg.width + cfg.verify_size + 1))
        self.switchable = self.inside is not None and self.runner.graphs is None  # graphs keep their head
        self.tree: TokenTree = new_tree(0)
        self.pending: list[int] = []  # verified tokens whose draft KV is missing
        self.params = SamplingParams()
        self.root_position = 0  # the root's place in the text (prompt tokens before it)
        self.uniforms: torch.Tensor | None = None  # sampled requests: the draws of the positions after the root
        self.lookup = PromptLookup(cfg) if cfg.lookup else None
        self.text = _Text(self.inside)  # the request's tokens, and those outside the pruned vocabulary

    def start(self, prompt: list[int], root: int, params: SamplingParams) -> None:
        """Begin a request: prefill the prompt's draft context (context_window; the KV of its prefix
        that the last request's text shares is kept) and plant a tree at the first generated token;
        prompt lookup reads the whole prompt."""
        if self.switchable:
            self.text = _Text(self.inside)
            self.text.add(prompt + [root])
            self._use_pruned(self.text.covered)
        self.runner.prefill(context_window(prompt, self.cfg.draft_context, self.focus))
        self.tree = new_tree(root, self.runner.device)
        self.pending = []
        self.params = params
        self._set_root(len(prompt))
        if self.lookup is not None:  # the last text's part that the prompt does not repeat: earlier answers
            self.lookup.start(prompt + [root], self.runner.dropped if self.cfg.lookup_earlier else [])
            self.tree = self.lookup.graft(self.tree, self.cfg.budget)

    def _set_root(self, position: int) -> None:
        """The root sits at `position` of the text; a sampled request's children at depth j + 1
        are drawn with the uniform of position + j + 1 (uniforms[j]), as the target draws them."""
        self.root_position = position
        if self.params.greedy:
            self.uniforms = None
        else:
            self.uniforms = Draws.for_request(self.params).uniforms(position + 1, self.cfg.budget, self.runner.device)

    def _use_pruned(self, pruned: bool) -> None:
        """Draft with the pruned head (its rows and their token ids, then the request's own tokens
        outside them where the full head's rows are at hand) or the model's full head."""
        self.vocab_map, self.runner.head = self.pruned if pruned else (None, None)
        self.runner.extra = None
        if pruned and self.text.extra:
            ids = torch.tensor(self.text.extra, dtype=torch.long, device=self.runner.device)  # [E]
            tiles, place = torch.unique(ids // TILE_N, return_inverse=True)  # [n], [E]
            head = self.runner.model.lm_head.weight
            rows = kernels.select_tiles(head, tiles) if isinstance(head, kernels.PackedWeight) else None  # [n * 16, H]
            if rows is not None:
                self.vocab_map = torch.cat([self.vocab_map, ids])
                self.runner.extra = (rows, place * TILE_N + ids % TILE_N)

    @property
    def size(self) -> int:
        """Nodes in the live tree."""
        return self.tree.tokens.numel()

    def draft(self, expansions: int, stop: Callable[[], bool] | None = None, focus: int = 0,
              min_weight: float = -math.inf) -> int:
        """Grow the tree by up to `expansions` forwards of the w best unexpanded leaves; stop()
        is asked before each one (the async draft stops as soon as the verified tokens arrive).
        focus > 0: only leaves that can still join the best `focus`-node subtree are expanded,
        and drafting ends early once that subtree is final (serial rounds; see select_leaves);
        leaves lighter than min_weight are skipped.  Returns the forwards run."""
        for done in range(expansions):
            if stop is not None and stop():
                return done
            if not self.expand(focus, min_weight):
                return done
        return expansions

    def expand(self, focus: int = 0, min_weight: float = -math.inf, width: int = 0) -> bool:
        """One draft forward over the w best unexpanded leaves (those that can still join the
        best `focus`-node subtree, if focus > 0, and weigh at least min_weight; width > 0 takes
        that many instead of w); adds their top-k children.  False if there was nothing to
        expand (or no room)."""
        if self.size >= self.cfg.budget:
            return False
        leaves = select_leaves(self.tree, width or self.cfg.width, focus, min_weight)  # [n <= w]
        if leaves.numel() == 0 or self.runner.kv.kv_len + leaves.numel() + len(self.pending) > self.runner.cache.max_len:
            return False
        kv = self.runner.kv
        pend = self._pending_inputs()
        slots = kv.alloc(leaves)  # [n]
        width = kv.kv_len
        mask = draft_mask(self.tree, leaves, kv.node_slot[: self.size], kv.prefix_len, width)  # [n, width]
        leaf_depths = depths(self.tree)[leaves]  # [n]
        positions = kv.prefix_len + leaf_depths  # [n]
        tokens = self.tree.tokens[leaves]
        rows = None
        if pend is not None:
            tokens = torch.cat([pend.tokens, tokens])
            positions = torch.cat([pend.slots, positions])
            slots = torch.cat([pend.slots, slots])
            mask = torch.cat([torch.nn.functional.pad(pend.mask, (0, width - pend.mask.shape[1])), mask])
            rows = torch.arange(pend.tokens.numel(), tokens.numel(), device=tokens.device)
        logits = self.runner.forward(tokens, positions, slots, mask, rows=rows)  # [n, V']
        if self.uniforms is None:
            child_tokens, child_logprobs = topk_children(torch.log_softmax(logits.float(), dim=-1), self.cfg.topk)
        else:  # sampled: each leaf's first child is the draft's own draw at the target's uniform
            nucleus = draft_nucleus(logits, self.params)  # [n, C]
            drawn = sample_at(nucleus.probs, self.uniforms[leaf_depths])  # [n]: places in the nucleus
            logprobs = nucleus.probs.clamp_min(1e-30).log()  # [n, C]
            places, child_logprobs = coupled_children(logprobs, self.cfg.topk, drawn, COUPLED_DRAW_CHANCE)
            child_tokens = nucleus.ids.gather(-1, places)  # [n, k]
        if self.vocab_map is not None:
            child_tokens = self.vocab_map[child_tokens]
        merge = self.lookup is not None  # a leaf may hold grafted children already
        if merge:
            self.tree = self.lookup.expanding(self.tree, leaves.tolist(), child_tokens.tolist())
        self.tree = grow(self.tree, leaves, child_tokens, child_logprobs, self.cfg.budget, merge=merge)
        return True

    def _pending_inputs(self) -> "_Pending | None":
        """Verified tokens without KV go into the prefix ahead of this forward's leaves."""
        if not self.pending:
            return None
        device = self.runner.device
        start = self.runner.kv.prefix_len
        slots = self.runner.kv.append_prefix(self.pending)  # [p]
        tokens = torch.tensor(self.pending, dtype=torch.long, device=device)  # [p]
        self.pending = []
        return _Pending(tokens, slots, causal_mask(start, tokens.numel(), device))

    def subtree(self, size: int, costs: torch.Tensor | None = None, spent_s: float = 0.0,
                trust: float = 1.0) -> Subtree:
        """The best `size`-node subtree at the root, for the target to verify; with the target's
        costs [size] (seconds to verify 1..size nodes), only the part that repays them
        (tree.best_size; spent_s: the round's other time; trust scales path probabilities)."""
        return select_subtree(self.tree, size, costs, spent_s, trust)

    def advance(self, emitted: list[int]) -> None:
        """Re-root at the last emitted token: commit the accepted path, compact the survivors."""
        if self.switchable and self.vocab_map is not None and self.text.add(emitted):
            self._use_pruned(self.text.covered)  # the text left the pruned vocabulary: full head from here on
        step = reroot(self.tree, emitted)
        self.pending += self.runner.kv.reroot(self.tree, step, emitted)
        self.tree = step.tree if step.tree is not None else new_tree(emitted[-1], self.runner.device)
        self._set_root(self.root_position + len(emitted))
        if self.lookup is not None:
            self.lookup.observe(step, emitted)
            self.tree = self.lookup.graft(self.tree, self.cfg.budget)


def context_window(prompt: list[int], size: int, focus: int | None = None) -> list[int]:
    """The prompt tokens the draft reads: all of them when size is 0 or the prompt fits, else the
    first SINK_TOKENS and the last size - SINK_TOKENS, at consecutive positions (as StreamingLLM
    places a window behind its attention sinks).  A prompt holding the `focus` token (a FIM
    prompt's suffix marker: the cursor is just before it) keeps instead the tokens before its last
    focus, then the focus and the start of what follows it (a quarter of the window), then the
    prompt's last token: the text around the cursor, where a FIM prompt's end is far from it.  The
    draft only proposes tokens: what it reads never changes the output, only how many proposals
    the target accepts."""
    if size == 0 or len(prompt) <= size:
        return prompt
    room = size - SINK_TOKENS
    at = len(prompt) - 1 - prompt[::-1].index(focus) if focus is not None and focus in prompt[SINK_TOKENS:-1] else -1
    if at < SINK_TOKENS:
        return prompt[:SINK_TOKENS] + prompt[len(prompt) - room:]
    after = prompt[at:-1][: room // 4] + prompt[-1:]
    return prompt[:SINK_TOKENS] + prompt[max(SINK_TOKENS, at - (room - len(after))):at] + after


class _Text:
    """A request's text as the pruned head sees it: how many tokens it holds, how many of them lie
    outside the pruned vocabulary, and those tokens' distinct ids in order of appearance."""

    def __init__(self, inside: frozenset[int] | None) -> None:
        self.inside = inside or frozenset()
        self.tokens = 0
        self.outside = 0
        self.extra: list[int] = []

    def add(self, tokens: list[int]) -> bool:
        """Count tokens; True if one of them is outside the pruned vocabulary and new to the text."""
        out = [t for t in tokens if t not in self.inside]
        self.tokens += len(tokens)
        self.outside += len(out)
        new = [t for t in dict.fromkeys(out) if t not in self.extra]
        self.extra += new
        return bool(new)

    @property
    def covered(self) -> bool:
        """At most a TEXT_SLACK share of the text, and MAX_EXTRA_ROWS distinct ids, lie outside."""
        return self.outside <= TEXT_SLACK * self.tokens and len(self.extra) <= MAX_EXTRA_ROWS


class _Pending:
    """Inputs for verified tokens whose draft KV must be computed before the next leaves."""

    def __init__(self, tokens: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor) -> None:
        self.tokens = tokens  # [p]
        self.slots = slots  # [p]; also their positions (prefix slot == position)
        self.mask = mask  # [p, prefix_len]


def build_drafter(draft: LoadedModel, cfg: TreeConfig, max_seq_len: int, draft_vocab: int, weights: str) -> TreeDrafter:
    """A drafter over a loaded draft model: a pruned LM head of
    the draft_vocab most frequent code tokens when a table matches its tokenizer (beside the full
    head, which requests outside it use), then pack its weights (bf16 stays bf16, served by the
    small-M kernel where it applies)."""
    model = draft.model
    vocab = pruned_vocab(draft.tokenizer, draft_vocab, draft.args.vocab_size) if model.parallel.tp_size == 1 else None
    head = None
    if vocab is not None:
        w = model.lm_head.weight  # a packed GGUF head (--weights gguf) is dequantized to prune it
        dtype = model.model.embed_tokens.weight.dtype
        dense = kernels.dequantize(w).to(dtype) if isinstance(w, kernels.PackedWeight) else w.data
        head = dense[vocab.to(dense.device)].contiguous()  # [V', H]
    kernels.prepare_model_(model, weights)  # the full head too: requests outside the pruned vocabulary use it
    head = None if head is None else kernels.prepare_weight(head, weights)
    return TreeDrafter(model, cfg, max_seq_len, vocab, head, fim_focus(draft.tokenizer))


def fim_focus(tokenizer: Tokenizer) -> int | None:
    """The FIM suffix marker a windowed draft context centres on (None: the model has no FIM tokens)."""
    tokens = find_fim_tokens(tokenizer)
    return None if tokens is None else tokens.suffix
