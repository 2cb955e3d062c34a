"""The tree bookkeeping of one draft expansion and one round, timed on random trees (docs/bench/depth-rules.md#tree-bookkeeping).

Trees grow 8 leaves x 8 children at a time from random draft log-probs up to N nodes (the budget
is 1024); each call is timed as the mean of 100 after one untimed call.

Run: .venv/bin/python benchmarks/tree_ops.py [--sizes 64,256,1024] [--threads 2]
"""

from __future__ import annotations

import argparse
import time

import torch

from swiftspec.tree import draft_mask, grow, new_tree, path_key, reroot, select_leaves, select_subtree


def random_tree(n: int):
    tree = new_tree(1)
    while len(tree) < n:
        leaves = select_leaves(tree, 8)
        children = torch.argsort(torch.rand(leaves.numel(), 1000), -1)[:, :8]  # [w, 8] distinct tokens
        tree = grow(tree, leaves, children, torch.log_softmax(torch.randn(leaves.numel(), 8), -1), n)
    return tree


def mean_us(call, repeats: int = 100) -> float:
    call()
    t0 = time.perf_counter()
    for _ in range(repeats):
        call()
    return 1e6 * (time.perf_counter() - t0) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,256,1024")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    print("| N | path_key | select_leaves | draft_mask | select_subtree | reroot |\n|---|---|---|---|---|---|")
    for n in (int(s) for s in args.sizes.split(",")):
        tree = random_tree(n)
        leaves, slots = select_leaves(tree, 8), torch.arange(n)
        child = int((tree.parents == 0).nonzero()[0])
        cells = [mean_us(lambda: path_key(tree)), mean_us(lambda: select_leaves(tree, 8, 8, -3.0)),
                 mean_us(lambda: draft_mask(tree, leaves, slots, 10, n + 10)), mean_us(lambda: select_subtree(tree, 8)),
                 mean_us(lambda: reroot(tree, [int(tree.tokens[child])]))]
        print(f"| {n} | " + " | ".join(f"{c:.0f}" for c in cells) + " |")


if __name__ == "__main__":
    main()
