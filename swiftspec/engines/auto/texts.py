"""The built-in texts `--mode auto` measures acceptance on: a code completion and a chat answer,
each a prompt and the default target's own greedy continuation of it (so that, for the default
pair, every position lies on the target's greedy path; for other pairs the positions where it
does not are marked and end a simulated round there)."""

from __future__ import annotations

from dataclasses import dataclass

CODE_PROMPT = (
    "def merge_intervals(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:\n"
    '    """Merge overlapping closed intervals and return them sorted by start."""\n'
)
CODE_CONTINUATION = (
    '    if not intervals:\n'
    '        return []\n'
    '    intervals.sort(key=lambda x: x[0])\n'
    '    merged = [intervals[0]]\n'
    '    for interval in intervals[1:]:\n'
    '        if interval[0] <= merged[-1][1]:\n'
    '            merged[-1][1] = max(merged[-1][1], interval[1])\n'
    '        else:\n'
)
CHAT_QUESTION = "Explain in a few sentences what a hash map is and when to use one."
CHAT_CONTINUATION = (
    'A hash map is a data structure that stores key-value pairs. It uses a hash function to map keys '
    'to indices in an array, which allows for constant-time access, insertion, and deletion. Hash '
    'maps are commonly used in applications where fast lookups are required, such as in caching '
    'systems, database indexing, and network routing.'
)


@dataclass(frozen=True, slots=True)
class Text:
    """Token ids of a prompt followed by its continuation."""

    ids: list[int]
    prompt_len: int  # ids[:prompt_len] is the prompt


def builtin_texts(tokenizer) -> list[Text]:  # tokenizer: swiftspec.tokenizer.Tokenizer of the target
    """The code text (plain completion) and, for a model with a chat template, the chat text through it."""
    code = tokenizer.encode(CODE_PROMPT)
    texts = [Text(code + tokenizer.encode(CODE_CONTINUATION), len(code))]
    if tokenizer.has_chat_template:  # a base model has none: its users send plain completions
        chat = tokenizer.chat([{"role": "user", "content": CHAT_QUESTION}])
        texts.append(Text(chat + tokenizer.encode(CHAT_CONTINUATION), len(chat)))
    return texts
