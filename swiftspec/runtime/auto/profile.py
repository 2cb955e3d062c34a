"""Measures a model pair on this machine for `--mode auto`: forward costs per row count, alone and
on the async groups' cores, and per draft weight format the draft's guesses along the built-in
texts (teacher forcing: one prefill per model).  `profile_pair` returns a PairProfile."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import time

import torch

from swiftspec.config import EngineConfig
from swiftspec.parallel.groups import Layout, pinned, plan_cores
from swiftspec.runtime.auto.model import Costs, DraftProfile, PairProfile, Position
from swiftspec.runtime.auto.texts import Text, builtin_texts
from swiftspec.runtime.runner import ModelRunner, causal_mask

TARGET_ROWS = (1, 2, 4, 8)  # row counts timed: decode, chain and tree verification (linear beyond)
DRAFT_ROWS = (1, 2, 4, 8)  # one leaf, the pending token, focused and full-width expansions
TARGET_REPEATS = 2  # timed forwards per row count after one untimed; the fastest counts
DRAFT_REPEATS = 4  # draft forwards are short, and the more exposed to other work on the machine
TOPK = 8  # draft candidates kept per position


@dataclasses.dataclass(frozen=True, slots=True)
class Placement:
    """Cores of the serial engines and of each async group (None: do not pin, e.g. on CUDA)."""

    target: list[int] | None
    draft: list[int] | None
    cores: int

    @staticmethod
    def of(config: EngineConfig) -> "Placement":
        cores = sorted(os.sched_getaffinity(0))
        if config.target_load.device.startswith("cuda"):
            return Placement(None, None, len(cores))
        layout = Layout(target_tp=1, draft_tp=1)
        return Placement(plan_cores(layout, 0, config.draft_cores), plan_cores(layout, 1, config.draft_cores),
                         torch.get_num_threads())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def forward_costs(runner: ModelRunner, rows: tuple[int, ...], cores: list[int] | None, repeats: int) -> Costs:
    """Fastest of `repeats` forwards of n chained rows after the runner's prefix, for each n.

    More rows never cost less, and other work on the machine only ever slows a forward down: so
    each cost is the least measured at that row count or any larger one."""
    start, device = runner.kv.prefix_len, runner.device
    seconds = []
    with pinned(cores) if cores else contextlib.nullcontext():
        for n in rows:
            tokens = torch.arange(n, device=device) + 100  # [n]
            slots = torch.arange(start, start + n, device=device)  # [n], behind the prefix (never committed)
            mask = torch.cat([torch.ones(n, start, dtype=torch.bool, device=device),
                              torch.ones(n, n, dtype=torch.bool, device=device).tril()], 1)  # [n, start + n]
            times = []
            for _ in range(repeats + 1):
                t = time.perf_counter()
                runner.forward(tokens, slots, slots, mask)
                _sync(device)
                times.append(time.perf_counter() - t)
            seconds.append(min(times[1:]))
    least = [min(seconds[i:]) for i in range(len(seconds))]
    return Costs(rows=rows, seconds=tuple(least))


def teacher_forced(runner: ModelRunner, text: Text) -> torch.Tensor:
    """Logits [n, V] predicting each of the text's n continuation tokens from the text before it;
    leaves the whole text in the runner's prefix."""
    runner.kv.reset()
    device = runner.device
    ids = torch.tensor(text.ids, device=device)  # [T]
    slots = runner.kv.append_prefix(len(text.ids))  # [T]
    rows = torch.arange(text.prompt_len - 1, len(text.ids) - 1, device=device)  # [n]
    return runner.forward(ids, slots, slots, causal_mask(0, len(text.ids), device), rows=rows)


def profile_pair(config: EngineConfig, draft_formats: tuple[str, ...]) -> PairProfile:
    """Load the target, then each draft format in turn (one model in memory at a time), and measure."""
    from swiftspec.runtime import load_target

    start = time.perf_counter()
    place = Placement.of(config)
    target = load_target(config.target, config.target_load)
    texts = builtin_texts(target.tokenizer)
    runner = ModelRunner(target.model, max(len(t.ids) for t in texts) + 2 * TARGET_ROWS[-1], TARGET_ROWS[-1])
    greedy = [teacher_forced(runner, t).argmax(-1).cpu() for t in texts]  # [n] each
    alone = forward_costs(runner, TARGET_ROWS, None, TARGET_REPEATS)
    grouped = forward_costs(runner, TARGET_ROWS, place.target, TARGET_REPEATS)
    load = config.target_load
    target_bytes = target.args.weight_bytes(load.dtype, load.weights)
    tokenizer = target.tokenizer
    del target, runner
    gc.collect()
    drafts = []
    draft_bytes = {}
    for fmt in draft_formats:
        draft, nbytes = _profile_draft(config, fmt, texts, greedy, place, tokenizer)
        drafts.append(draft)
        draft_bytes[fmt] = nbytes
        gc.collect()
    devices = torch.cuda.device_count() if load.device.startswith("cuda") else 0
    return PairProfile(device="cuda" if devices else "cpu", cores=place.cores,
                       target_cores=len(place.target or []) or place.cores, devices=devices,
                       target_bytes=target_bytes, draft_bytes=draft_bytes, target_alone=alone,
                       target_grouped=grouped, drafts=tuple(drafts), seconds=time.perf_counter() - start)


def _profile_draft(config: EngineConfig, fmt: str, texts: list[Text], greedy: list[torch.Tensor],
                   place: Placement, target_tokenizer) -> tuple[DraftProfile, int]:
    """The draft in weight format fmt, as the engines build it (pruned LM head, packed weights)."""
    from swiftspec.draft import build_drafter
    from swiftspec.runtime import check_pair
    from swiftspec.weights import load_model

    load = dataclasses.replace(config.draft_load, weights=fmt)
    draft = load_model(config.draft, load)
    check_pair(target_tokenizer, draft.tokenizer)
    drafter = build_drafter(draft, config.tree, max(len(t.ids) for t in texts) + 2 * DRAFT_ROWS[-1],
                            config.draft_vocab, fmt)
    runner = drafter.runner
    guesses = tuple(_positions(teacher_forced(runner, t), drafter.vocab_map, g, t)
                    for t, g in zip(texts, greedy))
    alone = forward_costs(runner, DRAFT_ROWS, None, DRAFT_REPEATS)
    grouped = forward_costs(runner, DRAFT_ROWS, place.draft, DRAFT_REPEATS)
    head_rows = None if drafter.vocab_map is None else drafter.vocab_map.numel()
    nbytes = draft.args.weight_bytes(load.dtype, fmt, head_rows)
    return DraftProfile(weights=fmt, alone=alone, grouped=grouped, texts=guesses), nbytes


def _positions(logits: torch.Tensor, vocab_map: torch.Tensor | None, greedy: torch.Tensor,
               text: Text) -> tuple[Position, ...]:
    """Where the draft (logits [n, V'] over its head's rows) ranks the target's greedy tokens [n]."""
    logprobs, rows = torch.log_softmax(logits.float(), -1).topk(TOPK, dim=-1)  # [n, k]
    tokens = (rows if vocab_map is None else vocab_map[rows]).cpu()  # [n, k] token ids
    hits = tokens == greedy[:, None]  # [n, k]
    ranks = torch.where(hits.any(-1), hits.float().argmax(-1) + 1, 0).tolist()
    cont = text.ids[text.prompt_len:]
    return tuple(Position(on_path=cont[j] == int(greedy[j]), rank=ranks[j], logprobs=tuple(lp))
                 for j, lp in enumerate(logprobs.cpu().tolist()))
