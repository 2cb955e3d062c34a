"""Tree verification against the target's own token at every node: greedy (its argmax) and
position-keyed sampling (its draw, sampling.Draws); both follow the target as deep as the tree allows."""

from __future__ import annotations

from torch import Tensor

from swiftspec.sampling import SamplingParams, process_logits, sample_at
from swiftspec.tree import mask_from_parents
from swiftspec.verify.acceptance import Acceptance, accept_path


def verify_greedy(
    tokens: Tensor,  # [n] int64 node tokens, root first
    parents: Tensor,  # [n] int64 local parent indices, parents[0] == -1
    target_logits: Tensor,  # [n, V] row i = the target's logits after node i
) -> Acceptance:
    """Longest root path whose nodes all equal the argmax of their parent's row, plus the
    bonus argmax at its end. Vectorised, no host sync; ties go to the lower node index."""
    return follow_picks(tokens, parents, target_logits.argmax(-1))


def verify_sampled(
    tokens: Tensor,  # [n] int64 node tokens, root first
    parents: Tensor,  # [n] int64 local parent indices, parents[0] == -1
    target_logits: Tensor,  # [n, V] row i = the target's logits after node i
    params: SamplingParams,
    uniforms: Tensor,  # [n] float64: the uniform of the position after node i (sampling.Draws)
) -> Acceptance:
    """Sampled verification with position-keyed draws: the target draws its token after every node
    (sample_at of p = process_logits at that position's uniform), and the round follows those draws
    as verify_greedy follows the argmax.  The emitted tokens are the ones autoregressive decoding
    draws with the same Draws, so they follow p exactly.

    This is the deterministic-draft rule of multi-candidate rejection sampling (accept child c_j
    with probability p'(c_j), else remove it from p' and renormalise) under one coupling: a node's
    children are accepted with probabilities p(c_1), then p(c_2) / (1 - p(c_1)), ..., and the
    recovered token is a draw from p without the rejected children, as there; what differs is that
    the uniform belongs to the position, not to the test, so the draws never depend on the tree."""
    return follow_picks(tokens, parents, sample_at(process_logits(target_logits, params), uniforms))


def follow_picks(
    tokens: Tensor,  # [n] int64 node tokens, root first
    parents: Tensor,  # [n] int64 local parent indices, parents[0] == -1
    picks: Tensor,  # [n] int64 the target's token after node i
) -> Acceptance:
    """Longest root path whose nodes all equal their parent's pick, plus the pick at its end (the
    bonus). Vectorised, no host sync; ties go to the lower node index."""
    agrees = (tokens == picks[parents.clamp_min(0)]) | (parents < 0)
    mask = mask_from_parents(parents)  # [n, n]
    accepted = ~(mask & ~agrees).any(-1)  # every node on the path agrees
    depth = mask.sum(-1) - 1
    last = depth.masked_fill(~accepted, -1).argmax().reshape(1)  # indexing by a 0-d tensor syncs
    acceptance = accept_path(tokens[None], mask[None], last, picks.gather(0, last))
    return acceptance.row(0)
