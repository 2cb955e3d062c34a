"""Token trees: the TokenTree type, growth, grafting, subtree selection, draft masks and re-rooting (pure)."""

from swiftspec.tree.graft import Graft, graft, reweight
from swiftspec.tree.grow import coupled_children, grow, sample_children, select_leaves, topk_children
from swiftspec.tree.reroot import Reroot, reroot
from swiftspec.tree.subtree import Subtree, best_size, draft_mask, select_subtree
from swiftspec.tree.tree import (
    TokenTree,
    ancestor_rows,
    depths,
    depths_from_parents,
    descendants,
    mask_from_parents,
    new_tree,
    path_key,
    path_to,
    path_weights,
    positions,
    sibling_links,
)

__all__ = [
    "Graft",
    "Reroot",
    "Subtree",
    "TokenTree",
    "ancestor_rows",
    "best_size",
    "depths",
    "depths_from_parents",
    "descendants",
    "draft_mask",
    "graft",
    "grow",
    "mask_from_parents",
    "new_tree",
    "path_key",
    "path_to",
    "path_weights",
    "positions",
    "reroot",
    "reweight",
    "coupled_children",
    "sample_children",
    "select_leaves",
    "select_subtree",
    "sibling_links",
    "topk_children",
]
