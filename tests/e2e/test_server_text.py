"""Text out of the server: one chunk per token, UTF-8 split across tokens, stop strings across tokens.

A scripted engine fixes the output tokens so each case knows exactly what must come back.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from server_harness import MODEL, LiveServer, ScriptedEngine
from swiftspec.serve.text_stream import TextStream
from swiftspec.tokenizer import IncrementalDecoder, Tokenizer

TEXT = "Hello, world! 🙂 naïve 日本語 end"


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(tiny_qwen_dir)


@pytest.fixture(scope="module")
def ids(tokenizer: Tokenizer) -> list[int]:
    out = tokenizer.encode(TEXT)
    assert tokenizer.decode(out) == TEXT
    return out


@pytest.fixture(scope="module")
def server(tokenizer: Tokenizer, ids: list[int]):
    rounds = [ids[i : i + 3] for i in range(0, len(ids), 3)]  # several tokens per round
    with LiveServer(ScriptedEngine(tokenizer, rounds)) as srv:
        yield srv


def run_stream(tokens: list[int], tokenizer: Tokenizer, stop: tuple[str, ...]) -> list[str]:
    stream = TextStream(tokenizer, stop)
    pieces = [stream.push(t) for t in tokens] + [stream.finish()]
    return [p for p in pieces if p]


def test_text_stream_without_stop_is_the_decoded_text(tokenizer: Tokenizer, ids: list[int]) -> None:
    assert "".join(run_stream(ids, tokenizer, ())) == TEXT


@pytest.mark.parametrize("stop", ["lo, w", "🙂", "ï", "日本", " end", "d! ", "Hello"])
def test_text_stream_cuts_exactly_before_the_first_stop(tokenizer: Tokenizer, ids: list[int], stop: str) -> None:
    pieces = run_stream(ids, tokenizer, (stop,))
    assert "".join(pieces) == TEXT[: TEXT.index(stop)]


def test_text_stream_picks_the_earliest_of_several_stops(tokenizer: Tokenizer, ids: list[int]) -> None:
    assert "".join(run_stream(ids, tokenizer, ("end", "world", "zzz"))) == "Hello, "


def test_text_stream_releases_held_back_text_at_the_end(tokenizer: Tokenizer, ids: list[int]) -> None:
    pieces = run_stream(ids, tokenizer, ("end!",))  # " end" could start "end!" until the stream ends
    assert "".join(pieces) == TEXT
    assert pieces[-1].endswith("end")


def post(srv: LiveServer, path: str, body: dict) -> httpx.Response:
    return httpx.post(srv.url + path, json={"model": MODEL, **body}, timeout=30)


def stream_chunks(srv: LiveServer, path: str, body: dict) -> list[dict]:
    chunks = []
    with httpx.stream("POST", srv.url + path, json={"model": MODEL, "stream": True, **body}, timeout=30) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    for line in lines[:-1]:
        assert line.startswith("data: ")
        chunks.append(json.loads(line[len("data: ") :]))
    return chunks


def test_streaming_sends_one_chunk_per_token_with_whole_characters(
    server: LiveServer, tokenizer: Tokenizer, ids: list[int]
) -> None:
    chunks = stream_chunks(server, "/v1/completions", {"prompt": "x", "max_tokens": 100})
    texts = [c["choices"][0]["text"] for c in chunks]
    decoder = IncrementalDecoder(tokenizer)
    assert texts[:-1] == [p for p in (decoder.push(t) for t in ids) if p]
    assert "".join(texts) == TEXT
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("stop", ["lo, w", "🙂", ["zzz", "日本"]])
def test_stop_strings_across_tokens(server: LiveServer, stream: bool, stop: str | list[str]) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "stop": stop, "max_tokens": 100}
    first = stop if isinstance(stop, str) else stop[1]
    if stream:
        chunks = stream_chunks(server, "/v1/chat/completions", body)
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
        finish = chunks[-1]["choices"][0]["finish_reason"]
    else:
        choice = post(server, "/v1/chat/completions", body).json()["choices"][0]
        text, finish = choice["message"]["content"], choice["finish_reason"]
    assert text == TEXT[: TEXT.index(first)]
    assert finish == "stop"


def test_length_limit_and_usage(server: LiveServer, ids: list[int]) -> None:
    r = post(server, "/v1/completions", {"prompt": [1, 2, 3, 4], "max_tokens": 3})
    body = r.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7,
                             "prompt_tokens_details": {"cached_tokens": 0}}  # the scripted engine keeps none
    assert body["choices"][0]["text"] == "Hello"


def test_stream_usage_chunk(server: LiveServer, ids: list[int]) -> None:
    body = {"prompt": [1, 2], "max_tokens": 100, "stream_options": {"include_usage": True}}
    chunks = stream_chunks(server, "/v1/completions", body)
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 2, "completion_tokens": len(ids), "total_tokens": 2 + len(ids),
                                  "prompt_tokens_details": {"cached_tokens": 0}}
