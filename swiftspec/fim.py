"""Fill-in-the-middle prompts: a model's FIM control tokens, found by name in its vocabulary, and the
prompt they frame, prefix-suffix-middle: [FIM_PRE]prefix[FIM_SUF]suffix[FIM_MID], then the model writes
the middle. /infill puts llama.cpp's repo-level context before it (format_infill in its server):

    [FIM_REP]myproject\\n[FIM_SEP]{filename}\\n{text}...[FIM_SEP]filename\\n[FIM_PRE]...

Control tokens go in by id; the user's text is encoded as plain text, so typing "<|fim_prefix|>"
never makes a control token.
"""

from __future__ import annotations

from dataclasses import dataclass

from swiftspec.tokenizer import Tokenizer

REPO_NAME = "myproject"  # llama.cpp's fixed repository and file names of the repo-level header
FILE_NAME = "filename"
SNIPPET_SEP = "\n\n--- snippet ---\n\n"  # llama.cpp's separator of extra chunks without FIM_SEP


@dataclass(frozen=True, slots=True)
class FimSpelling:
    """One model family's FIM token names."""

    prefix: str
    suffix: str
    middle: str
    repo: str | None  # repo-level context: repository name token
    file_sep: str | None  # and file separator token
    stops: tuple[str, ...]  # tokens that end the middle besides EOS


SPELLINGS = (
    FimSpelling("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>",
                ("<|fim_pad|>", "<|endoftext|>", "<|repo_name|>", "<|file_sep|>")),  # Qwen2.5-Coder
    FimSpelling("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<repo_name>", "<file_sep>",
                ("<fim_pad>", "<|endoftext|>", "<repo_name>", "<file_sep>")),  # StarCoder(2)
    FimSpelling("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>", None, None, ()),  # DeepSeek-Coder
)


@dataclass(frozen=True, slots=True)
class FimTokens:
    """The ids of one model's FIM tokens."""

    prefix: int
    suffix: int
    middle: int
    repo: int | None
    file_sep: int | None
    stops: frozenset[int]  # besides the tokenizer's EOS ids


def find_fim_tokens(tokenizer: Tokenizer) -> FimTokens | None:
    """The first spelling whose prefix, suffix and middle tokens the vocabulary has, or None."""
    for s in SPELLINGS:
        ids = [tokenizer.added_token_id(name) for name in (s.prefix, s.suffix, s.middle)]
        if None not in ids:
            stops = {tokenizer.added_token_id(name) for name in s.stops} - {None}
            return FimTokens(prefix=ids[0], suffix=ids[1], middle=ids[2],
                             repo=s.repo and tokenizer.added_token_id(s.repo),
                             file_sep=s.file_sep and tokenizer.added_token_id(s.file_sep),
                             stops=frozenset(stops))
    return None


@dataclass(frozen=True, slots=True)
class ExtraChunk:
    """A piece of another file (or of this one) given as context."""

    filename: str
    text: str


@dataclass(frozen=True, slots=True)
class FimInput:
    """The text around the cursor: `middle` is text typed before the cursor that the prompt puts
    right after the prefix (llama.cpp's `prompt`: the cursor line so far)."""

    prefix: str
    suffix: str
    middle: str = ""
    extra: tuple[ExtraChunk, ...] = ()


@dataclass(frozen=True, slots=True)
class FimPrompt:
    ids: list[int]
    truncated: bool  # some prefix, suffix or extra context was left out to fit the budget


def plain_prompt(tokenizer: Tokenizer, tokens: FimTokens, parts: FimInput) -> list[int]:
    """[BOS][FIM_PRE]prefix middle[FIM_SUF]suffix[FIM_MID], whole (extra context is not used)."""
    encode = tokenizer.encode_text
    return [*tokenizer.start_ids, tokens.prefix, *encode(parts.prefix), *encode(parts.middle),
            tokens.suffix, *encode(parts.suffix), tokens.middle]


def repo_prompt(tokenizer: Tokenizer, tokens: FimTokens, parts: FimInput, budget: int) -> FimPrompt:
    """The /infill prompt in at most `budget` tokens where it can be made to fit: the prefix keeps
    its end and the suffix its start (at least 3/4 of the room for the prefix, as llama.cpp's split),
    then the extra context takes what is left, dropping its oldest (first) chunks whole. A middle
    too long on its own is kept, and the caller's length check refuses the prompt."""
    encode = tokenizer.encode_text
    prefix, suffix, middle = encode(parts.prefix), encode(parts.suffix), encode(parts.middle)
    fixed = len(tokenizer.start_ids) + 3 + len(middle)
    room = max(0, budget - fixed)
    keep_suffix = min(len(suffix), max(room // 4, room - len(prefix)))
    keep_prefix = min(len(prefix), room - keep_suffix)
    local = [tokens.prefix, *prefix[len(prefix) - keep_prefix:], *middle,
             tokens.suffix, *suffix[:keep_suffix], tokens.middle]
    chunks = [_chunk_ids(tokenizer, tokens, chunk) for chunk in parts.extra]
    head, tail = _repo_frame(tokenizer, tokens)
    left = budget - fixed - keep_prefix - keep_suffix - len(head) - len(tail)
    while chunks and sum(map(len, chunks)) > left:
        chunks.pop(0)
    frame = [*head, *(t for c in chunks for t in c), *tail] if left >= 0 else []
    dropped = len(chunks) < len(parts.extra)
    truncated = keep_prefix < len(prefix) or keep_suffix < len(suffix) or dropped
    return FimPrompt(ids=[*tokenizer.start_ids, *frame, *local], truncated=truncated)


def _repo_frame(tokenizer: Tokenizer, tokens: FimTokens) -> tuple[list[int], list[int]]:
    """What goes before the extra chunks and after them (empty without repo-level tokens)."""
    head = [tokens.repo, *tokenizer.encode_text(REPO_NAME + "\n")] if tokens.repo is not None else []
    tail = [tokens.file_sep, *tokenizer.encode_text(FILE_NAME + "\n")] if tokens.file_sep is not None else []
    return head, tail


def _chunk_ids(tokenizer: Tokenizer, tokens: FimTokens, chunk: ExtraChunk) -> list[int]:
    encode = tokenizer.encode_text
    if tokens.file_sep is None:
        return encode(SNIPPET_SEP) + encode(chunk.text)
    return [tokens.file_sep, *encode(chunk.filename + "\n"), *encode(chunk.text)]
