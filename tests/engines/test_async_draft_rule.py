"""The async draft leader's verification-size rule (TreeConfig.adaptive_verify): with the target's
verify costs in Start, a tree keeps only the nodes that repay their rows; without them (a seeded
sampled request, or the rule off) every tree holds bs nodes.  The draft loop runs in a thread
over LocalTransport; this test plays the target leader."""

from __future__ import annotations

import threading

import pytest
import torch

from swiftspec.config import TreeConfig
from swiftspec.distributed.protocol import DraftTree, LocalTransport, Profile, Shutdown, Start, Verified
from swiftspec.distributed.workers import DraftSettings, GroupIO, draft_loop
from swiftspec.sampling import SamplingParams
from swiftspec.speculate import build_drafter

BS = 8
ROUNDS = 6


def tree_sizes(tiny_draft, costs: list[float], params: SamplingParams) -> list[int]:
    """Sizes of the trees the draft loop sends over ROUNDS rounds, each round answered with the
    root alone (the bonus token), as a target that accepts nothing would."""
    drafter = build_drafter(tiny_draft, TreeConfig(depth=2, lookup=False), 256, 0, "bf16")
    target, draft = LocalTransport.pair()
    loop = threading.Thread(target=draft_loop, args=(drafter, GroupIO(draft, None), DraftSettings(verify_size=BS)))
    loop.start()
    sizes = []
    try:
        target.send(Start(prompt=torch.tensor([5, 6, 7, 8]), first_token=9, depth=2, params=params,
                          verify_costs=torch.tensor(costs, dtype=torch.float64)))
        for i in range(ROUNDS):
            tree = target.recv()
            assert isinstance(tree, DraftTree)
            sizes.append(tree.tokens.numel())
            target.send(Verified(tokens=torch.tensor([10 + i]), nodes=torch.tensor([0]), stop=i == ROUNDS - 1))
        assert isinstance(target.recv(), Profile)
    finally:
        target.send(Shutdown())
        loop.join(timeout=60)
    assert not loop.is_alive()
    return sizes


def test_costly_rows_shrink_the_async_tree(tiny_draft) -> None:
    """Rows past the first cost far more than any draft node can promise: the root goes alone."""
    sizes = tree_sizes(tiny_draft, [1e-3] + [10.0] * (BS - 1), SamplingParams())
    assert sizes == [1] * ROUNDS


def test_free_rows_keep_bs_nodes(tiny_draft) -> None:
    sizes = tree_sizes(tiny_draft, [1e-3] * BS, SamplingParams())
    assert sizes == [BS] * ROUNDS


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.8, seed=3)],
                         ids=["no-costs", "seeded"])
def test_no_costs_send_bs_nodes(tiny_draft, params) -> None:
    """No costs in Start (adaptive verification off: the target sends none), greedy or sampled."""
    assert tree_sizes(tiny_draft, [], params) == [BS] * ROUNDS
