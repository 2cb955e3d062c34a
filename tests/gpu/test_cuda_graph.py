"""GraphRunner's bucketing and padding on CPU: the pure helpers, and the padded forward (what a graph
replays) against the plain forward on a tiny model. The captures themselves are in test_gpu_runtime.py."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import tiny_model, tree_rows

from swiftspec.runner.cuda_graph import GraphRunner, attach, new_batch, pad_into, pick_bucket
from swiftspec.runner.model_runner import ModelRunner

MAX_LEN = 96


def test_pick_bucket() -> None:
    assert pick_bucket(1, (4, 8)) == 4
    assert pick_bucket(4, (4, 8)) == 4
    assert pick_bucket(5, (4, 8)) == 8
    assert pick_bucket(9, (4, 8)) is None


def test_new_batch_is_all_padding() -> None:
    batch = new_batch(4, 10, 9, "cpu")
    assert batch.tokens.tolist() == [0] * 4 and batch.positions.tolist() == [0] * 4
    assert batch.slots.tolist() == [9] * 4
    assert batch.mask.sum().item() == 4 and batch.mask[:, 9].all()
    with pytest.raises(ValueError, match="scratch slot"):
        new_batch(4, 10, 10, "cpu")


def test_pad_into_keeps_real_rows_and_hides_scratch() -> None:
    batch = new_batch(6, 12, 11, "cpu")
    mask = torch.ones(4, 7, dtype=torch.bool)
    pad_into(batch, torch.arange(1, 5), torch.arange(3, 7), torch.arange(3, 7), torch.ones(4, 7, dtype=torch.bool), 11)
    pad_into(batch, torch.tensor([7, 8]), torch.tensor([5, 6]), torch.tensor([5, 6]), mask[:2, :6], 11)  # smaller call
    assert batch.tokens.tolist() == [7, 8, 0, 0, 0, 0]
    assert batch.positions.tolist() == [5, 6, 0, 0, 0, 0]
    assert batch.slots.tolist() == [5, 6, 11, 11, 11, 11]
    assert batch.mask[:2, :6].all() and not batch.mask[:2, 6:].any()  # the earlier, wider call is gone
    assert batch.mask[2:, 11].all() and batch.mask[2:].sum().item() == 4  # padding sees only scratch
    with pytest.raises(ValueError, match="does not fit"):
        pad_into(batch, torch.arange(7), torch.arange(7), torch.arange(7), torch.ones(7, 3, dtype=torch.bool), 11)
    with pytest.raises(ValueError, match="does not fit"):
        pad_into(batch, torch.arange(2), torch.arange(2), torch.arange(2), torch.ones(2, 12, dtype=torch.bool), 11)


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return tiny_model("cpu")


def _prefilled(model: torch.nn.Module, prompt: int) -> ModelRunner:
    runner = ModelRunner(model, MAX_LEN, max_nodes=16)
    runner.extend(list(range(3, 3 + prompt)))
    return runner


def test_padded_forward_equals_plain_forward(model: torch.nn.Module) -> None:
    """A 5-node tree call padded to bucket 8 over the cache's whole width: same logits and the same KV
    in every slot except the scratch slot."""
    prompt, nodes = 20, 5
    plain, padded = _prefilled(model, prompt), _prefilled(model, prompt)
    graphs = GraphRunner(padded, buckets=(8, 4)).capture()
    last = padded.cache.max_len - 1  # the scratch slot (a CPU cache holds whole KEY_BLOCKs: past MAX_LEN)
    assert graphs.buckets == (4, 8) and graphs.scratch == last
    mask = tree_rows(prompt, nodes, torch.arange(nodes), torch.Generator().manual_seed(0))  # [5, 25]
    tokens = torch.tensor([40, 41, 42, 43, 44])
    depth = mask[:, prompt:].sum(1) - 1
    slots = torch.arange(prompt, prompt + nodes)
    assert graphs.covers(nodes, mask.shape[1])
    want = plain.forward(tokens, prompt + depth, slots, mask)
    got = graphs.forward(tokens, prompt + depth, slots, mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    rows = torch.tensor([1, 4])
    torch.testing.assert_close(graphs.forward(tokens, prompt + depth, slots, mask, rows), want[rows],
                               atol=1e-5, rtol=1e-5)
    for cache in ("k", "v"):
        a, b = getattr(plain.cache, cache), getattr(padded.cache, cache)  # [L, max_len, Hkv, D]
        torch.testing.assert_close(b[:, :last], a[:, :last], atol=1e-5, rtol=1e-5)
        assert b[:, last].abs().sum() > 0  # padding rows wrote only there


def test_uncovered_calls_run_eagerly(model: torch.nn.Module) -> None:
    runner = _prefilled(model, 10)
    graphs = GraphRunner(runner, buckets=(2,)).capture()
    assert not graphs.covers(3, 13) and not graphs.covers(1, runner.cache.max_len)
    mask = torch.ones(3, 13, dtype=torch.bool)
    tokens, slots = torch.tensor([5, 6, 7]), torch.arange(10, 13)
    eager = _prefilled(model, 10).forward(tokens, slots, slots, mask)
    torch.testing.assert_close(graphs.forward(tokens, slots, slots, mask), eager, atol=0, rtol=0)


def test_attach_is_a_no_op_off_cuda(model: torch.nn.Module) -> None:
    runner = ModelRunner(model, MAX_LEN, max_nodes=4)
    attach(runner, (4,))
    assert getattr(runner, "graphs", None) is None
    with pytest.raises(ValueError, match="positive"):
        GraphRunner(runner, buckets=())
