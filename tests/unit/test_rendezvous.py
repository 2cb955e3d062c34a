"""The handshake that runs before two hosts link: a shared secret, equal protocol and tokenizer, or a
one-line refusal on both sides; addresses and secrets are read strictly."""

from __future__ import annotations

import threading

import pytest

from swiftspec.errors import UserError
from swiftspec.parallel.rendezvous import (
    SECRET_ENV,
    HandshakeRefused,
    Hello,
    Listener,
    connect,
    mismatch,
    parse_address,
    read_secret,
)

TARGET = Hello(role="target", tokenizer="abc", verify_size=8, max_seq_len=256)
DRAFT = Hello(role="draft", tokenizer="abc", verify_size=8, max_seq_len=256)


def link(draft: Hello, draft_secret: bytes, target_secret: bytes = b"s3cret-s3cret"):
    """Run one handshake on loopback: (what the target's accept returned, the draft's result or error)."""
    listener = Listener("127.0.0.1:0", target_secret, TARGET, 5.0)
    accepted = []
    thread = threading.Thread(target=lambda: accepted.append(listener.accept()))
    thread.start()
    try:
        result = connect(f"127.0.0.1:{listener.port}", draft_secret, draft, 5.0)
    except HandshakeRefused as exc:
        result = exc
    thread.join(10)
    listener.close()
    return accepted[0], result


def test_the_same_secret_links_on_one_store() -> None:
    target, draft = link(DRAFT, b"s3cret-s3cret")
    assert target is not None and not isinstance(draft, Exception)
    target.store.set("k", "v")
    assert draft.store.get("k") == b"v"  # both sides see one store, under the session prefix


def test_a_wrong_secret_is_refused_on_both_sides(caplog: pytest.LogCaptureFixture) -> None:
    target, draft = link(DRAFT, b"not-the-secret")
    assert target is None and "wrong secret" in caplog.text
    assert isinstance(draft, HandshakeRefused) and str(draft) == "the target host refused to link: " \
        "the target host refused this host: wrong secret"


@pytest.mark.parametrize(("change", "words"), [
    ({"tokenizer": "xyz"}, "tokenizer differs"),
    ({"version": 99}, "protocol version 99 at the draft host"),
    ({"verify_size": 4}, "--verify-size 4 at the draft host"),
    ({"max_seq_len": 128}, "--max-seq-len 128"),
])
def test_a_mismatch_is_one_line(change: dict, words: str) -> None:
    import dataclasses

    theirs = dataclasses.replace(DRAFT, **change)
    assert words in mismatch(TARGET, theirs)
    target, draft = link(theirs, b"s3cret-s3cret")
    assert target is None
    assert isinstance(draft, HandshakeRefused) and words in str(draft) and "\n" not in str(draft)


def test_addresses_need_a_host_and_a_port() -> None:
    assert parse_address("10.0.0.2:29500") == ("10.0.0.2", 29500)
    assert parse_address("[::1]:80") == ("::1", 80)
    for bad in (":29500", "host", "host:70000", "host:x"):
        with pytest.raises(UserError, match="HOST:PORT"):
            parse_address(bad)


def test_a_secret_is_required(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)
    with pytest.raises(UserError, match="shared secret"):
        read_secret()
    monkeypatch.setenv(SECRET_ENV, "from-the-env")
    assert read_secret() == b"from-the-env"
    (tmp_path / "s").write_text("from-a-file\n")
    assert read_secret(str(tmp_path / "s")) == b"from-a-file"
