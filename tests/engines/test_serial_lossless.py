"""Serial chain and tree speculation are lossless: greedy and seeded sampling are token-exact
against ar, and ar's sampling keeps p."""

from __future__ import annotations

import itertools
import random

import pytest

from conftest import FP32
from spec_stats import exact_distribution, first_tokens, goodness_of_fit
from swiftspec.config import ConfigError, TreeConfig
from swiftspec.engines import chain_config
from swiftspec.engines.ar import AutoregressiveEngine
from swiftspec.engines.serial import SerialEngine
from swiftspec.sampling import SamplingParams
from swiftspec.speculate import LookupDrafter, TreeDrafter
from swiftspec.speculate.costs import RoundCosts, RoundTimes
from swiftspec.speculate.drafter import context_window
from swiftspec.speculate.fallback import Fallback
from swiftspec.weights.loader import load_model

LOOPING_PROMPT = [11, 42, 7, 11, 42, 7, 11, 42, 7, 11]  # prompt lookup finds continuations in it


def generate_all(engine, prompt, params, n):
    return [t for chunk in engine.generate(prompt, params, n) for t in chunk]


def random_tree(rng: random.Random) -> TreeConfig:
    width, topk = rng.randint(1, 8), rng.randint(1, 8)
    bs = rng.randint(1, 12)
    return TreeConfig(width=width, topk=topk, verify_size=bs, depth=rng.randint(1, 5),
                      budget=bs + width * topk + rng.randint(0, 64), chain_length=rng.randint(1, 6),
                      draft_context=rng.choice((0, 8, 16)))  # the draft reads a window of longer prompts


def test_greedy_tree_and_chain_equal_ar_over_50_prompts(tiny_target, tiny_draft) -> None:
    rng = random.Random(0)
    ar = AutoregressiveEngine(tiny_target, 256)
    for i in range(50):
        prompt = [rng.randrange(3, 500) for _ in range(rng.randint(1, 30))]
        cfg = random_tree(rng)
        want = generate_all(ar, prompt, SamplingParams(), 32)
        tree = SerialEngine(tiny_target, TreeDrafter(tiny_draft.model, cfg, 256), cfg, 256)
        assert generate_all(tree, prompt, SamplingParams(), 32) == want, (i, cfg)
        chain = SerialEngine(tiny_target, TreeDrafter(tiny_draft.model, chain_config(cfg), 256), chain_config(cfg), 256)
        assert generate_all(chain, prompt, SamplingParams(), 32) == want, (i, cfg)


def test_context_window_keeps_the_sinks_and_the_last_tokens() -> None:
    prompt = list(range(100))
    assert context_window(prompt, 0) == prompt and context_window(prompt, 100) == prompt
    assert context_window(prompt, 10) == [0, 1, 2, 3, 94, 95, 96, 97, 98, 99]
    with pytest.raises(ConfigError):
        TreeConfig(draft_context=4)


def test_a_fim_prompt_windows_the_text_around_the_cursor() -> None:
    """With a focus token (FIM's suffix marker), the window keeps the sinks, the tokens before the
    marker, the marker and the start of the suffix, and the prompt's last token (FIM's middle)."""
    prompt = list(range(100, 400)) + [1]  # 1: the last token, after the suffix
    prompt[250] = 7  # the suffix marker: the cursor sits before it
    window = context_window(prompt, 40, focus=7)
    assert window == prompt[:4] + prompt[224:250] + [7] + prompt[251:259] + [1] and len(window) == 40
    assert context_window(prompt, 40, focus=8) == context_window(prompt, 40)  # no marker: the plain window
    assert context_window(prompt, 0, focus=7) == prompt


def test_windowed_draft_context_stays_token_exact_and_reads_the_window(tiny_target, tiny_draft) -> None:
    """A 200-token prompt with draft_context 16: the draft prefills 16 tokens (the first 4 and the
    last 12), prompt lookup still reads the whole prompt, and greedy output equals ar's."""
    rng = random.Random(2)
    base = [rng.randrange(3, 500) for _ in range(20)]
    prompt = (base * 10)[:200]
    want = generate_all(AutoregressiveEngine(tiny_target, 256), prompt, SamplingParams(), 32)
    cfg = TreeConfig(draft_context=16)
    drafter = TreeDrafter(tiny_draft.model, cfg, 256)
    assert generate_all(SerialEngine(tiny_target, drafter, cfg, 256), prompt, SamplingParams(), 32) == want
    assert drafter.lookup.grafted > 0
    drafter.start(prompt, want[0], SamplingParams())
    assert drafter.runner.kv.prefix_len == 16


def test_greedy_with_lookup_candidates_equals_ar(tiny_target, tiny_draft) -> None:
    """Repetitive prompts, so prompt lookup grafts branches: the mixed tree (and lookup alone,
    --draft-model none) stays token-exact."""
    rng = random.Random(1)
    ar = AutoregressiveEngine(tiny_target, 256)
    grafted = 0
    for i in range(16):
        base = [rng.randrange(3, 500) for _ in range(rng.randint(2, 8))]
        prompt = base * rng.randint(2, 4) + base[: rng.randint(0, len(base))]
        cfg = random_tree(rng)
        want = generate_all(ar, prompt, SamplingParams(), 32)
        for drafter in (TreeDrafter(tiny_draft.model, cfg, 256), LookupDrafter(cfg)):
            engine = SerialEngine(tiny_target, drafter, cfg, 256)
            assert generate_all(engine, prompt, SamplingParams(), 32) == want, (i, cfg, type(drafter))
            grafted += drafter.lookup.grafted
    assert grafted > 100


def test_tree_accepts_more_than_one_token_per_round(sharp_pair_dirs) -> None:
    """With the target as its own draft every greedy proposal on the best path is right.
    (adaptive=False: a draft as slow as the target is never worth a forward, so the cost rule would
    rightly stop drafting.)"""
    target = load_model(str(sharp_pair_dirs[0]), FP32)
    cfg = TreeConfig(depth=4, adaptive=False)
    eng = SerialEngine(target, TreeDrafter(target.model, cfg, 256), cfg, 256)
    generation = eng.generate([5, 6, 7], SamplingParams(), 40)
    list(generation)
    assert generation.stats.acceptance_length > 2.5


def test_sampled_tree_with_its_own_draft_accepts_like_greedy(sharp_pair_dirs) -> None:
    """With the target as its own draft, each leaf's first child is the draft's draw at the uniform
    the target draws with (tree.coupled_children), so every draw is proposed: at temperature 1
    the rounds accept about as deep as greedy ones (where top-k children would miss the draws
    outside the top k); and the text is ar's."""
    target = load_model(str(sharp_pair_dirs[0]), FP32)
    cfg = TreeConfig(depth=4, adaptive=False)
    eng = SerialEngine(target, TreeDrafter(target.model, cfg, 256), cfg, 256)
    params = SamplingParams(temperature=1.0, seed=7)
    generation = eng.generate([5, 6, 7], params, 40)
    tokens = [t for chunk in generation for t in chunk]
    assert generation.stats.acceptance_length > 3.0
    assert tokens == generate_all(AutoregressiveEngine(target, 256), [5, 6, 7], params, 40)


class _FixedCosts(RoundCosts):
    """Costs that ignore measured times, so an adaptive tree's shape is (nearly) reproducible."""

    def update(self, r: RoundTimes) -> None:
        pass


SAMPLES = 2500  # seeded ar requests of test_ar_sampling_matches_target_distribution (not fewer: docstring)
EXACT_SEEDS = 300  # seeded requests per mode that must give ar's tokens
SAMPLING = SamplingParams(temperature=0.8, top_p=0.95)


def seeded(seed: int) -> SamplingParams:
    return SamplingParams(temperature=0.8, top_p=0.95, seed=seed)


@pytest.fixture(scope="module")
def sharp_models(sharp_pair_dirs):
    """The sharp pair loaded once for the sampling tests, and ar's first 3 tokens after
    LOOPING_PROMPT for seeds 0 .. SAMPLES - 1."""
    target, draft = (load_model(str(d), FP32) for d in sharp_pair_dirs)
    ar = AutoregressiveEngine(target, 256)
    return target, draft, [first_tokens(ar, LOOPING_PROMPT, seeded(s), 3) for s in range(SAMPLES)]


def test_ar_sampling_matches_target_distribution(sharp_models) -> None:
    """At temperature 0.8, top-p 0.95, ar's first 3 tokens (position-keyed draws, sampling.Draws)
    follow the target's exact distribution; every speculative mode gives ar's tokens for every
    seed (test_sampled_speculation_gives_ars_tokens), so this is their distribution too.

    2500 requests (SAMPLES), threshold at z = 4.753 (spec_stats.Z_1E6).  False failures, by
    tests/engines/spec_power.py (2e6 simulated runs of this criterion under the exact
    distribution): 59 cells expect >= 5 samples, threshold 126.0, 7 failures in 2e6 = 3.5e-6 (the
    cells expecting 5-10 samples fatten the tail past chi-square's 1e-6).  Power: a sampler that
    draws a share x of its first 3 tokens from the draft's distribution (TV 0.98 from the target's)
    fails with probability 0.77 at x = 8% and 0.99 at 10%."""
    target, _, samples = sharp_models
    exact = exact_distribution(target.model, LOOPING_PROMPT, SAMPLING, target.tokenizer.eos_token_ids, 3)
    stat, threshold = goodness_of_fit(samples, exact)
    assert stat < threshold, (stat, threshold)


def sampled_engine(target, draft, mode: str) -> SerialEngine:
    """tree-adaptive: d = 3 and fixed costs (leaves below path probability 0.2 skipped, each row
    verified a third of a token) where the cost rules run; sampled rounds keep the fixed floor
    (SerialEngine._fixed_floor), so their subtrees are cut at SAMPLED_FLOOR.  The prompt repeats itself, so prompt lookup grafts branches into the trees (mixed
    with the draft's; alone in lookup-only)."""
    cfg = TreeConfig(depth=3 if mode == "tree-adaptive" else 2, budget=96)
    cfg = chain_config(cfg) if mode == "chain" else cfg
    drafter = LookupDrafter(cfg) if mode == "lookup-only" else TreeDrafter(draft.model, cfg, 256)
    engine = SerialEngine(target, drafter, cfg, 256)
    if mode == "tree-adaptive":
        engine.costs = _FixedCosts(expand_s=0.01, token_s=0.05, verify_s=[0.05 * (2 + n) / 3 for n in range(8)])
    return engine


@pytest.mark.parametrize("mode", ["tree", "chain", "tree-adaptive", "lookup-only"])
def test_sampled_speculation_gives_ars_tokens(sharp_models, mode) -> None:
    """Every seeded request gives ar's first 3 tokens (EXACT_SEEDS seeds), over trees the draft
    and prompt lookup grow and rounds that accept several tokens: a position's token is the same
    draw whichever round reaches it, so sampled speculation keeps p exactly."""
    target, draft, want = sharp_models
    engine = sampled_engine(target, draft, mode)
    got = [first_tokens(engine, LOOPING_PROMPT, seeded(s), 3) for s in range(EXACT_SEEDS)]
    assert got == want[:EXACT_SEEDS]
    generation = engine.generate(LOOPING_PROMPT, seeded(0), 24)
    tokens = [t for chunk in generation for t in chunk]
    assert tokens == generate_all(AutoregressiveEngine(target, 256), LOOPING_PROMPT, seeded(0), 24)
    assert generation.stats.acceptance_length > 1.2  # rounds do accept draft tokens
    assert mode == "chain" or engine.drafter.lookup.grafted > 100


@pytest.mark.parametrize("plant", ["argmax", "mirrored-uniform"])
def test_a_planted_wrong_draw_is_caught(sharp_models, monkeypatch, plant) -> None:
    """Planted verifiers: one that takes the target's argmax where it should sample (the wrong
    distribution), one that draws with 1 - u (the right distribution, the wrong tokens).  Both
    give other tokens than ar within EXACT_SEEDS seeds."""
    from swiftspec.verify import greedy

    real = greedy.sample_at
    if plant == "argmax":
        monkeypatch.setattr(greedy, "sample_at", lambda probs, uniforms: probs.argmax(-1))
    else:
        monkeypatch.setattr(greedy, "sample_at", lambda probs, uniforms: real(probs, 1 - uniforms))
    target, draft, want = sharp_models
    engine = sampled_engine(target, draft, "tree")
    got = [first_tokens(engine, LOOPING_PROMPT, seeded(s), 3) for s in range(EXACT_SEEDS)]
    assert sum(g != w for g, w in zip(got, want)) > 10


def test_same_seed_same_output(sharp_pair_dirs) -> None:
    """Also with prompt lookup, whose rates learn from earlier requests (they shape the trees, never the tokens)."""
    target, draft = (load_model(str(d), FP32) for d in sharp_pair_dirs)
    engine = SerialEngine(target, TreeDrafter(draft.model, TreeConfig(depth=2), 256), TreeConfig(depth=2), 256)
    params = SamplingParams(temperature=1.0, seed=123)
    first = generate_all(engine, LOOPING_PROMPT, params, 20)
    generate_all(engine, LOOPING_PROMPT, SamplingParams(), 20)  # a greedy request teaches the rates
    assert generate_all(engine, LOOPING_PROMPT, params, 20) == first


@pytest.mark.parametrize("params", [SamplingParams(), seeded(1)], ids=["greedy", "sampled"])
def test_plain_rounds_of_the_fallback_give_ars_tokens(sharp_models, monkeypatch, params) -> None:
    """With TreeConfig.fallback, rounds that draft nothing (the root alone, the draft queueing the
    tokens for its next forward) between drafting rounds: ar's tokens, the plain rounds counted."""
    target, draft, _ = sharp_models
    turns = itertools.cycle([True, True, False, False, False])  # stretches of plain rounds in between
    monkeypatch.setattr(Fallback, "drafts", lambda self: next(turns))
    cfg = TreeConfig(depth=2, budget=96, fallback=True)
    engine = SerialEngine(target, TreeDrafter(draft.model, cfg, 256), cfg, 256)
    generation = engine.generate(LOOPING_PROMPT, params, 40)
    tokens = [t for chunk in generation for t in chunk]
    assert tokens == generate_all(AutoregressiveEngine(target, 256), LOOPING_PROMPT, params, 40)
    stats = generation.stats
    assert stats.plain_rounds >= 5 and stats.rounds - stats.plain_rounds >= 3
    assert max(stats.accept_lengths) > 1  # the drafting rounds still accept draft tokens
