"""The draft side: grows a token tree with the draft model and keeps its KV cache evolving."""

from swiftspec.draft.drafter import TreeDrafter

__all__ = ["TreeDrafter"]
