"""Lossless stochastic tree verification: multi-candidate rejection sampling at every node.

The walk runs n - 1 lock-step rounds over a batch of trees; each round tests one child per
tree, so every tree finishes in time and nothing waits on the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from swiftspec.sampling import SamplingParams, process_logits, sample
from swiftspec.tree import mask_from_parents, sibling_links
from swiftspec.verify.acceptance import Acceptance, accept_path

_TINY = torch.finfo(torch.float32).tiny


@dataclass(slots=True)
class _Walk:
    """Where each tree's walk stands: the node reached and the child to test next."""

    node: Tensor  # [B] int64 last accepted node
    child: Tensor  # [B] int64 next child to test, -1 when the walk is over
    residual: Tensor  # [B, V] p': the target distribution left at `node`
    proposal: Tensor | None  # [B, V] q_j: what `child` was drawn from (sampled drafts only)


def _normalize(mass: Tensor, fallback: Tensor) -> Tensor:
    """Rows of mass [B, V] scaled to sum 1; fallback rows where no mass is left (float ties)."""
    total = mass.sum(-1, keepdim=True)
    return torch.where(total > 0, mass / total.clamp_min(_TINY), fallback)


def _reject_deterministic(residual: Tensor, token: Tensor) -> Tensor:
    """After rejecting top-k child `token` [B, 1]: p' <- normalize(p' without token)."""
    return _normalize(residual.scatter(1, token, 0.0), residual)


def _reject_sampled(residual: Tensor, proposal: Tensor, token: Tensor) -> tuple[Tensor, Tensor]:
    """After rejecting sampled child `token` [B, 1] drawn from q_j = proposal [B, V]:
    p' <- normalize(max(0, p' - q_j)), and the next sibling's q is q_j without token."""
    leftover = _normalize((residual - proposal).clamp_min(0.0), residual)
    excluded = proposal.scatter(1, token, 0.0)
    return leftover, _normalize(excluded, excluded)


def _step(walk: _Walk, tokens: Tensor, p: Tensor, q: Tensor | None, links: tuple[Tensor, Tensor],
          generator: torch.Generator | None) -> _Walk:
    """Test each tree's current child once: accept and descend, or reject and move on."""
    rows = torch.arange(tokens.shape[0], device=tokens.device)
    active = walk.child >= 0
    child = walk.child.clamp_min(0)
    token = tokens[rows, child].unsqueeze(-1)  # [B, 1]
    p_token = walk.residual.gather(1, token).squeeze(-1)
    uniform = torch.rand(p_token.shape, generator=generator, device=p_token.device)
    if walk.proposal is None:  # deterministic draft: accept with probability p'(c)
        accept = active & (uniform < p_token)
        residual, proposal = _reject_deterministic(walk.residual, token), None
    else:  # sampled draft: accept with probability min(1, p'(c) / q_j(c))
        accept = active & (uniform * walk.proposal.gather(1, token).squeeze(-1) < p_token)
        residual, proposal = _reject_sampled(walk.residual, walk.proposal, token)
    reject = (active & ~accept).unsqueeze(-1)
    descend = accept.unsqueeze(-1)
    first_child, next_sibling = links
    residual = torch.where(descend, p[rows, child], torch.where(reject, residual, walk.residual))
    if proposal is not None:
        proposal = torch.where(descend, q[rows, child], torch.where(reject, proposal, walk.proposal))
    following = torch.where(accept, first_child[rows, child], next_sibling[rows, child])
    return _Walk(
        node=torch.where(accept, child, walk.node),
        child=torch.where(active, following, walk.child),
        residual=residual,
        proposal=proposal,
    )


def verify_probs(
    tokens: Tensor,  # [B, n] int64 node tokens of B trees, root first
    parents: Tensor,  # [B, n] int64 local parents, -1 at the root, parent < child
    target_probs: Tensor,  # [B, n, V] p after node i (already processed)
    draft_probs: Tensor | None,  # [B, n, V] q at node i; None for deterministic drafts
    generator: torch.Generator | None,
    deterministic: bool,
) -> Acceptance:
    """Batched core of verify_stochastic on processed target probs; fields gain a [B] dim."""
    if not deterministic and draft_probs is None:
        raise ValueError("sampled drafts need draft_probs (q at every node)")
    p = target_probs.float()
    q = None if deterministic else draft_probs.float()
    links = sibling_links(parents)
    batch = tokens.shape[0]
    walk = _Walk(
        node=torch.zeros(batch, dtype=torch.int64, device=tokens.device),
        child=links[0][:, 0],
        residual=p[:, 0],
        proposal=None if q is None else q[:, 0],
    )
    for _ in range(tokens.shape[1] - 1):  # each round tests one child; a tree has n - 1
        walk = _step(walk, tokens, p, q, links, generator)
    bonus = sample(walk.residual, generator)  # recovered token, or bonus at a childless node
    return accept_path(tokens, mask_from_parents(parents), walk.node, bonus)


def verify_stochastic(
    tokens: Tensor,  # [n] int64 node tokens, root first
    parents: Tensor,  # [n] int64 local parents, parents[0] == -1
    target_logits: Tensor,  # [n, V] row i = the target's logits after node i
    draft_probs: Tensor | None,  # [n, V] q at node i: what its children were drawn from
    params: SamplingParams,
    generator: torch.Generator | None,
    deterministic: bool,
) -> Acceptance:
    """Lossless verification of one tree against p = process_logits(target_logits, params).

    deterministic=True (top-k children, q a point mass): accept child c with probability p'(c);
    on rejection zero p'(c), renormalise, try the next sibling.
    deterministic=False (sampled children): SpecInfer's rule, accept c with probability
    min(1, p'(c) / q_j(c)), on rejection p' <- normalize(max(0, p' - q_j)). Siblings are
    distinct, so child j was drawn from q_j = q without siblings 0..j-1 (renormalised); that
    is what sample_children does. Children must be in draw order and be the first drawn.
    When no child is accepted, the recovered token is a sample from p'. All randomness comes
    from `generator`.
    """
    probs = process_logits(target_logits, params)
    draft = None if draft_probs is None else draft_probs[None]
    result = verify_probs(tokens[None], parents[None], probs[None], draft, generator, deterministic)
    return result.row(0)
