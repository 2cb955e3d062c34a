"""The pruned draft head fits the request: it serves text inside its vocabulary (but for a small
share, whose tokens join it), and gives way to the full head once the text leaves it; greedy
output never changes."""

from __future__ import annotations

import torch

from conftest import FP32
from swiftspec import kernels
from swiftspec.config import TreeConfig
from swiftspec.engines.ar import AutoregressiveEngine
from swiftspec.engines.serial import SerialEngine
from swiftspec.sampling import SamplingParams
from swiftspec.speculate import TreeDrafter
from swiftspec.speculate.vocab import TEXT_SLACK
from swiftspec.weights.loader import load_model


def _pruned_drafter(draft, cfg: TreeConfig, keep: list[int]) -> TreeDrafter:
    vocab = torch.tensor(sorted(keep), dtype=torch.long)
    head = draft.model.lm_head.weight.data[vocab].contiguous()  # [V', H]
    return TreeDrafter(draft.model, cfg, 256, vocab, head)


def test_pruned_head_serves_covered_text_and_gives_way_outside(tiny_draft) -> None:
    cfg = TreeConfig(depth=2)
    drafter = _pruned_drafter(tiny_draft, cfg, list(range(200)))
    drafter.start([5, 6, 7], 8, SamplingParams())
    assert drafter.vocab_map is not None and drafter.runner.head is not None
    drafter.expand()
    assert drafter.tree.tokens[1:].lt(200).all()  # only ids of the pruned head
    drafter.advance([int(drafter.tree.tokens[1])])
    assert drafter.vocab_map is not None  # still inside
    drafter.advance([300])  # a token the pruned head cannot propose
    assert drafter.vocab_map is None and drafter.runner.head is None
    drafter.start([5, 300, 301, 7], 8, SamplingParams())  # a prompt outside: full head from the start
    assert drafter.vocab_map is None
    drafter.start([5, 6, 7], 8, SamplingParams())  # the next covered request gets the pruned head back
    assert drafter.vocab_map is not None


def test_greedy_with_a_switching_head_equals_ar(tiny_target, tiny_draft) -> None:
    ar = AutoregressiveEngine(tiny_target, 256)
    cfg = TreeConfig(depth=3)
    engine = SerialEngine(tiny_target, _pruned_drafter(tiny_draft, cfg, list(range(3, 400))), cfg, 256)
    for prompt in ([11, 42, 7, 11, 42], [450, 3, 4], [9] * 6):
        want = [t for c in ar.generate(prompt, SamplingParams(), 32) for t in c]
        assert [t for c in engine.generate(prompt, SamplingParams(), 32) for t in c] == want


def _packed_pruned_drafter(draft_dir, cfg: TreeConfig, keep: list[int]) -> TreeDrafter:
    """A fresh draft packed as int8 (the tiny hidden size is below the int4 group), full head included, with a pruned head of `keep`."""
    model = load_model(str(draft_dir), FP32).model
    vocab = torch.tensor(sorted(keep), dtype=torch.long)
    dense = model.lm_head.weight.data.clone()  # [V, H]
    kernels.prepare_model_(model, "int8")
    return TreeDrafter(model, cfg, 256, vocab, kernels.prepare_weight(dense[vocab].contiguous(), "int8"))


def test_the_few_tokens_outside_join_the_pruned_head(tiny_draft_dir) -> None:
    drafter = _packed_pruned_drafter(tiny_draft_dir, TreeConfig(depth=2), list(range(200)))
    prompt = [5 + i % 100 for i in range(39)] + [300]  # one token in 41 lies outside the table
    assert 1 / 41 <= TEXT_SLACK
    drafter.start(prompt, 8, SamplingParams())
    assert drafter.vocab_map is not None and drafter.vocab_map[-1] == 300  # scored after the table's ids
    hidden = torch.randn(2, drafter.runner.model.args.hidden_size)
    full = drafter.runner.model.logits(hidden)  # [2, V]
    got = drafter.runner.logits(hidden)  # [2, 200 + 1]
    assert torch.equal(got[:, -1], full[:, 300])  # the full head's own logit for it
    drafter.expand()
    drafter.advance([301])  # a second new token: still within the slack, it joins too
    assert drafter.vocab_map[-2:].tolist() == [300, 301]
    drafter.advance([302, 303, 304])  # 5 of 45 outside: past the slack, full head from here on
    assert drafter.vocab_map is None and drafter.runner.head is None and drafter.runner.extra is None
    drafter.start(list(range(5, 45)), 8, SamplingParams())  # the next request starts on the table alone
    assert drafter.vocab_map is not None and drafter.vocab_map.numel() == 200


def test_greedy_with_an_extended_head_equals_ar(tiny_target, tiny_draft_dir) -> None:
    ar = AutoregressiveEngine(tiny_target, 256)
    cfg = TreeConfig(depth=3)
    drafter = _packed_pruned_drafter(tiny_draft_dir, cfg, list(range(3, 400)))
    engine = SerialEngine(tiny_target, drafter, cfg, 256)
    prompt = [11, 42, 7] * 13 + [450]  # 450 lies outside the table: it joins the pruned head
    want = [t for c in ar.generate(prompt, SamplingParams(), 32) for t in c]
    assert [t for c in engine.generate(prompt, SamplingParams(), 32) for t in c] == want
    assert drafter.text.extra[0] == 450
