"""Token ids -> final text pieces for one response: incremental UTF-8 decoding, then the stops.

A piece is final when no later token can change it: the decoder holds back partial characters,
and this module holds back any tail of the text that could still grow into a stop string.
Besides stop strings, a response may end at a stop token (not shown; FIM's end tokens) or, for
/infill's `n_indent`, at the first later line indented less than asked (llama.cpp's rule: the text
ends just before that line's first non-blank character).
"""

from __future__ import annotations

from swiftspec.tokenizer import IncrementalDecoder, Tokenizer

WORD, TOKEN, INDENT = "word", "token", "indent"  # TextStream.stop_reason


class TextStream:
    """Feeds tokens one at a time; `stopped` turns True once a stop has been met (`stop_reason`)."""

    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...], stop_ids: frozenset[int] = frozenset(),
                 min_indent: int = 0) -> None:
        self._decoder = IncrementalDecoder(tokenizer)
        self._stop = tuple(s for s in stop if s)
        self._stop_ids = stop_ids
        self._pending = ""  # decoded text not yet emitted: a possible start of a stop string
        self._min_indent = min_indent
        self._indent: int | None = None  # blanks so far on a line after the first; None: none pending
        self.stop_reason: str | None = None
        self.stop_word = ""  # the stop string that ended the text, if one did
        self.saw_newline = False  # some emitted text holds a line break

    @property
    def stopped(self) -> bool:
        return self.stop_reason is not None

    def push(self, token_id: int) -> str:
        """Add one token; return the text that became final ('' while held back or after a stop)."""
        if self.stopped:
            return ""
        if token_id in self._stop_ids:
            text = self.finish()
            self.stop_reason = self.stop_reason or TOKEN
            return text
        return self._lines(self._scan(self._decoder.push(token_id)))

    def finish(self) -> str:
        """The text still held back once generation has ended (no more tokens will come)."""
        if self.stopped:
            return ""
        text = self._scan(self._decoder.flush())
        if not self.stopped:
            text, self._pending = text + self._pending, ""
        return self._lines(text)

    def _scan(self, text: str) -> str:
        """Append text; cut exactly before the earliest stop string, or hold back a possible start."""
        pending = self._pending + text
        hits = [(i, s) for i, s in ((pending.find(s), s) for s in self._stop) if i >= 0]
        if hits:
            cut, self.stop_word = min(hits)
            self.stop_reason, self._pending = WORD, ""
            return pending[:cut]
        keep = _longest_stop_prefix(pending, self._stop)
        self._pending = pending[len(pending) - keep :]
        return pending[: len(pending) - keep]

    def _lines(self, text: str) -> str:
        """Note line breaks in final text; with a min_indent, cut before a line indented less."""
        for i, char in enumerate(text):
            if char == "\n":
                self.saw_newline = True
                self._indent = 0
            elif self._indent is None or not self._min_indent:
                continue
            elif char in " \t":
                self._indent += 1
            elif self._indent < self._min_indent:
                self.stop_reason, self._pending = INDENT, ""
                return text[:i]
            else:
                self._indent = None
        return text


def _longest_stop_prefix(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of text that is a proper prefix of some stop string."""
    best = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:k]):
                best = k
                break
    return best
