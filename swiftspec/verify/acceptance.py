"""The result of verifying one tree (or a batch of trees): accepted path and emitted tokens."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True, slots=True, eq=False)
class Acceptance:
    """Accepted path and emitted tokens, padded to the tree size so shapes stay static.

    Fields may carry a leading batch dimension (verify_probs); `nodes`, `tokens` and `row`
    are for the unbatched form. Reading `nodes` or `tokens` syncs with the host.
    """

    path: Tensor  # [..., n] int64 local nodes root .. last accepted, then -1
    emitted: Tensor  # [..., n] int64 accepted draft tokens, then the bonus/recovered one, then -1
    length: Tensor  # [...] int64 a + 1 = entries in use in path and emitted (acceptance length)

    @property
    def nodes(self) -> Tensor:
        """[a + 1] int64: root .. last accepted node."""
        return self.path[: int(self.length)]

    @property
    def tokens(self) -> Tensor:
        """[a + 1] int64: the tokens this round emits."""
        return self.emitted[: int(self.length)]

    @property
    def last(self) -> Tensor:
        """[...] int64 local index of the last accepted node (no host sync)."""
        return self.path.gather(-1, (self.length - 1).unsqueeze(-1)).squeeze(-1)

    def row(self, b: int) -> Acceptance:
        """Trial b of a batched result."""
        return Acceptance(path=self.path[b], emitted=self.emitted[b], length=self.length[b])


def accept_path(
    tokens: Tensor,  # [B, n] int64
    mask: Tensor,  # [B, n, n] bool ancestor-or-self
    last: Tensor,  # [B] int64 last accepted node
    bonus: Tensor,  # [B] int64 the target's own token at `last`
) -> Acceptance:
    """Pack the root path of `last` and the emitted tokens into an Acceptance. No host sync."""
    batch, n = tokens.shape
    on_path = mask.gather(1, last.view(batch, 1, 1).expand(batch, 1, n)).squeeze(1)  # [B, n]
    length = on_path.sum(-1)
    index = torch.arange(n, device=tokens.device)
    path = torch.where(on_path, index, n).sort(-1).values  # ancestors have lower indices
    unused = index >= length.unsqueeze(-1)
    path_tokens = tokens.gather(1, path.clamp_max(n - 1))
    emitted = torch.cat([path_tokens[:, 1:], path_tokens[:, :1]], dim=1)  # drop the root
    emitted = emitted.scatter(1, (length - 1).unsqueeze(-1), bonus.unsqueeze(-1))
    return Acceptance(
        path=path.masked_fill(unused, -1), emitted=emitted.masked_fill(unused, -1), length=length
    )
