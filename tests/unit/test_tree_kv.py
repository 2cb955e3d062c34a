"""Tree-aware KV cache: commit + compaction leave exactly what recomputing from scratch would.

No model: the "KV" of a token is a fixed random vector determined by the whole token sequence up to
and including it (as real KV is), so any slot mix-up shows as a wrong vector.
"""

import random

import torch

from swiftspec.cache.kv_cache import KVCache
from swiftspec.cache.tree_kv import TreeKV
from swiftspec.tree import grow, new_tree, path_to, reroot, select_leaves

VOCAB = 6


def kv_of(seq: list[int]) -> torch.Tensor:
    g = torch.Generator().manual_seed(hash(tuple(seq)) % (2**31))
    return torch.randn(1, 4, generator=g)  # [Hkv=1, D=4]


def write(kv: TreeKV, slot: int, seq: list[int]) -> None:
    vec = kv_of(seq)
    kv.cache.write(0, torch.tensor([slot]), vec[None], vec[None])


def expand(kv: TreeKV, tree, prefix: list[int], rng: random.Random, width: int, budget: int):
    """Compute KV of the best leaves (as the drafter does) and give each random children."""
    leaves = select_leaves(tree, width)
    slots = kv.alloc(leaves)
    for leaf, slot in zip(leaves.tolist(), slots.tolist()):
        write(kv, slot, prefix + tree.tokens[path_to(tree, leaf)].tolist())
    k = 3
    toks = torch.stack([torch.tensor(rng.sample(range(VOCAB), k)) for _ in leaves.tolist()])
    lps = -torch.rand(len(leaves), k)
    return grow(tree, leaves, toks, lps, budget)


def random_emitted(tree, rng: random.Random) -> list[int]:
    """Walk down the tree a random number of steps, then a bonus token (in the tree or not)."""
    node, out = 0, []
    while True:
        kids = (tree.parents == node).nonzero().flatten().tolist()
        if not kids or rng.random() < 0.3:
            break
        node = rng.choice(kids)
        out.append(int(tree.tokens[node]))
    return out + [rng.randrange(VOCAB)]


def check(kv: TreeKV, tree, verified: list[int], missing: list[int]) -> None:
    """Prefix slots hold the verified tokens' KV; each expanded node's slot holds its own KV."""
    have = len(verified) - len(missing)
    assert kv.prefix_len == have
    for pos in range(have):
        assert torch.equal(kv.cache.k[0, pos], kv_of(verified[: pos + 1]))
    for node in range(len(tree)):
        slot = int(kv.node_slot[node])
        assert (slot >= 0) == bool(tree.expanded[node])
        if slot >= 0:
            assert kv.prefix_len <= slot < kv.kv_len
            assert torch.equal(kv.cache.v[0, slot], kv_of(verified + tree.tokens[path_to(tree, node)].tolist()))


def test_commit_and_compact_match_recompute_under_random_rerooting() -> None:
    rng = random.Random(0)
    for trial in range(40):
        budget = 40
        kv = TreeKV(KVCache(1, 400, 1, 4, torch.float32), budget)
        prompt = [rng.randrange(VOCAB) for _ in range(5)]
        for pos, _ in enumerate(prompt):
            write(kv, pos, prompt[: pos + 1])
        kv.append_prefix(prompt)
        verified, tree = list(prompt), new_tree(rng.randrange(VOCAB))
        for _ in range(6):
            for _ in range(rng.randint(1, 3)):
                if len(tree) < budget:
                    tree = expand(kv, tree, verified, rng, width=rng.randint(1, 4), budget=budget)
            emitted = random_emitted(tree, rng)
            step = reroot(tree, emitted)
            missing = kv.reroot(tree, step, emitted)
            verified = verified + [int(tree.tokens[0])] + emitted[:-1]
            tree = step.tree if step.tree is not None else new_tree(emitted[-1])
            check(kv, tree, verified, missing)
            assert kv.text == verified[: kv.prefix_len]  # the prompt cache's record of the prefix
            for tok in missing:  # recompute what had no KV, as the drafter does
                write(kv, kv.prefix_len, verified[: kv.prefix_len + 1])
                kv.append_prefix([tok])
            assert step.tree is None or not missing


def test_survivors_are_exactly_the_new_roots_descendants() -> None:
    rng = random.Random(1)
    kv = TreeKV(KVCache(1, 200, 1, 4, torch.float32), 64)
    tree = new_tree(0)
    for _ in range(4):
        tree = expand(kv, tree, [], rng, width=3, budget=64)
    child = int((tree.parents == 0).nonzero()[0])
    step = reroot(tree, [int(tree.tokens[child])])
    kv.reroot(tree, step, [int(tree.tokens[child])])
    kept = set((step.index_map >= 0).nonzero().flatten().tolist())
    desc = {n for n in range(len(tree)) if child in path_to(tree, n).tolist()}
    assert kept == desc
    assert kv.tree_len == int(step.tree.expanded.sum())
