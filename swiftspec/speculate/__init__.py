"""Speculation: the draft side grows a token tree (TreeDrafter, prompt lookup) over an evolving KV
cache; the target side verifies a subtree of it in one forward (TreeVerifier)."""

from swiftspec.speculate.drafter import TreeDrafter, build_drafter
from swiftspec.speculate.lookup import LookupDrafter, PromptLookup
from swiftspec.speculate.packed_drafts import Draft, load_drafter
from swiftspec.speculate.verifier import TreeVerifier

__all__ = ["Draft", "LookupDrafter", "PromptLookup", "TreeDrafter", "TreeVerifier", "build_drafter", "load_drafter"]
