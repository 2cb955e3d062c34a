"""CUDA graphs of ModelRunner's forward: one graph per bucket of n tokens (w for draft expansions,
bs for verification) over static input buffers, replayed with the real call padded to the bucket.

Static shapes: tokens, positions and slots hold `bucket` rows, the mask [bucket, max_len] so that
S is the whole cache (the mask alone bounds what is read; the Triton kernel skips hidden tiles).
Padding rows write their K/V to a scratch slot that no real row may see: every real slot and
every column a real row sees is < S <= scratch (calls with S > scratch run eagerly), and a padding
row sees only the scratch slot, i.e. its own finite key, so it never makes NaNs. Slots >= S are
free cache space, written by their next owner before anyone reads them, so the scratch write is
harmless. Padding changes the rows of each matmul, so graph logits equal eager ones to rounding,
not bit for bit. On a non-CUDA device nothing is captured and `forward` runs the same padded
batch eagerly (what the CPU tests exercise).

A graph keeps the addresses it was captured with: the KV cache, the weights and the model's RoPE
tables (sized to the cache length by the warm-up, so never regrown for this runner) must stay put.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch

if TYPE_CHECKING:
    from swiftspec.runner.model_runner import ModelRunner

WARMUP_RUNS = 2  # eager runs before a capture: Triton compiles, cuBLAS picks its kernels


@dataclass(frozen=True, slots=True)
class PaddedBatch:
    """Static inputs of one bucket; real rows first, padding rows after."""

    tokens: torch.Tensor  # [bucket] int64
    positions: torch.Tensor  # [bucket] int64
    slots: torch.Tensor  # [bucket] int64
    mask: torch.Tensor  # [bucket, width] bool


@dataclass(frozen=True, slots=True)
class _Graph:
    """One bucket's buffers and graph (None off CUDA); logits [bucket, V] is the graph's output."""

    batch: PaddedBatch
    graph: torch.cuda.CUDAGraph | None
    logits: torch.Tensor | None


def pick_bucket(num_tokens: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket >= num_tokens (buckets sorted ascending), None when none is large enough."""
    for bucket in buckets:
        if bucket >= num_tokens:
            return bucket
    return None


def new_batch(bucket: int, width: int, scratch_slot: int, device: torch.device | str) -> PaddedBatch:
    """Buffers for `bucket` rows, all of them padding: token 0 at position 0, writing and seeing
    only scratch_slot (< width)."""
    if not 0 <= scratch_slot < width:
        raise ValueError(f"scratch slot {scratch_slot} outside the mask width {width}")
    mask = torch.zeros(bucket, width, dtype=torch.bool, device=device)
    mask[:, scratch_slot] = True
    return PaddedBatch(
        tokens=torch.zeros(bucket, dtype=torch.long, device=device),
        positions=torch.zeros(bucket, dtype=torch.long, device=device),
        slots=torch.full((bucket,), scratch_slot, dtype=torch.long, device=device),
        mask=mask,
    )


def pad_into(batch: PaddedBatch, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
             mask: torch.Tensor, scratch_slot: int) -> None:
    """Copy a call of n <= bucket rows (tokens, positions, slots [n]; mask [n, S], S <= scratch_slot)
    into `batch` in place; rows n.. become padding again. No host sync (shapes only)."""
    num_tokens, length = mask.shape
    if num_tokens > batch.tokens.numel() or length > scratch_slot:
        raise ValueError(f"a call of {num_tokens} rows and width {length} does not fit this bucket")
    for dst, src, pad in ((batch.tokens, tokens, 0), (batch.positions, positions, 0),
                          (batch.slots, slots, scratch_slot)):
        dst[:num_tokens].copy_(src)
        dst[num_tokens:].fill_(pad)
    batch.mask[:num_tokens, :length].copy_(mask)
    batch.mask[:num_tokens, length:].fill_(False)  # the scratch column included
    batch.mask[num_tokens:].fill_(False)
    batch.mask[num_tokens:, scratch_slot] = True


class GraphRunner:
    """Replays a captured forward for calls of at most max(buckets) tokens; others run eagerly."""

    def __init__(self, runner: ModelRunner, buckets: Sequence[int], scratch_slot: int | None = None) -> None:
        """scratch_slot: the slot padding rows write (default: the cache's last slot)."""
        if not buckets or min(buckets) < 1:
            raise ValueError(f"buckets must be positive token counts, got {list(buckets)}")
        self.runner = runner
        self.buckets = tuple(sorted(set(buckets)))
        self.width = runner.cache.max_len  # the static S of every graph
        self.scratch = self.width - 1 if scratch_slot is None else scratch_slot
        self.graphs: dict[int, _Graph] = {}

    def covers(self, num_tokens: int, length: int) -> bool:
        """Whether a call of num_tokens rows and mask width `length` replays a graph (or, off CUDA,
        runs padded); ModelRunner.forward asks this before handing a call over."""
        return pick_bucket(num_tokens, self.buckets) in self.graphs and length <= self.scratch

    @torch.inference_mode()
    def capture(self) -> "GraphRunner":
        """Warm up and capture every bucket, largest first, in one shared memory pool (CUDA);
        elsewhere only the static buffers are made. Writes only the scratch slot of the cache."""
        cuda = self.runner.device.type == "cuda"
        pool = torch.cuda.graph_pool_handle() if cuda else None
        for bucket in reversed(self.buckets):
            batch = new_batch(bucket, self.width, self.scratch, self.runner.device)
            self.graphs[bucket] = self._capture_one(batch, pool) if cuda else _Graph(batch, None, None)
        return self

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        """ModelRunner.forward's contract: tokens, positions, slots [n], mask [n, S] -> logits [R, V]
        (R = n, or the selected rows [R]). The result is a fresh tensor, not a graph buffer."""
        num_tokens, length = mask.shape
        if not self.covers(num_tokens, length):
            return self.runner.forward(tokens, positions, slots, mask, rows)  # eager: it does not call back
        entry = self.graphs[pick_bucket(num_tokens, self.buckets)]
        pad_into(entry.batch, tokens, positions, slots, mask, self.scratch)
        if entry.graph is None:
            logits = self._run(entry.batch)  # [bucket, V]
        else:
            entry.graph.replay()
            logits = entry.logits
        return logits[:num_tokens].clone() if rows is None else logits[rows]

    def _run(self, batch: PaddedBatch) -> torch.Tensor:
        """The captured work: the model over a padded batch -> logits [bucket, V] float32."""
        runner = self.runner
        hidden = runner.model(batch.tokens, batch.positions, runner.cache, batch.slots, batch.mask)
        return runner.logits(hidden)

    def _capture_one(self, batch: PaddedBatch, pool: object) -> _Graph:
        """Eager warm-up on a side stream (compiles kernels, sizes tables), then the capture."""
        stream = torch.cuda.Stream(self.runner.device)
        stream.wait_stream(torch.cuda.current_stream(self.runner.device))
        with torch.cuda.stream(stream):
            for _ in range(WARMUP_RUNS):
                self._run(batch)
        torch.cuda.current_stream(self.runner.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            logits = self._run(batch)
        return _Graph(batch, graph, logits)


def attach(runner: ModelRunner, buckets: Sequence[int]) -> None:
    """Give `runner` captured graphs for these buckets when its device is CUDA (no-op elsewhere);
    ModelRunner.forward hands covered calls to `runner.graphs`."""
    if runner.device.type == "cuda":
        runner.graphs = GraphRunner(runner, buckets).capture()
