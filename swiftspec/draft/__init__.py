"""The draft side: grows a token tree with the draft model (and prompt lookup) and keeps its KV cache evolving."""

from swiftspec.draft.drafter import TreeDrafter, build_drafter
from swiftspec.draft.lookup import LookupDrafter, PromptLookup

__all__ = ["LookupDrafter", "PromptLookup", "TreeDrafter", "build_drafter"]
