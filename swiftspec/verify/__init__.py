"""Tree verification: which draft tokens the target accepts, and the token it adds (pure).

Vocabulary:
- root: the last verified token; node 0 of the tree sent to the target.
- node: one entry of that tree (a token, its parent, and the target's logits after it).
- path: the nodes from the root down to one node.
- accepted: a draft node the target kept; accepted nodes form one path from the root.
- recovered token: drawn from the residual p' once every child of the last accepted node failed
  (verify_sampled: the target's own draw there, which no child matched).
- bonus token: drawn from p at a last accepted node with no children (greedy: the argmax there).
Each round emits the accepted draft tokens plus one recovered or bonus token.
"""

from swiftspec.verify.acceptance import Acceptance
from swiftspec.verify.greedy import follow_picks, verify_greedy, verify_sampled
from swiftspec.verify.stochastic import verify_probs, verify_stochastic

__all__ = ["Acceptance", "follow_picks", "verify_greedy", "verify_probs", "verify_sampled", "verify_stochastic"]
