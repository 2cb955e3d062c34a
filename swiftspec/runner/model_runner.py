"""A loaded model with its static KV cache: one forward call over explicit tokens, slots and mask."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from swiftspec import kernels
from swiftspec.cache.kv_cache import KVCache
from swiftspec.cache.prompt_store import Match, PromptStore, common_prefix
from swiftspec.cache.tree_kv import TreeKV
from swiftspec.kernels import cpu_ext
from swiftspec.model.attention import Attention
from swiftspec.parallel.linear import LinearBase

PREFILL_CHUNK = 256  # prompt tokens per prefill forward
# a CPU call of more rows than the small-M kernels take attends over whole blocks of this many
# keys (torch's CPU flash attention splits keys so; masked keys add nothing): a row's bits then do
# not depend on how far the call reaches
KEY_BLOCK = 512
MIN_PREFILL_ROWS = kernels.MAX_DECODER_ROWS + 1  # the fewest rows a call runs in prefill's kernels
# the live text is copied into the store only when a prefill would overwrite more of it than this:
# a repeated prompt (or a chat's next turn) drops no more than the last answer, which it recomputes
STORE_AFTER = 64


@dataclass(frozen=True, slots=True)
class Prefill:
    """A prompt's prefill: the logits after its last token, and how many of its tokens' KV was kept."""

    logits: torch.Tensor  # [1, V]
    cached: int  # leading prompt tokens whose KV came from the live cache or the store


def causal_mask(start: int, n: int, device: torch.device | str) -> torch.Tensor:
    """[n, start + n] bool: token i (at slot start + i) sees every slot <= start + i."""
    cols = torch.arange(start + n, device=device)
    rows = torch.arange(start, start + n, device=device)
    return cols[None, :] <= rows[:, None]


def whole_key_blocks(n: int) -> int:
    """n slots rounded up to whole KEY_BLOCKs."""
    return -(-n // KEY_BLOCK) * KEY_BLOCK


def cache_slots(max_len: int, device: torch.device) -> int:
    """Slots of a cache for max_len tokens: on the CPU whole KEY_BLOCKs, so that prefix_mask pads
    every prefill call to whole blocks; a call reaching the cache's end was padded only up to it,
    and torch's bf16 flash attention gives a row other bits over another key count (the ar engine's
    cache and the verifier's differ in length, and tree parted from ar at near-ties)."""
    return whole_key_blocks(max_len) if device.type == "cpu" else max_len


def rows_apart(model: torch.nn.Module) -> bool:
    """A row's KV does not depend on the call it is computed in, as long as the call has at least
    MIN_PREFILL_ROWS rows and its keys are padded to KEY_BLOCK: every linear is a quantized weight
    on the CPU (the C++ kernels give a row the same bits at every row count; bf16 and torch's
    linears do not), and every attention runs kernels.attention (no soft-capping in torch)."""
    linears = [m for m in model.modules() if isinstance(m, LinearBase)]
    quantized = all(isinstance(m.weight, kernels.PackedWeight) and m.weight.fmt != "bf16"
                    and m.weight.device.type == "cpu" for m in linears)
    plain = all(m.softcap is None for m in model.modules() if isinstance(m, Attention))
    return bool(linears) and quantized and plain and cpu_ext.available("quant_linear")


class ModelRunner:
    """Owns a model and its KV cache; every attention reads slots [0, mask.shape[1])."""

    def __init__(self, model: torch.nn.Module, max_len: int, max_nodes: int,
                 head: torch.Tensor | None = None, store: PromptStore | None = None, exact: bool = False) -> None:
        """store: earlier texts' KV for later prompts (None: only the live cache's text is kept).
        exact: a prefill keeps only KV that a cold prefill of its prompt computes with the same bits
        (the target's: its output must not depend on the cache); a draft's keeps any shared prefix."""
        self.model = model
        self.store = store
        self.exact = exact
        # exact, and any prefix of prefill rows may be kept (rows_apart); else only whole chunks
        self.any_prefix = exact and rows_apart(model)
        self._prompt_logits: torch.Tensor | None = None  # [1, V] after the prompt of TreeKV.whole
        self.dropped: list[int] = []  # the last text's tokens past what the latest prefill kept (it overwrote them)
        self.cache: KVCache = model.new_cache(cache_slots(max_len, model.device))
        self.device = self.cache.k.device
        self.kv = TreeKV(self.cache, max_nodes)
        self.head = head  # [V', H] (or packed) rows of a pruned LM head; None = the model's own
        # a pruned head's extension: packed rows [R, H] (or None) and the columns [E] of its logits
        # that score E more tokens after the pruned head's (kernels.select_tiles)
        self.extra: tuple[kernels.PackedWeight, torch.Tensor] | None = None
        self.graphs = None  # CUDA: a runner.cuda_graph.GraphRunner replaying captured shapes

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

    def prefill(self, prompt: list[int], reuse: bool = True,
                stop: Callable[[], bool] | None = None) -> Prefill | None:
        """Start a request's text: keep the KV of the longest prefix of `prompt` that the live cache
        or the store holds (reuse=False: none), compute the rest.  stop() is asked between chunks;
        once it says True the prefill ends there, returning None (the chunks done stay cached)."""
        before, n = list(self.kv.text), len(prompt)
        if reuse and self._repeats(prompt):  # this prompt again: its KV and its logits stand
            self.kv.reset(n)
            self.dropped = before[n:]
            return Prefill(self._prompt_logits.clone(), n)
        kept = self._keep(prompt) if reuse else self._drop()
        self.dropped = before[kept:]
        bounds = self._chunks(kept, n)
        for start, end in zip(bounds[:-2], bounds[1:-1]):
            if stop is not None and stop():
                return None
            self._append(prompt[start:end])
            if self.exact:  # rows a later prefill may keep (_chunks)
                self.kv.cold = end
        if stop is not None and stop():
            return None
        logits = self._append(prompt[bounds[-2]:], logits=True)
        if self.exact:
            whole = self.any_prefix and n - bounds[-2] >= MIN_PREFILL_ROWS
            self.kv.cold, self.kv.whole, self._prompt_logits = n if whole else bounds[-2], n, logits
        return Prefill(logits, kept)

    def _chunks(self, kept: int, n: int) -> list[int]:
        """Bounds of the prefill calls over prompt tokens [kept, n).  any_prefix: as few calls of
        at most PREFILL_CHUNK rows as will do, of near-equal size (so each has MIN_PREFILL_ROWS rows
        when _usable kept any).  Otherwise chunks end at multiples of PREFILL_CHUNK, as a cold
        prefill's do, and the prompt's own last chunk is kept by no later prefill: with chunk-bound
        reuse every kept row was computed in the very call shape a cold prefill gives it."""
        if self.any_prefix:
            calls = max(1, -(-(n - kept) // PREFILL_CHUNK))
            return [kept + (n - kept) * i // calls for i in range(calls + 1)]
        last = max(kept, (n - 1) // PREFILL_CHUNK * PREFILL_CHUNK)
        if kept == last:
            return [kept, n]
        return [kept, *range((kept // PREFILL_CHUNK + 1) * PREFILL_CHUNK, last, PREFILL_CHUNK), last, n]

    def cached_prefix(self, prompt: list[int]) -> int:
        """How many leading prompt tokens a prefill would keep, found by prefill's own rules without
        changing anything (from another thread while this runner works, an estimate: the texts may
        be changing)."""
        if self._repeats(prompt):
            return len(prompt)
        ids = np.asarray(prompt, dtype=np.int64)
        return max(self._live(ids), self._stored(ids, count=False).length)

    def _repeats(self, prompt: list[int]) -> bool:
        """The live cache holds this very prompt as its exact prefill computed it, logits included."""
        n = len(prompt)
        return self.exact and self.kv.whole == n and self.kv.text[:n] == prompt

    def _live(self, ids: np.ndarray) -> int:
        """Leading tokens of the prompt ids [n] that may be kept from the live cache."""
        return self._usable(self.kv.cold, common_prefix(np.asarray(list(self.kv.text), dtype=np.int64), ids), ids.size)

    def _stored(self, ids: np.ndarray, count: bool = True) -> Match:
        """The stored text from which the most leading tokens of the prompt ids [n] may be kept
        (count=False: an estimate, not counted as a lookup)."""
        if self.store is None:
            return Match(None, 0)
        return self.store.match(ids, lambda entry, shared: self._usable(entry.cold, shared, ids.size), count)

    def _keep(self, prompt: list[int]) -> int:
        """Put the KV of prompt's longest cached prefix (all but its last token at most) in slots
        [0, n); the live text goes into the store first if it is about to be overwritten."""
        kv, ids = self.kv, np.asarray(prompt, dtype=np.int64)
        live = self._live(ids)
        if self.store is None:
            kv.reset(live)
            return live
        match = self._stored(ids)
        if kv.prefix_len - live > STORE_AFTER:
            self.store.save(kv.text, self.cache, kv.cold)
        if match.length <= live:
            kv.reset(live)
            return live
        self.store.load(match, self.cache)
        kv.adopt(prompt[: match.length], min(match.entry.cold, match.length))
        return match.length

    def _usable(self, cold: int, shared: int, n: int) -> int:
        """Of `shared` leading tokens cached for an n-token prompt, those a prefill may keep: all but
        the last token; exact, only rows a prefill computed (`cold`): any_prefix, all but the
        MIN_PREFILL_ROWS of the call that computes the rest; else whole chunks computed as a cold
        prefill computes them, before the prompt's own last chunk."""
        if not self.exact:
            return min(shared, n - 1)
        if self.any_prefix:
            return max(0, min(shared, cold, n - MIN_PREFILL_ROWS))
        return min(shared, cold, (n - 1) // PREFILL_CHUNK * PREFILL_CHUNK) // PREFILL_CHUNK * PREFILL_CHUNK

    def _drop(self) -> int:
        """Keep nothing for this request (its KV still goes to the store if it has one)."""
        if self.store is not None and self.kv.prefix_len:
            self.store.save(self.kv.text, self.cache, self.kv.cold)
        self.kv.reset()
        return 0

    def extend(self, tokens: list[int]) -> torch.Tensor:
        """Append verified tokens to the prefix (tree must be empty); logits of the last one [1, V].

        The same call serves a prompt's prefill and a one-token decode step.  A long prompt runs in
        chunks of PREFILL_CHUNK tokens, so that no mask or attention buffer grows with its square."""
        for start in range(0, len(tokens) - PREFILL_CHUNK, PREFILL_CHUNK):
            self._append(tokens[start : start + PREFILL_CHUNK])
        rest = tokens[(len(tokens) - 1) // PREFILL_CHUNK * PREFILL_CHUNK :]
        return self._append(rest, logits=True)

    def prefix_mask(self, start: int, n: int) -> torch.Tensor:
        """[n, S] bool for n tokens at slots [start, start + n) after the prefix: causal_mask, its keys
        padded with False to whole KEY_BLOCKs (the CPU cache holds whole blocks: cache_slots) for a
        CPU call of at least MIN_PREFILL_ROWS rows, so that the call's reach never changes a row's bits."""
        mask = causal_mask(start, n, self.device)  # [n, start + n]
        if self.device.type != "cpu" or n < MIN_PREFILL_ROWS:
            return mask
        return F.pad(mask, (0, whole_key_blocks(start + n) - mask.shape[1]))

    @torch.inference_mode()
    def _append(self, tokens: list[int], logits: bool = False) -> torch.Tensor | None:
        """Run tokens [T] at the next prefix slots; the last one's logits [1, V] if asked."""
        start = self.kv.prefix_len
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)  # [T]
        slots = self.kv.append_prefix(tokens)  # [T]
        mask = self.prefix_mask(start, len(tokens))  # [T, S]
        try:
            if not logits:
                self.model(ids, slots, self.cache, slots, mask)
                return None
            return self.forward(ids, slots, slots, mask, rows=torch.tensor([len(tokens) - 1], device=self.device))
        except BaseException:
            self.kv.reset(start)  # these slots' KV is not whole: the text must not name them
            raise
