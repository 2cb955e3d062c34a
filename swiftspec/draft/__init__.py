"""The draft side: grows a token tree with the draft model and keeps its KV cache evolving."""

from swiftspec.draft.drafter import TreeDrafter, build_drafter

__all__ = ["TreeDrafter", "build_drafter"]
