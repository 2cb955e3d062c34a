"""Token ids -> final text pieces for one response: incremental UTF-8 decoding, then stop strings.

A piece is final when no later token can change it: the decoder holds back partial characters,
and this module holds back any tail of the text that could still grow into a stop string.
"""

from __future__ import annotations

from swiftspec.tokenizer import IncrementalDecoder, Tokenizer


class TextStream:
    """Feeds tokens one at a time; `stopped` turns True once a stop string has appeared."""

    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...]) -> None:
        self._decoder = IncrementalDecoder(tokenizer)
        self._stop = tuple(s for s in stop if s)
        self._pending = ""  # decoded text not yet emitted: a possible start of a stop string
        self.stopped = False

    def push(self, token_id: int) -> str:
        """Add one token; return the text that became final ('' while held back or after a stop)."""
        if self.stopped:
            return ""
        return self._scan(self._decoder.push(token_id))

    def finish(self) -> str:
        """The text still held back once generation has ended (no more tokens will come)."""
        if self.stopped:
            return ""
        text = self._scan(self._decoder.flush())
        if self.stopped:
            return text
        text, self._pending = text + self._pending, ""
        return text

    def _scan(self, text: str) -> str:
        """Append text; cut exactly before the earliest stop string, or hold back a possible start."""
        pending = self._pending + text
        hits = [i for i in (pending.find(s) for s in self._stop) if i >= 0]
        if hits:
            self.stopped = True
            self._pending = ""
            return pending[: min(hits)]
        keep = _longest_stop_prefix(pending, self._stop)
        self._pending = pending[len(pending) - keep :]
        return pending[: len(pending) - keep]


def _longest_stop_prefix(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of text that is a proper prefix of some stop string."""
    best = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:k]):
                best = k
                break
    return best
