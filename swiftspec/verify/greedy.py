"""Greedy tree verification: follow the target's argmax as deep as the tree allows."""

from __future__ import annotations

from torch import Tensor

from swiftspec.tree import mask_from_parents
from swiftspec.verify.acceptance import Acceptance, accept_path


def verify_greedy(
    tokens: Tensor,  # [n] int64 node tokens, root first
    parents: Tensor,  # [n] int64 local parent indices, parents[0] == -1
    target_logits: Tensor,  # [n, V] row i = the target's logits after node i
) -> Acceptance:
    """Longest root path whose nodes all equal the argmax of their parent's row, plus the
    bonus argmax at its end. Vectorised, no host sync; ties go to the lower node index."""
    best = target_logits.argmax(-1)  # [n]
    agrees = (tokens == best[parents.clamp_min(0)]) | (parents < 0)
    mask = mask_from_parents(parents)  # [n, n]
    accepted = ~(mask & ~agrees).any(-1)  # every node on the path agrees
    depth = mask.sum(-1) - 1
    last = depth.masked_fill(~accepted, -1).argmax().reshape(1)  # indexing by a 0-d tensor syncs
    acceptance = accept_path(tokens[None], mask[None], last, best.gather(0, last))
    return acceptance.row(0)
