"""Verification against step-by-step references, Acceptance invariants, no host syncs, layering."""

from __future__ import annotations

import pathlib
import random
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swiftspec.sampling import Draws, SamplingParams, process_logits, sample_at
from swiftspec.verify import Acceptance, verify_greedy, verify_probs, verify_sampled, verify_stochastic

FAST = settings(max_examples=80, deadline=None)
SEEDS = st.integers(0, 2**31 - 1)
ROOT = pathlib.Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("one_thread")


class _Case:
    """A random tree over a fixed random logit table indexed by path (the reference model)."""

    def __init__(self, seed: int, vocab: int = 6, max_nodes: int = 12) -> None:
        self.rng, self.gen, self.vocab, self.table = random.Random(seed), torch.Generator().manual_seed(seed), vocab, {}
        self.paths, self.parents = [(self.rng.randrange(vocab),)], [-1]
        for _ in range(self.rng.randrange(max_nodes)):
            parent = self.rng.randrange(len(self.paths))
            token = self.argmax(parent) if self.rng.random() < 0.6 else self.rng.randrange(vocab)
            if self.child(parent, token) is None:  # siblings stay distinct
                self.paths.append(self.paths[parent] + (token,))
                self.parents.append(parent)
        self.tokens = torch.tensor([p[-1] for p in self.paths])
        self.parent_tensor = torch.tensor(self.parents)
        self.logits = torch.stack([self.logits_after(p) for p in self.paths])  # [n, V]

    def logits_after(self, path: tuple[int, ...]) -> torch.Tensor:
        if path not in self.table:
            self.table[path] = torch.randn(self.vocab, generator=self.gen) * 2
        return self.table[path]

    def argmax(self, node: int) -> int:
        return int(self.logits_after(self.paths[node]).argmax())

    def child(self, node: int, token: int) -> int | None:
        found = [i for i, p in enumerate(self.parents) if p == node and self.paths[i][-1] == token]
        return found[0] if found else None

    def greedy_reference(self, pick=None) -> tuple[list[int], list[int]]:
        """Plain decoding, one token at a time (pick(node, step); default the argmax), while the
        tree holds the token."""
        pick = pick or (lambda node, step: self.argmax(node))
        nodes, emitted = [0], []
        while True:
            emitted.append(pick(nodes[-1], len(emitted)))
            nxt = self.child(nodes[-1], emitted[-1])
            if nxt is None:
                return nodes, emitted
            nodes.append(nxt)


def _assert_consistent(case: _Case, result: Acceptance) -> None:
    nodes, tokens, n = result.nodes.tolist(), result.tokens.tolist(), len(case.paths)
    assert nodes[0] == 0 and all(case.parents[b] == a for a, b in zip(nodes, nodes[1:]))
    assert tokens[:-1] == [case.paths[i][-1] for i in nodes[1:]] and 0 <= tokens[-1] < case.vocab
    assert int(result.last) == nodes[-1] and int(result.length) == len(nodes)
    assert result.path.shape == result.emitted.shape == (n,)
    assert (result.path[len(nodes):] == -1).all() and (result.emitted[len(nodes):] == -1).all()


@FAST
@given(seed=SEEDS)
def test_greedy_matches_stepwise_argmax(seed):
    case = _Case(seed)
    result = verify_greedy(case.tokens, case.parent_tensor, case.logits)
    nodes, emitted = case.greedy_reference()
    assert result.nodes.tolist() == nodes and result.tokens.tolist() == emitted
    _assert_consistent(case, result)


@FAST
@given(seed=SEEDS)
def test_sampled_matches_stepwise_draws(seed):
    """verify_sampled emits what decoding one token at a time draws: the token at step k is
    sample_at of p after the node reached, at the uniform of position k (here position = depth)."""
    case = _Case(seed)
    params, draws = SamplingParams(temperature=0.9, top_p=0.9), Draws(seed)
    table = draws.uniforms(0, len(case.paths))  # [n]: the uniform of depth 0, 1, ...
    depths = torch.tensor([len(p) - 1 for p in case.paths])
    result = verify_sampled(case.tokens, case.parent_tensor, case.logits, params, table[depths])

    def draw(node: int, step: int) -> int:
        probs = process_logits(case.logits_after(case.paths[node])[None], params)  # [1, V]
        return int(sample_at(probs, table[step : step + 1]))

    nodes, emitted = case.greedy_reference(draw)
    assert result.nodes.tolist() == nodes and result.tokens.tolist() == emitted
    _assert_consistent(case, result)


@FAST
@given(seed=SEEDS, deterministic=st.booleans())
def test_stochastic_with_temperature_zero_is_greedy(seed, deterministic):
    case = _Case(seed)
    q = torch.softmax(torch.randn(case.logits.shape, generator=case.gen), -1)
    result = verify_stochastic(case.tokens, case.parent_tensor, case.logits, q,
                               SamplingParams(temperature=0.0), torch.Generator().manual_seed(seed), deterministic)
    nodes, emitted = case.greedy_reference()
    assert result.nodes.tolist() == nodes and result.tokens.tolist() == emitted


@FAST
@given(seed=SEEDS, deterministic=st.booleans())
def test_stochastic_result_is_a_root_path(seed, deterministic):
    case = _Case(seed)
    q = torch.softmax(torch.randn(case.logits.shape, generator=case.gen), -1)
    params = SamplingParams(temperature=0.8, top_p=0.95)
    result = verify_stochastic(case.tokens, case.parent_tensor, case.logits, q, params,
                               torch.Generator().manual_seed(seed), deterministic)
    _assert_consistent(case, result)
    again = verify_stochastic(case.tokens, case.parent_tensor, case.logits, q, params,
                              torch.Generator().manual_seed(seed), deterministic)
    assert torch.equal(result.path, again.path) and torch.equal(result.emitted, again.emitted)


@pytest.mark.parametrize("deterministic", [True, False])
def test_certain_and_impossible_children(deterministic):
    # Chain 0 -> 1 -> 2 where the target is certain of each child: all accepted, then a bonus.
    tokens, parents = torch.tensor([4, 1, 2]), torch.tensor([-1, 0, 1])
    logits = torch.full((3, 5), -1e9)
    logits[0, 1] = logits[1, 2] = 0.0
    logits[2] = 0.0
    q = torch.full((3, 5), 0.2)
    params, generator = SamplingParams(temperature=1.0), torch.Generator().manual_seed(0)
    for _ in range(20):
        result = verify_stochastic(tokens, parents, logits, q, params, generator, deterministic)
        assert result.nodes.tolist() == [0, 1, 2] and result.tokens.tolist()[:2] == [1, 2]
    # Root with children 1, 2, 3 that the target never emits: the recovered token avoids them.
    tokens, parents = torch.tensor([0, 1, 2, 3]), torch.tensor([-1, 0, 0, 0])
    logits = torch.zeros(4, 5)
    logits[0, 1:4] = -1e9
    for _ in range(20):
        result = verify_stochastic(tokens, parents, logits, q[:1].expand(4, -1), params, generator,
                                   deterministic)
        assert result.nodes.tolist() == [0] and result.tokens.tolist()[0] in (0, 4)


def test_single_tree_matches_batched_core():
    case = _Case(11)
    q = torch.softmax(torch.randn(case.logits.shape, generator=case.gen), -1)
    single = verify_stochastic(case.tokens, case.parent_tensor, case.logits, q,
                               SamplingParams(temperature=1.0), torch.Generator().manual_seed(3), False)
    batched = verify_probs(case.tokens[None], case.parent_tensor[None], torch.softmax(case.logits, -1)[None],
                           q[None], torch.Generator().manual_seed(3), False)
    assert torch.equal(single.path, batched.path[0]) and torch.equal(single.emitted, batched.emitted[0])


def test_sampled_drafts_need_q():
    with pytest.raises(ValueError):
        verify_stochastic(torch.tensor([0]), torch.tensor([-1]), torch.zeros(1, 4), None,
                          SamplingParams(temperature=1.0), None, deterministic=False)


def test_verification_needs_no_host_sync():
    # Meta tensors carry no data, so any .item(), .tolist() or data-dependent shape would raise.
    ids = torch.zeros(5, dtype=torch.int64, device="meta")
    probs = torch.zeros(2, 5, 7, device="meta")
    assert verify_greedy(ids, ids, torch.zeros(5, 7, device="meta")).last.shape == ()
    for deterministic in (True, False):
        result = verify_probs(ids.expand(2, 5), ids.expand(2, 5), probs, probs, None, deterministic)
        assert result.path.shape == (2, 5) and result.last.shape == (2,)


def test_pure_packages_import_no_engine_code():
    code = ("import sys, swiftspec.tree, swiftspec.verify, swiftspec.sampling; "
            "print(' '.join(m for m in sys.modules if m.startswith('swiftspec')))")
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.split()
    assert "swiftspec.verify" in loaded
    for layer in ("model", "engines", "distributed", "speculate", "runner", "parallel", "cache", "kernels", "serve"):
        assert not [m for m in loaded if m.startswith(f"swiftspec.{layer}")], layer
