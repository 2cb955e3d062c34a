"""Statistical losslessness: emitted tokens follow the target distribution exactly.

A toy target and a different toy draft have path-dependent next-token distributions over a
vocabulary of 8 (a seeded hash of the path). Each trial drafts a tree and verifies it; when
that round emits one token, the second comes from a round rooted at it. The first two tokens
must follow p(t1 | ctx) p(t2 | ctx, t1), computed exactly after the same logits processing.

Test: Pearson chi-square over the 64 (t1, t2) cells (cells expecting < 5 pooled), at
significance 1e-6 (Wilson-Hilferty quantile). A correct verifier fails with probability
about 1e-6 per check; the seeds are fixed, so the outcome does not change between runs.
Deliberately broken verifiers (monkeypatched residual updates) must fail the same check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

import swiftspec.verify.stochastic as stochastic
from swiftspec.sampling import SamplingParams, process_logits
from swiftspec.tree import graft, grow, new_tree, sample_children, select_leaves, select_subtree, topk_children
from swiftspec.verify import Acceptance, verify_probs

V = 8
TRIALS = 20_000
CONTEXT = (2, 5)  # the verified prefix; its last token is the first round's root
Z_1E6 = 4.753424  # standard normal quantile for a one-sided 1e-6 tail
PARAMS = {
    "t1.0": SamplingParams(temperature=1.0),
    "t0.7-p0.9": SamplingParams(temperature=0.7, top_p=0.9),
}


def _extend(codes: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Path code of path + (token,): codes [...] int64, tokens [...] int64."""
    return codes * (V + 1) + tokens + 1


def _hash_logits(codes: torch.Tensor, salt: int) -> torch.Tensor:
    """Seeded hash of the path code -> logits [..., V] in [0, 3)."""
    x = codes.unsqueeze(-1) * 1_000_003 + torch.arange(V) * 7_919 + salt * 104_729
    for multiplier in (0x5BD1E995, 0x27D4EB2F):
        x = ((x & 0xFFFFFFFF) * multiplier) & 0xFFFFFFFF
        x = x ^ (x >> 15)
    return (x & 0xFFFFFF).float() / 2**24 * 3.0


def _target_logits(codes: torch.Tensor) -> torch.Tensor:
    return _hash_logits(codes, 1)


def _draft_logits(codes: torch.Tensor) -> torch.Tensor:
    """Correlated with the target (so paths get accepted), yet different."""
    return 0.6 * _hash_logits(codes, 1) + 0.6 * _hash_logits(codes, 2)


def _draft_probs(codes: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """q: the draft honours temperature; full support so k distinct children can be drawn."""
    draft_params = SamplingParams(temperature=params.temperature)
    return _per_path(lambda c: process_logits(_draft_logits(c), draft_params), codes)


def _target_probs(codes: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """p: the processed target distribution after each path."""
    return _per_path(lambda c: process_logits(_target_logits(c), params), codes)


def _per_path(dist, codes: torch.Tensor) -> torch.Tensor:
    """dist(codes) [..., V], computed once per distinct path (trials share most paths)."""
    unique, inverse = torch.unique(codes, return_inverse=True)
    return dist(unique)[inverse]


def _context_code(path: tuple[int, ...]) -> int:
    code = 0
    for token in path:
        code = code * (V + 1) + token + 1
    return code


@dataclass
class _Batch:
    """B trees of one shape: node tokens [B, n], parents [B, n], path codes [B, n]."""

    tokens: torch.Tensor
    parents: torch.Tensor
    codes: torch.Tensor


def _sampled_trees(root_codes: torch.Tensor, branching: tuple[int, ...], params: SamplingParams,
                   generator: torch.Generator) -> _Batch:
    """Fixed-shape trees whose children are drawn without replacement from q, in draw order."""
    batch = root_codes.shape[0]
    tokens, codes, parents, level = [(root_codes - 1) % (V + 1)], [root_codes], [-1], [0]
    for k in branching:
        q = _draft_probs(torch.stack([codes[i] for i in level], 1), params)  # [B, |level|, V]
        drawn = sample_children(q.reshape(-1, V), k, generator)[0].reshape(batch, len(level), k)
        next_level = []
        for j, parent in enumerate(level):
            for c in range(k):
                next_level.append(len(tokens))
                parents.append(parent)
                tokens.append(drawn[:, j, c])
                codes.append(_extend(codes[parent], drawn[:, j, c]))
        level = next_level
    return _Batch(torch.stack(tokens, 1), torch.tensor(parents).expand(batch, -1), torch.stack(codes, 1))


def _lookup_chain(root_code: int, length: int) -> list[int]:
    """A deterministic stand-in for a prompt-lookup continuation: the argmax of a third hash."""
    chain, code = [], root_code
    for _ in range(length):
        chain.append(int(_hash_logits(torch.tensor(code), 3).argmax()))
        code = _extend(torch.tensor(code), torch.tensor(chain[-1])).item()
    return chain


def _grown_tree(root_code: int, width: int, k: int, steps: int, size: int, grafted: int = 0) -> _Batch:
    """One deterministic top-k tree grown with the real growth code, cut to `size` nodes.
    grafted > 0: a lookup chain of that length is grafted at the root first (log-prob log 0.6
    per token), and growth merges with it, as the drafter's trees are built."""
    tree, codes = new_tree((root_code - 1) % (V + 1)), [root_code]
    if grafted:
        parents = torch.tensor([0] + [len(tree) + j for j in range(grafted - 1)])
        chain = torch.tensor(_lookup_chain(root_code, grafted))
        tree = graft(tree, parents, chain, torch.full((grafted,), math.log(0.6)), budget=64).tree
    _append_codes(tree, codes)
    for _ in range(steps):
        leaves = select_leaves(tree, width)
        logq = _draft_logits(torch.tensor(codes)[leaves]).log_softmax(-1)
        tree = grow(tree, leaves, *topk_children(logq, k), budget=64, merge=grafted > 0)
        _append_codes(tree, codes)
    sub = select_subtree(tree, size)
    return _Batch(sub.tokens[None], sub.parents[None], torch.tensor(codes)[sub.nodes][None])


def _append_codes(tree, codes: list[int]) -> None:
    """Path codes of the nodes appended since `codes` was last extended."""
    for i in range(len(codes), len(tree)):
        codes.append(codes[tree.parents[i]] * (V + 1) + int(tree.tokens[i]) + 1)


def _topk_trees(root_codes: torch.Tensor, shape: tuple[int, ...]) -> _Batch:
    """Each trial gets the (deterministic) grown tree of its root path."""
    unique, which = torch.unique(root_codes, return_inverse=True)
    trees = [_grown_tree(int(code), *shape) for code in unique]
    fields = zip(*((t.tokens, t.parents, t.codes) for t in trees))
    return _Batch(*(torch.cat(field)[which] for field in fields))


def _round(root_codes: torch.Tensor, kind: str, shape: tuple[int, ...], params: SamplingParams,
           generator: torch.Generator) -> Acceptance:
    """Draft a tree per trial and verify it (a batch of B trees)."""
    deterministic = kind == "topk"
    if deterministic:
        trees = _topk_trees(root_codes, shape)
    else:
        trees = _sampled_trees(root_codes, shape, params, generator)
    p = _target_probs(trees.codes, params)
    q = None if deterministic else _draft_probs(trees.codes, params)
    return verify_probs(trees.tokens, trees.parents, p, q, generator, deterministic)


def _first_two(kind: str, shape: tuple[int, ...], params: SamplingParams, seed: int,
               trials: int = TRIALS) -> torch.Tensor:
    """[trials] int64 codes t1 * V + t2 of the first two emitted tokens of each trial."""
    generator = torch.Generator().manual_seed(seed)
    start = torch.full((trials,), _context_code(CONTEXT))
    first = _round(start, kind, shape, params, generator)
    t1 = first.emitted[:, 0]
    second = _round(_extend(start, t1), kind, shape, params, generator)
    t2 = torch.where(first.length >= 2, first.emitted[:, 1], second.emitted[:, 0])
    return t1 * V + t2


def _exact(params: SamplingParams) -> torch.Tensor:
    """[V * V] float64 exact P(t1, t2) under the processed target."""
    start = torch.tensor(_context_code(CONTEXT))
    p1 = _target_probs(start, params).double()  # [V]
    p2 = _target_probs(_extend(start, torch.arange(V)), params).double()  # [V, V]
    return (p1[:, None] * p2).reshape(-1)


def _chi2_threshold(df: int, z: float = Z_1E6) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile with upper tail Phi(-z)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _chi2(outcomes: torch.Tensor, probs: torch.Tensor) -> tuple[float, float]:
    """(statistic, threshold); an outcome of probability 0 gives an infinite statistic."""
    counts = torch.bincount(outcomes, minlength=probs.numel()).double()
    if counts[probs == 0].sum() > 0:
        return math.inf, 0.0
    expected = probs * outcomes.numel()
    small = (expected < 5) & (probs > 0)
    big = expected >= 5
    obs = torch.cat([counts[big], counts[small].sum().reshape(1)])
    exp = torch.cat([expected[big], expected[small].sum().reshape(1)])
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    return stat, _chi2_threshold(int(keep.sum()) - 1)


pytestmark = pytest.mark.usefixtures("one_thread")


CASES = {
    "sampled-chain": ("sampled", (1, 1, 1)),
    "sampled-tree": ("sampled", (3, 2)),
    "topk-chain": ("topk", (1, 1, 3, 4)),  # width, k, expansions, subtree size
    "topk-tree": ("topk", (2, 3, 3, 8)),
    "mixed-tree": ("topk", (2, 3, 3, 8, 4)),  # plus a grafted lookup chain of 4
}


@pytest.mark.parametrize("params", PARAMS.values(), ids=PARAMS.keys())
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_first_two_tokens_follow_target(case, params):
    stat, threshold = _chi2(_first_two(*case, params, seed=1234), _exact(params))
    assert stat < threshold, f"chi-square {stat:.1f} >= {threshold:.1f}"


def _skip_residual(residual, proposal, token):
    """Broken: keeps p' after a rejection instead of normalize(max(0, p' - q))."""
    return residual, stochastic._normalize(proposal.scatter(1, token, 0.0), proposal)


def _keep_rejected(residual, token):
    """Broken: a rejected top-k sibling keeps its mass in p'."""
    return residual


def _no_sibling_exclusion(residual, proposal, token):
    """Broken for distinct siblings: textbook SpecInfer, testing every child against the full q."""
    return stochastic._normalize((residual - proposal).clamp_min(0.0), residual), proposal


BROKEN = {
    "skip-residual": ("_reject_sampled", _skip_residual, "sampled-tree", "t1.0"),
    "keep-rejected-sibling": ("_reject_deterministic", _keep_rejected, "topk-tree", "t1.0"),
    "keep-rejected-sibling-mixed": ("_reject_deterministic", _keep_rejected, "mixed-tree", "t1.0"),
    "no-sibling-exclusion": ("_reject_sampled", _no_sibling_exclusion, "sampled-tree", "t0.7-p0.9"),
}


@pytest.mark.parametrize("broken", BROKEN.values(), ids=BROKEN.keys())
def test_same_check_rejects_broken_verifier(broken, monkeypatch):
    name, replacement, case, params = broken
    monkeypatch.setattr(stochastic, name, replacement)
    stat, threshold = _chi2(_first_two(*CASES[case], PARAMS[params], seed=1234), _exact(PARAMS[params]))
    assert stat >= threshold, f"broken verifier passed: chi-square {stat:.1f} < {threshold:.1f}"


def test_mixed_tree_verifies_grafted_nodes():
    """The grafted chain changes the verified subtree of the test's first round."""
    root = _context_code(CONTEXT)
    plain, mixed = _grown_tree(root, 2, 3, 3, 8), _grown_tree(root, 2, 3, 3, 8, grafted=4)
    chain = _lookup_chain(root, 4)
    assert not torch.equal(plain.tokens, mixed.tokens)
    assert chain[0] in mixed.tokens[0, 1:][mixed.parents[0, 1:] == 0].tolist()


def test_same_seed_same_outcomes():
    params = PARAMS["t0.7-p0.9"]
    first = _first_two("sampled", (3, 2), params, seed=7, trials=500)
    assert torch.equal(first, _first_two("sampled", (3, 2), params, seed=7, trials=500))
    assert not torch.equal(first, _first_two("sampled", (3, 2), params, seed=8, trials=500))
