"""The real default pair: chain, tree and async greedy output equals `ar` on a HumanEval prompt (and
the tree's seeded sampled output too, with gguf weights),
with bf16, int4 and gguf (the file's K-quant blocks as stored) target weights, at the lowest (AVX2) and the highest ISA level this CPU
runs.  The avx2-vnni level needs no run of its own: its only kernels of its own, the int8/int4 and
K-quant linears, give the AVX2 path's bits (test_kernels, test_gguf_kernels), so its engines
compute what the avx2 ones do.  Below the highest level, `ar` and `tree` run every kernel path of
that level (one-row decode, multi-row verification, the draft's rows); chain, async and sampling
add engine code, which no ISA level changes, and run at the highest level.

One prompt serves every case: HumanEval/5's greedy continuation (52 to 106 tokens, by format) ends at
EOS, and its chain rounds accept the whole chain, part of it or none of it; tree and async rounds
can also accept prompt-lookup branches deeper than the draft's (seen with bf16 and gguf weights).
(It replaced HumanEval/0-2 to 128 tokens: under a third of their tokens, the same kinds of rounds.)

Where the CPU kernels run, every linear and attention call of a decode, verify or draft forward is
batch- and layout-invariant, so the outputs must be token-identical.  Without them (no AVX2, or no
compiler) a batched forward may flip a numerical tie, so a divergence is accepted only where the
target's top-2 logits are within one bf16 rounding step.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from swiftspec.bench.prompts import load_prompts
from swiftspec.config import EngineConfig, LoadConfig, TreeConfig
from swiftspec.engines import build_engine, chain_config
from swiftspec.engines.serial import SerialEngine
from swiftspec.kernels import cpu_ext
from swiftspec.runner.load import load_target
from swiftspec.runner.model_runner import ModelRunner
from swiftspec.sampling import SamplingParams
from swiftspec.speculate import TreeDrafter

pytestmark = pytest.mark.slow
NEW_TOKENS = 128  # the continuation ends at EOS before this
PROMPT = 5  # HumanEval/5
BF16 = LoadConfig(dtype="bfloat16", max_seq_len=1024)
LEVELS = sorted({cpu_ext.LEVELS["avx2"], cpu_ext.detected_level()}) if cpu_ext.detected_level() else [0]


def greedy(engine, ids: list[int]) -> list[int]:
    return [t for chunk in engine.generate(ids, SamplingParams(), NEW_TOKENS) for t in chunk]


def assert_same_or_tie(ar, ids: list[int], want: list[int], got: list[int], label: str) -> None:
    if all(cpu_ext.kernel_paths().values()):  # the invariant CPU kernels run at this level
        assert got == want, label
        return
    for i, (a, b) in enumerate(zip(want, got)):
        if a != b:
            ar.runner.kv.reset()
            top2 = ar.runner.extend(ids + want[:i])[0].topk(2).values
            gap, tol = float(top2[0] - top2[1]), torch.finfo(torch.bfloat16).eps * float(top2.abs().max())
            assert gap <= tol, f"{label}: token {i} differs ({a} vs {b}) and is no tie (gap {gap:.4f} > {tol:.4f})"
            return
    assert len(want) == len(got), label


WEIGHTS = ("bf16", "int4", "gguf")


@dataclasses.dataclass
class Reference:
    """One weight format at one ISA level: the loaded target, its ar engine, and ar's greedy
    continuation (want) of the prompt (ids)."""

    ar: object
    target: object
    ids: list[int]
    want: list[int]
    load: LoadConfig
    drafter: TreeDrafter | None = None  # the first serial mode's: the second shares its prepared draft model


@pytest.fixture(scope="module", params=[(w, lv) for lv in LEVELS for w in WEIGHTS],
                ids=[f"{w}-{cpu_ext.LEVEL_NAMES[lv]}" for lv in LEVELS for w in WEIGHTS])
def reference(real_pair, request):
    weights, level = request.param
    with pytest.MonkeyPatch.context() as mp:
        if level:  # this process and the async workers it starts run at that level
            mp.setenv(cpu_ext.ISA_ENV, cpu_ext.LEVEL_NAMES[level])
            mp.setitem(cpu_ext._state, "level", level)
            mp.setitem(cpu_ext._state, "paths", cpu_ext.kernel_paths(level))
        load = dataclasses.replace(BF16, weights=weights)
        target = load_target(str(real_pair.target), load)  # loaded once: every engine below shares it
        ar = build_engine(EngineConfig(mode="ar", target=str(real_pair.target), target_load=load), target)
        ids = ar.tokenizer.encode(load_prompts(PROMPT + 1)[PROMPT].text)
        want = greedy(ar, ids)
        assert len(want) < NEW_TOKENS, "the continuation no longer ends at EOS: pick another prompt"
        yield Reference(ar, target, ids, want, load)
        ar.close()


def speculative_engine(real_pair, ref: Reference, mode: str, tree: TreeConfig = TreeConfig(depth=3)):
    """build_engine's engine for `mode`; the second serial mode of a format (chain or tree) is built
    as build_engine builds it (engines/build.py: chain_config, SerialEngine) over the first one's
    draft model, pruned head and vocabulary, already loaded, pair-checked and packed by
    build_engine for the same draft_load: one draft load and packing per format instead of two."""
    config = EngineConfig(mode=mode, target=str(real_pair.target), draft=str(real_pair.draft),
                          target_load=ref.load, draft_load=ref.load, tree=tree)
    if mode == "async" or ref.drafter is None:
        engine = build_engine(config, ref.target)
        ref.drafter = ref.drafter or getattr(engine, "drafter", None)
        return engine
    tree = chain_config(config.tree) if mode == "chain" else config.tree
    first = ref.drafter
    vocab = None if first.vocab_map is None else first.vocab_map.cpu()
    drafter = TreeDrafter(first.runner.model, tree, ref.load.max_seq_len, vocab, first.runner.head)
    return SerialEngine(ref.target, drafter, tree, ref.load.max_seq_len)


def skip_below_the_top_level(mode: str) -> None:
    if cpu_ext.level() != LEVELS[-1]:  # the level the reference fixture runs at
        pytest.skip(f"{mode} runs no kernel path of its own: tested at the highest level")


@pytest.mark.parametrize("mode", ["chain", "tree", "async"])
def test_greedy_equals_ar(real_pair, reference, mode) -> None:
    ref = reference
    if mode != "tree":
        skip_below_the_top_level(mode)
    engine = speculative_engine(real_pair, ref, mode)
    try:
        generation = engine.generate(ref.ids, SamplingParams(), NEW_TOKENS)
        assert_same_or_tie(ref.ar, ref.ids, ref.want, [t for chunk in generation for t in chunk], mode)
        assert generation.stats.acceptance_length > 1.5
        if mode == "chain":  # rounds that take the whole chain and rounds that take none of it
            lengths = generation.stats.accept_lengths
            assert {1, TreeConfig().chain_length + 1} <= set(lengths), lengths
    finally:
        engine.close()


def test_a_prompt_cache_hit_keeps_every_token(reference, monkeypatch) -> None:
    """At each weight format and ISA level, in 32-token chunks: after a text that shares half the
    prompt (its first half, then other tokens), the prompt keeps that half's whole chunks and
    continues exactly as its cold prefill does; the same prompt again keeps all of it."""
    monkeypatch.setattr("swiftspec.runner.model_runner.PREFILL_CHUNK", 32)
    ref, half, new = reference, len(reference.ids) // 2, 24  # 24 tokens: the KV and the first logits decide
    cold = [t for chunk in ref.ar.generate(ref.ids, SamplingParams(), new, reuse=False) for t in chunk]
    list(ref.ar.generate(ref.ids[:half] + ref.ar.tokenizer.encode_text("\n# another file\nimport os\n"),
                         SamplingParams(), 4))
    for kept in (half // 32 * 32, len(ref.ids)):
        generation = ref.ar.generate(ref.ids, SamplingParams(), new)
        assert [t for chunk in generation for t in chunk] == cold and generation.stats.cached_tokens >= kept


def test_a_prefill_does_not_depend_on_the_cache_length(reference) -> None:
    """ar's cache (max_seq_len + 1 slots) and the verifier's (+ verify_size + 1): a prefill computes
    the same logits in both at every context length (the bench sizes the context to its prompts)."""
    if reference.load.weights != "gguf":
        pytest.skip("one format: the rule is the runner's, not the weights'")
    ids = reference.ids
    logits = [ModelRunner(reference.target.model, len(ids) + extra, 8, exact=True).prefill(ids, reuse=False).logits
              for extra in (1, 9, 600)]  # [1, V] each
    assert torch.equal(logits[0], logits[1]) and torch.equal(logits[0], logits[2])


SAMPLED = SamplingParams(temperature=0.7, top_p=0.9, seed=5)


def test_sampled_tree_equals_ar(real_pair, reference) -> None:
    """Seeded sampling (T 0.7, top-p 0.9), the file's own weights: the tree's tokens are ar's, as
    every position's token is one draw of its uniform (sampling.Draws) whichever round reaches it;
    its trees put the draft's own draw at that uniform first (tree.coupled_children).  Needs the
    invariant CPU kernels (bitwise equal logits): a near-tie of two logits is no tie of a draw."""
    ref = reference
    if ref.load.weights != "gguf" or not all(cpu_ext.kernel_paths().values()):
        pytest.skip("one format (gguf) where the invariant CPU kernels run")
    skip_below_the_top_level("sampling")
    want = [t for chunk in ref.ar.generate(ref.ids, SAMPLED, 40) for t in chunk]
    engine = speculative_engine(real_pair, ref, "tree", TreeConfig())  # the default rounds, on the greedy tests' draft
    try:
        generation = engine.generate(ref.ids, SAMPLED, 40)
        assert [t for chunk in generation for t in chunk] == want
        assert generation.stats.acceptance_length > 1.5
    finally:
        engine.close()
