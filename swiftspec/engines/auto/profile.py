"""Measures a model pair on this machine for `--mode auto`: forward costs per row count, alone and
on the async groups' cores, and per draft weight format the draft's guesses along the built-in
texts (teacher forcing: one prefill per model).  `profile_pair` returns a PairProfile."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import os
import time

import torch

from swiftspec.config import ConfigError, EngineConfig
from swiftspec.engines.auto.predict import Costs, DraftProfile, PairProfile, Position
from swiftspec.engines.auto.texts import Text, builtin_texts
from swiftspec.parallel.cores import Lane, plan_cores
from swiftspec.parallel.groups import Layout
from swiftspec.runner.load import check_pair, load_target
from swiftspec.runner.model_runner import ModelRunner, causal_mask
from swiftspec.speculate import build_drafter
from swiftspec.tokenizer import Tokenizer
from swiftspec.weights.loaded_model import LoadedModel
from swiftspec.weights.loader import load_model

TARGET_ROWS = (1, 4, 8)  # row counts timed: decode, chain and tree verification (linear in between and beyond)
DRAFT_ROWS = (1, 4, 8)  # a chain's leaf, a focused and a full-width tree expansion
TARGET_REPEATS = 2  # timed forwards per row count after one untimed; the fastest counts
DRAFT_REPEATS = 3  # draft forwards are short, and the more exposed to other work on the machine
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


def _timed_forward(runner: ModelRunner, n: int) -> float:
    """Seconds of one forward of n chained rows behind the runner's prefix (never committed)."""
    start, device = runner.kv.prefix_len, runner.device
    tokens = torch.arange(n, device=device) + 100  # [n]
    slots = torch.arange(start, start + n, device=device)  # [n]
    mask = torch.cat([torch.ones(n, start, dtype=torch.bool, device=device),
                      torch.ones(n, n, dtype=torch.bool, device=device).tril()], 1)  # [n, start + n]
    t = time.perf_counter()
    runner.forward(tokens, slots, slots, mask)
    _sync(device)
    return time.perf_counter() - t


def _timed_forwards(runner: ModelRunner, rows: tuple[int, ...]) -> list[float]:
    return [_timed_forward(runner, n) for n in rows]


def forward_costs(runner: ModelRunner, rows: tuple[int, ...], lanes: tuple[Lane, ...], repeats: int) -> list[Costs]:
    """For each lane (Lane(): the calling thread, as the serial engines run; else pinned as the
    async groups run), the fastest of `repeats` forwards of n rows, for each n.  Passes alternate
    between the lanes, so that a burst of other work on the machine falls on all of them alike; a
    first pass is untimed.

    More rows never cost less, and other work only ever slows a forward down: so each cost is the
    least measured at that row count or any larger one."""
    best = [[float("inf")] * len(rows) for _ in lanes]
    for rep in range(repeats + 1):
        for p, lane in enumerate(lanes):
            times = lane.run(_timed_forwards, runner, rows)
            if rep:
                best[p] = [min(a, b) for a, b in zip(best[p], times)]
    return [Costs(rows=rows, seconds=tuple(min(b[i:]) for i in range(len(b)))) for b in best]


def teacher_forced(runner: ModelRunner, text: Text) -> torch.Tensor:
    """Logits [n, V] predicting each of the text's n continuation tokens from the text before it;
    leaves the whole text in the runner's prefix."""
    runner.kv.reset()
    device = runner.device
    ids = torch.tensor(text.ids, device=device)  # [T]
    slots = runner.kv.append_prefix(list(text.ids))  # [T]
    rows = torch.arange(text.prompt_len - 1, len(text.ids) - 1, device=device)  # [n]
    return runner.forward(ids, slots, slots, causal_mask(0, len(text.ids), device), rows=rows)


def profile_pair(config: EngineConfig, draft_formats: tuple[str, ...]) -> PairProfile:
    """Load the target, then each draft format in turn (one model in memory at a time), and measure."""
    start = time.perf_counter()
    place = Placement.of(config)
    target = load_target(config.target, config.target_load)
    texts = builtin_texts(target.tokenizer)
    runner = ModelRunner(target.model, max(len(t.ids) for t in texts) + 2 * TARGET_ROWS[-1], TARGET_ROWS[-1])
    greedy = [teacher_forced(runner, t).argmax(-1).cpu() for t in texts]  # [n] each
    with contextlib.closing(Lane(place.target, "profile-target")) as lane:
        alone, grouped = forward_costs(runner, TARGET_ROWS, (Lane(), lane), TARGET_REPEATS)
    load = config.target_load
    target_bytes = target.args.weight_bytes(load.dtype, load.weights)
    tokenizer, target_rows = target.tokenizer, target.args.vocab_size
    del target, runner
    gc.collect()
    drafts, draft_bytes = [], {}
    loaded = _load_draft(config, tokenizer, target_rows)
    for i, fmt in enumerate(draft_formats):
        last = i == len(draft_formats) - 1  # the others pack a copy of the loaded weights
        draft = loaded if last else dataclasses.replace(loaded, model=copy.deepcopy(loaded.model))
        try:
            drafts.append(_profile_draft(config, fmt, draft, texts, greedy, place))
        except ValueError:  # shapes this format cannot pack (int4 groups must divide each row)
            continue
        finally:
            del draft
            gc.collect()
        draft_bytes[fmt] = loaded.args.weight_bytes(config.draft_load.dtype, fmt, drafts[-1].head_rows)
    if not drafts:
        raise ConfigError(f"the draft packs in none of the weight formats {', '.join(draft_formats)}")
    devices = torch.cuda.device_count() if load.device.startswith("cuda") else 0
    return PairProfile(device="cuda" if devices else "cpu", cores=place.cores,
                       target_cores=len(place.target or []) or place.cores, devices=devices,
                       target_bytes=target_bytes, draft_bytes=draft_bytes, target_alone=alone,
                       target_grouped=grouped, drafts=tuple(d.profile for d in drafts),
                       seconds=time.perf_counter() - start)


def _load_draft(config: EngineConfig, target_tokenizer: Tokenizer, target_rows: int) -> LoadedModel:
    """The draft's unpacked weights, loaded once for every format (packing happens per format)."""
    draft = load_model(config.draft, config.draft_load)
    check_pair(target_tokenizer, draft.tokenizer, target_rows, draft.args.vocab_size)
    return draft


@dataclasses.dataclass(frozen=True, slots=True)
class _Draft:
    profile: DraftProfile
    head_rows: int | None  # rows of its pruned LM head (None: the whole vocabulary)


def _profile_draft(config: EngineConfig, fmt: str, draft: LoadedModel, texts: list[Text],
                   greedy: list[torch.Tensor], place: Placement) -> _Draft:
    """The draft packed as fmt, as the engines build it (pruned LM head, packed weights)."""
    drafter = build_drafter(draft, config.tree, max(len(t.ids) for t in texts) + 2 * DRAFT_ROWS[-1],
                            config.draft_vocab, fmt)
    runner = drafter.runner
    guesses = tuple(_positions(teacher_forced(runner, t), drafter.vocab_map, g, t)
                    for t, g in zip(texts, greedy))
    with contextlib.closing(Lane(place.draft, "profile-draft")) as lane:
        alone, grouped = forward_costs(runner, DRAFT_ROWS, (Lane(), lane), DRAFT_REPEATS)
    head_rows = None if drafter.vocab_map is None else drafter.vocab_map.numel()
    return _Draft(DraftProfile(weights=fmt, alone=alone, grouped=grouped, texts=guesses), head_rows)


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
