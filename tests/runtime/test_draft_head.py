"""The pruned draft head fits the request: it serves text inside its vocabulary and gives way to the
full head as soon as the text leaves it; greedy output never changes."""

from __future__ import annotations

import torch

from swiftspec.config import TreeConfig
from swiftspec.runtime.autoregressive import AutoregressiveEngine
from swiftspec.runtime.serial import SerialEngine
from swiftspec.sampling import SamplingParams
from swiftspec.spec import TreeDrafter


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
