"""Fill-in-the-middle prompts (serve/fim.py) and the stops FIM adds to the text stream: control tokens
go in by id, user text never becomes one, the repo-level layout is llama.cpp's, and a prompt over
its budget keeps the text nearest the cursor."""

from __future__ import annotations

from pathlib import Path

import pytest

from swiftspec.fim import (
    ExtraChunk,
    FimInput,
    find_fim_tokens,
    plain_prompt,
    repo_prompt,
)
from swiftspec.serve.text_stream import INDENT, TOKEN, WORD, TextStream
from swiftspec.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok(tiny_fim_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(tiny_fim_dir)


def control_ids(tok: Tokenizer) -> set[int]:
    names = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")
    return {tok.added_token_id(n) for n in names}


def test_fim_tokens_are_found_by_name(tok: Tokenizer, tiny_qwen_dir: Path) -> None:
    tokens = find_fim_tokens(tok)
    assert tokens is not None
    assert (tokens.prefix, tokens.suffix, tokens.middle) == tuple(
        tok.added_token_id(n) for n in ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"))
    assert tokens.stops == {tok.added_token_id(n) for n in ("<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
                                                            "<|endoftext|>")}
    assert find_fim_tokens(Tokenizer.from_dir(tiny_qwen_dir)) is None  # no FIM tokens in that vocabulary


def test_plain_prompt_layout(tok: Tokenizer) -> None:
    tokens = find_fim_tokens(tok)
    ids = plain_prompt(tok, tokens, FimInput(prefix="def add(a, b):\n", suffix="\nprint(add(1, 2))\n"))
    assert tok.decode(ids, skip_special_tokens=False) == (
        "<|fim_prefix|>def add(a, b):\n<|fim_suffix|>\nprint(add(1, 2))\n<|fim_middle|>")
    assert [t for t in ids if t in control_ids(tok)] == [tokens.prefix, tokens.suffix, tokens.middle]


def test_user_text_never_becomes_a_control_token(tok: Tokenizer) -> None:
    tokens = find_fim_tokens(tok)
    sneaky = "x = '<|fim_middle|><|file_sep|><|endoftext|>'"
    ids = plain_prompt(tok, tokens, FimInput(prefix=sneaky, suffix="<|fim_prefix|>"))
    assert [t for t in ids if t in control_ids(tok) | tok.eos_token_ids] == [tokens.prefix, tokens.suffix,
                                                                             tokens.middle]
    assert tok.decode(ids, skip_special_tokens=False) == (
        f"<|fim_prefix|>{sneaky}<|fim_suffix|><|fim_prefix|><|fim_middle|>")
    assert tok.encode(sneaky) != tok.encode_text(sneaky)  # plain encode() still parses them (chat, prompts)


def test_repo_prompt_layout_is_llama_cpp_format_infill(tok: Tokenizer) -> None:
    parts = FimInput(prefix="def f(x):\n", suffix="\n", middle="    ret",
                     extra=(ExtraChunk("a.py", "A = 1\n"), ExtraChunk("b.py", "B = 2\n")))
    fim = repo_prompt(tok, find_fim_tokens(tok), parts, budget=1000)
    assert not fim.truncated
    assert tok.decode(fim.ids, skip_special_tokens=False) == (
        "<|repo_name|>myproject\n<|file_sep|>a.py\nA = 1\n<|file_sep|>b.py\nB = 2\n<|file_sep|>filename\n"
        "<|fim_prefix|>def f(x):\n    ret<|fim_suffix|>\n<|fim_middle|>")


def test_repo_prompt_over_budget_keeps_the_text_nearest_the_cursor(tok: Tokenizer) -> None:
    tokens = find_fim_tokens(tok)
    prefix, suffix = "".join(f"a{i} = {i}\n" for i in range(60)), "".join(f"b{i} = {i}\n" for i in range(60))
    extra = tuple(ExtraChunk(f"f{i}.py", f"c{i} = {i}\n") for i in range(8))
    whole = repo_prompt(tok, tokens, FimInput(prefix=prefix, suffix=suffix, extra=extra), budget=10_000)
    for budget in (60, 200, len(whole.ids) - 5):
        fim = repo_prompt(tok, tokens, FimInput(prefix=prefix, suffix=suffix, extra=extra), budget)
        assert fim.truncated and len(fim.ids) <= budget
        text = tok.decode(fim.ids, skip_special_tokens=False)
        kept_prefix = text[text.index("<|fim_prefix|>") + 14 : text.index("<|fim_suffix|>")]
        kept_suffix = text[text.index("<|fim_suffix|>") + 14 : text.index("<|fim_middle|>")]
        assert prefix.endswith(kept_prefix) and suffix.startswith(kept_suffix)
        assert len(kept_prefix) >= len(kept_suffix)  # the prefix gets at least 3/4 of the room
        kept = [c.filename for c in extra if f"<|file_sep|>{c.filename}\n" in text]
        assert kept == [c.filename for c in extra][len(extra) - len(kept) :]  # the oldest chunks go first
    fits = repo_prompt(tok, tokens, FimInput(prefix=prefix, suffix=suffix, extra=extra), len(whole.ids))
    assert fits == whole and not whole.truncated


def stream_text(tok: Tokenizer, ids: list[int], **settings) -> tuple[str, TextStream]:
    stream = TextStream(tok, **settings)
    pieces = [stream.push(t) for t in ids]
    return "".join(pieces) + stream.finish(), stream


def test_stop_token_ends_the_text_and_releases_what_was_held(tok: Tokenizer) -> None:
    pad = tok.added_token_id("<|fim_pad|>")
    ids = tok.encode_text("x = 1  # en") + [pad] + tok.encode_text("more")
    text, stream = stream_text(tok, ids, stop=("end",), stop_ids=frozenset({pad}))
    assert text == "x = 1  # en" and stream.stop_reason == TOKEN  # "en" was held back as a possible "end"


def test_min_indent_cuts_before_a_line_indented_less(tok: Tokenizer) -> None:
    ids = tok.encode_text("a\n    b\n  c\n  d")
    text, stream = stream_text(tok, ids, stop=(), min_indent=4)
    assert text == "a\n    b\n  " and stream.stop_reason == INDENT  # llama.cpp keeps that line's blanks
    text, stream = stream_text(tok, tok.encode_text("a\n    b\n\n    c"), stop=(), min_indent=4)
    assert text == "a\n    b\n\n    c" and not stream.stopped and stream.saw_newline  # blank lines pass
    text, stream = stream_text(tok, tok.encode_text("x = 1  # end of it"), stop=("end", "x = 1"))
    assert text == "" and stream.stop_reason == WORD and stream.stop_word == "x = 1"
