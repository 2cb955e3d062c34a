"""The draft/target pairing check (runner.load.check_pair): the same spelling of every id the draft can
emit, padding rows aside; any other mismatch is one line that names it."""

from __future__ import annotations

import pytest

from swiftspec.config import ConfigError
from swiftspec.runner.load import check_pair
from swiftspec.testing.tiny import add_tokenizer
from swiftspec.tokenizer import Tokenizer, vocab_mismatch


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory) -> dict[int, Tokenizer]:
    """Tiny BPE tokenizers of 512 and 600 entries: the same merges first, the specials last."""
    root = tmp_path_factory.mktemp("tok")
    return {n: Tokenizer.from_dir(add_tokenizer(root / str(n), n)) for n in (512, 600)}


def _error(target: Tokenizer, draft: Tokenizer, target_rows: int, draft_rows: int) -> str:
    with pytest.raises(ConfigError) as info:
        check_pair(target, draft, target_rows, draft_rows)
    message = str(info.value)
    assert "\n" not in message and message.startswith("draft and target do not pair: ")
    return message


def test_same_tokenizer_pairs_with_padding_rows(tokenizers) -> None:
    tok = tokenizers[512]
    check_pair(tok, tok)
    check_pair(tok, tok, target_rows=640, draft_rows=512)  # the target's head padded past the vocabulary
    check_pair(tok, tok, target_rows=640, draft_rows=576)  # both padded, the draft less


def test_draft_rows_the_target_cannot_score_are_refused(tokenizers) -> None:
    tok = tokenizers[512]
    assert "the draft's LM head has 640 rows, the target's 512" in _error(tok, tok, 512, 640)


def test_first_differing_token_is_named(tokenizers) -> None:
    small, big = tokenizers[512], tokenizers[600]
    assert small.tokens[:509] == big.tokens[:509]  # the shared merges; then the small one's specials
    message = _error(small, big, 512, 600)
    assert f"token 509 is '<|endoftext|>' in the target's vocabulary and {big.tokens[509]!r} in the draft's" in message


def test_extra_tokens_on_either_side_are_refused() -> None:
    target, draft = ["a", "b", "<|im_end|>"], ["a", "b"]
    assert vocab_mismatch(target, draft, 4, 4) == \
        "the target's vocabulary has 3 tokens, the draft's 2: target token 2 ('<|im_end|>') is unknown to the draft"
    assert "draft token 2 ('<|im_end|>') is unknown to the target" in vocab_mismatch(draft, target, 4, 4)
    assert vocab_mismatch(target, target, 4, 3) is None
