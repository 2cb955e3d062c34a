"""The prompt cache: a request keeps the KV of the prefix it shares with an earlier text (the live
cache's, or one in the store), and its tokens are exactly those of a request that keeps nothing."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from swiftspec.cache.kv_cache import KVCache
from swiftspec.cache.prompt_store import PromptStore, common_prefix
from swiftspec.config import TreeConfig
from swiftspec.engines import chain_config
from swiftspec.engines.ar import AutoregressiveEngine
from swiftspec.engines.serial import SerialEngine
from swiftspec.sampling import SamplingParams
from swiftspec.speculate import LookupDrafter, TreeDrafter

LEN = 256
TREE = TreeConfig(depth=2, draft_context=16)  # a windowed draft: its own window is cached too
MODES = ("ar", "chain", "tree", "lookup")


def build(mode: str, target, draft, store: PromptStore | None):
    if mode == "ar":
        return AutoregressiveEngine(target, LEN, store)
    if mode == "lookup":
        return SerialEngine(target, LookupDrafter(TREE), TREE, LEN, store=store)
    cfg = chain_config(TREE) if mode == "chain" else TREE
    return SerialEngine(target, TreeDrafter(draft.model, cfg, LEN), cfg, LEN, store=store)


def run(engine, prompt, n=16, params=SamplingParams(), **kw):
    generation = engine.generate(prompt, params, n, **kw)
    return [t for chunk in generation for t in chunk], generation.stats


def session(rng: random.Random) -> list[list[int]]:
    """Prompts as editors and chats send them: a file, the same file edited near its end, a chat's
    next turn (the last prompt and more), another file, the first file again, an identical one."""
    first = [rng.randrange(3, 500) for _ in range(60)]
    edited = first[:50] + [rng.randrange(3, 500) for _ in range(12)]
    other = [rng.randrange(3, 500) for _ in range(40)]
    return [first, edited, edited + [rng.randrange(3, 500) for _ in range(9)], other, first, first]


@pytest.mark.parametrize("mode", MODES)
def test_hits_give_the_tokens_of_a_cold_prefill(mode, tiny_target, tiny_draft, monkeypatch) -> None:
    """Greedy and seeded sampling: every request of a session equals the same request with the
    cache off (reuse=False on an engine of its own), and the hits keep what they should."""
    monkeypatch.setattr("swiftspec.runner.model_runner.STORE_AFTER", 0)  # these texts are short: store each one
    monkeypatch.setattr("swiftspec.runner.model_runner.PREFILL_CHUNK", 8)  # and chunks to match
    rng = random.Random(1)
    cached = build(mode, tiny_target, tiny_draft, PromptStore(64 << 20))
    cold = build(mode, tiny_target, tiny_draft, None)
    for params in (SamplingParams(), SamplingParams(temperature=0.8, top_p=0.9, seed=7)):
        kept = []
        for prompt in session(rng):
            want, _ = run(cold, prompt, params=params, reuse=False)
            estimate = cached.cached_prefix(prompt)  # admission's estimate, by prefill's own rules
            got, stats = run(cached, prompt, params=params)
            assert estimate == stats.cached_tokens
            assert got == want, (mode, params, len(kept))
            kept.append(stats.cached_tokens)
        # the target keeps whole 8-token chunks that a cold prefill computes alike: edited 48 of the
        # 50 it shares; the next turn edited's 56 (its last chunk and the answer are computed anew);
        # `other` nothing; the first file, from the store, 56; the identical prompt all of itself
        assert kept == [0, 48, 56, 0, 56, 60], kept


@pytest.mark.parametrize("mode", MODES)
def test_quantized_targets_keep_any_prefix_of_prefill_rows(mode, tiny_int8_target, tiny_draft, monkeypatch) -> None:
    """A target whose rows do not depend on their call (int8 linears, ModelRunner.any_prefix) keeps
    every shared token a prefill computed, chunk-aligned or not, leaving the MIN_PREFILL_ROWS its
    recompute call needs; decode rows are computed anew.  Tokens equal a cold prefill's."""
    from swiftspec.kernels import cpu_ext
    if not cpu_ext.available("quant_linear"):
        pytest.skip("no quantized kernel here")
    monkeypatch.setattr("swiftspec.runner.model_runner.STORE_AFTER", 0)
    rng = random.Random(1)
    cached = build(mode, tiny_int8_target, tiny_draft, PromptStore(64 << 20))
    cold = build(mode, tiny_int8_target, tiny_draft, None)
    assert (cached.runner if mode == "ar" else cached.target.runner).any_prefix
    kept = []
    for prompt in session(rng):
        want, _ = run(cold, prompt, reuse=False)
        estimate = cached.cached_prefix(prompt)
        got, stats = run(cached, prompt)
        assert estimate == stats.cached_tokens and got == want, (mode, len(kept))
        kept.append(stats.cached_tokens)
    # each keeps all it shares but the 17 rows of its one call (MIN_PREFILL_ROWS): edited 45 of 50,
    # the next turn 54 of edited's 62 (the 16 answer rows are decode rows: never kept), the first
    # file from the store 43 of 60; the identical prompt all of itself
    assert kept == [0, 45, 54, 0, 43, 60], kept


def test_a_quantized_chat_turn_keeps_all_of_the_last_prompt(tiny_int8_target, tiny_draft) -> None:
    """The next turn of a chat keeps every row the last prefill computed, whatever its length
    (not only whole chunks), and computes the answer and the new message."""
    engine = build("tree", tiny_int8_target, tiny_draft, None)
    prompt = list(range(40, 77))
    out, _ = run(engine, prompt)
    turn = prompt + out + list(range(200, 220))
    again, stats = run(engine, turn)
    assert stats.cached_tokens == len(prompt)
    assert again == run(build("tree", tiny_int8_target, tiny_draft, None), turn, reuse=False)[0]


def test_a_repeated_prompt_copies_nothing_into_the_store(tiny_target) -> None:
    """A prefill that would overwrite no more than STORE_AFTER tokens of the live text (here the last
    answer) leaves the store alone: the repeat costs no copy."""
    store = PromptStore(64 << 20)
    engine = AutoregressiveEngine(tiny_target, LEN, store)
    prompt = list(range(20, 120))
    run(engine, prompt)
    _, stats = run(engine, prompt)
    assert stats.cached_tokens == len(prompt) and store.stats.saved == 0
    run(engine, list(range(300, 400)))  # another text: the last one (116 tokens) is overwritten, so stored
    assert store.stats.saved == 1 and store.entries[0].tokens.tolist()[:100] == prompt


def test_a_chat_turn_keeps_the_last_prompts_whole_chunks(tiny_target, tiny_draft, monkeypatch) -> None:
    """A chat's next turn: the target keeps the last prompt's whole chunks, and computes its last
    chunk and the answer in the shapes a cold prefill gives them (decode steps compute rows in
    other shapes); the tokens are a cold prefill's."""
    monkeypatch.setattr("swiftspec.runner.model_runner.PREFILL_CHUNK", 4)
    engine = build("tree", tiny_target, tiny_draft, None)
    assert not engine.target.runner.any_prefix  # fp32 torch linears: rows depend on their call
    prompt = [5, 9, 14, 3, 22, 71, 8]
    out, _ = run(engine, prompt)
    assert len(out) == 16
    turn = prompt + out + [40, 41]
    again, stats = run(engine, turn)
    assert stats.cached_tokens == 4  # the first whole chunk of the 7-token prompt
    assert again == run(build("tree", tiny_target, tiny_draft, None), turn, reuse=False)[0]


@pytest.mark.parametrize("mode", ("ar", "tree"))
def test_reuse_off_prefills_everything_and_warmup_only_fills(mode, tiny_target, tiny_draft) -> None:
    engine = build(mode, tiny_target, tiny_draft, PromptStore(64 << 20))
    prompt = list(range(10, 70))
    out, stats = run(engine, prompt, n=0)  # llama.vim's warm-up: n_predict 0
    assert out == [] and stats.new_tokens == 0
    _, stats = run(engine, prompt, reuse=False)  # cache_prompt: false
    assert stats.cached_tokens == 0
    _, stats = run(engine, prompt)
    assert stats.cached_tokens == len(prompt)  # the same prompt: its KV and its last logits stand


@pytest.mark.parametrize("mode", MODES)
def test_a_prefill_stops_between_chunks_and_the_engine_goes_on(mode, tiny_target, tiny_draft, monkeypatch) -> None:
    """should_stop is asked between prefill chunks: a request stopped there yields nothing, and
    the chunks it did compute serve the next request, whose tokens are a cold prefill's."""
    monkeypatch.setattr("swiftspec.runner.model_runner.PREFILL_CHUNK", 16)
    engine = build(mode, tiny_target, tiny_draft, None)
    prompt = list(range(30, 130))
    asked = []
    out, _ = run(engine, prompt, should_stop=lambda: asked.append(1) or len(asked) > 3)
    assert out == [] and len(asked) == 4
    got, stats = run(engine, prompt)
    assert stats.cached_tokens == 48  # the three chunks done before the stop
    assert got == run(build(mode, tiny_target, tiny_draft, None), prompt, reuse=False)[0]


def cache_of(tokens: int) -> KVCache:
    cache = KVCache(2, 64, 1, 4, torch.float32)
    cache.k.normal_(), cache.v.normal_()
    return cache


def test_the_store_evicts_the_least_recently_used_within_its_bound() -> None:
    cache = cache_of(64)
    per_token = 2 * cache.k[:, :1].nbytes
    store = PromptStore(100 * per_token)
    a, b, c = [1] * 40, [2] * 40, [3] * 40
    store.save(a, cache)
    store.save(b, cache)
    hit = store.match(np.array(a + [9]))
    assert hit.length == 40
    store.load(hit, cache)  # a is used again: b is now the older
    store.save(c, cache)
    assert {int(e.tokens[0]) for e in store.entries} == {1, 3} and store.nbytes <= store.budget_bytes
    assert store.stats.evicted == 1 and store.match(np.array(b)).entry is None


def test_the_store_keeps_one_entry_per_conversation_and_copies_exactly() -> None:
    cache = cache_of(64)
    store = PromptStore(1 << 20)
    turn = list(range(100, 130))
    store.save(turn[:20], cache)
    store.save(turn, cache)  # the next turn begins with the last: one entry, the longer
    store.save(turn[:25], cache)  # begins a stored text: nothing new
    assert len(store.entries) == 1 and store.entries[0].tokens.size == 30
    match = store.match(np.array(turn[:28] + [7]))
    assert match.length == 28
    other = cache_of(64)
    store.load(match, other)
    assert torch.equal(other.k[:, :28], cache.k[:, :28]) and torch.equal(other.v[:, :28], cache.v[:, :28])
    assert store.stats.hits == 1 and store.stats.lookups == 1
    assert common_prefix(np.array([1, 2, 3]), np.array([1, 2])) == 2 and common_prefix(np.array([4]), np.array([5])) == 0
    store.save([1] * 5, cache)  # too short to be worth a copy
    assert len(store.entries) == 1



def test_a_prefill_call_reads_whole_key_blocks_whatever_the_cache_length(tiny_int8_target) -> None:
    """The ar engine's cache (max_seq_len + 1 slots) and the verifier's (+ verify_size + 1) differ in
    length: a prefill call's keys are padded to whole KEY_BLOCKs in both (the CPU cache holds whole
    blocks), so its rows get the same bits (padded only up to a cache's end, a call over 257 keys
    and one over 265 gave the real pair's bf16 rows other bits, and tree parted from ar at near-ties;
    tests/slow/test_real_pair_lossless checks those bits)."""
    from swiftspec.runner.model_runner import KEY_BLOCK, ModelRunner
    prompt = [random.Random(3).randrange(3, 500) for _ in range(40)]
    runners = [ModelRunner(tiny_int8_target.model, n, max_nodes=8, exact=True) for n in (57, 265, 1024)]
    assert [r.cache.max_len for r in runners] == [KEY_BLOCK, KEY_BLOCK, 2 * KEY_BLOCK]
    assert {r.prefix_mask(0, len(prompt)).shape for r in runners} == {(len(prompt), KEY_BLOCK)}
    want = runners[0].prefill(prompt, reuse=False).logits  # [1, V]
    assert all(torch.equal(r.prefill(prompt, reuse=False).logits, want) for r in runners[1:])
