"""Bad requests get a 4xx with an OpenAI error body, never a 5xx, and the server keeps serving;
the API key guards every endpoint but /health."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from server_harness import MODEL, LiveServer, tiny_engine

KEY = "sk-test-key"
GOOD = {"model": MODEL, "prompt": "def add(a, b):", "max_tokens": 4, "temperature": 0}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

BAD_BODIES = {
    "malformed json": (b'{"prompt": "x", ', 400),
    "not an object": (b"[1, 2, 3]", 400),
    "null body": (b"null", 400),
    "empty body": (b"", 400),
    "invalid utf-8": (b'{"model": "tiny", "prompt": "\xff\xfe\xfa"}', 400),
    "lone surrogate": (b'{"model": "tiny", "prompt": "\\ud800"}', 400),
    "nan temperature": (b'{"model": "tiny", "prompt": "x", "temperature": NaN}', 400),
    "deep nesting": (b"[" * 30_000 + b"]" * 30_000, 400),
    "huge integer": (b'{"model": "tiny", "prompt": "x", "max_tokens": 1' + b"0" * 5000 + b"}", 400),
}

BAD_COMPLETIONS = {
    "prompt wrong type": ({"prompt": 5}, 400, "prompt"),
    "max_tokens string": ({"max_tokens": "10"}, 400, "max_tokens"),
    "max_tokens negative": ({"max_tokens": -1}, 400, "max_tokens"),
    "max_tokens zero": ({"max_tokens": 0}, 400, "max_tokens"),
    "max_tokens huge": ({"max_tokens": 10**12}, 400, "max_tokens"),
    "max_tokens beyond int64": ({"max_tokens": 10**30}, 400, "max_tokens"),
    "temperature string": ({"temperature": "hot"}, 400, "temperature"),
    "temperature negative": ({"temperature": -0.5}, 400, "temperature"),
    "top_p zero": ({"top_p": 0}, 400, "top_p"),
    "stream not bool": ({"stream": "yes"}, 400, "stream"),
    "stop wrong type": ({"stop": [1, 2]}, 400, "stop"),
    "too many stops": ({"stop": ["a"] * 17}, 400, "stop"),
    "stop too long": ({"stop": "x" * 257}, 400, "stop"),
    "n is 2": ({"n": 2}, 400, "n"),
    "unknown model": ({"model": "gpt-4"}, 404, "model"),
    "empty prompt": ({"prompt": ""}, 400, "prompt"),
    "prompt over the context": ({"prompt": "hello world " * 400}, 400, "prompt"),
    "token id out of range": ({"prompt": [1, 10**6]}, 400, "prompt"),
    "two prompts": ({"prompt": ["a", "b"]}, 400, "prompt"),
    "logprobs": ({"logprobs": 2}, 400, None),
    "seed negative": ({"seed": -1}, 400, "seed"),
}

BAD_CHATS = {
    "empty messages": ({"messages": []}, 400, "messages"),
    "messages not a list": ({"messages": "hi"}, 400, "messages"),
    "message without role": ({"messages": [{"content": "hi"}]}, 400, "messages"),
    "unknown role": ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages"),
    "content wrong type": ({"messages": [{"role": "user", "content": 7}]}, 400, "messages"),
    "chat prompt over the context": ({"messages": [{"role": "user", "content": "hello world " * 400}]}, 400,
                                     "messages"),
    "tools": ({"tools": [{"type": "function"}]}, 400, None),
}


@pytest.fixture(scope="module")
def engine(tiny_qwen_dir: Path):
    with tiny_engine(tiny_qwen_dir) as eng:
        yield eng


@pytest.fixture(scope="module")
def server(engine):
    with LiveServer(engine, max_tokens=64, max_body_bytes=64 * 1024) as srv:
        yield srv


def assert_openai_error(r: httpx.Response, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    if param is not None:
        assert error["param"] == param, error
    return error


def assert_still_serving(srv: LiveServer) -> None:
    r = httpx.post(srv.url + "/v1/completions", json=GOOD, timeout=30)
    assert r.status_code == 200, r.text
    assert httpx.get(srv.url + "/health").json() == {"status": "ok"}


@pytest.mark.parametrize("name", BAD_BODIES)
def test_bad_bodies(server: LiveServer, name: str) -> None:
    body, status = BAD_BODIES[name]
    for path in ("/v1/completions", "/v1/chat/completions"):
        r = httpx.post(server.url + path, content=body, headers={"content-type": "application/json"}, timeout=30)
        assert_openai_error(r, status)


@pytest.mark.parametrize("name", BAD_COMPLETIONS)
def test_bad_completion_requests(server: LiveServer, name: str) -> None:
    change, status, param = BAD_COMPLETIONS[name]
    r = httpx.post(server.url + "/v1/completions", json={**GOOD, **change}, timeout=30)
    assert_openai_error(r, status, param)


@pytest.mark.parametrize("name", BAD_CHATS)
def test_bad_chat_requests(server: LiveServer, name: str) -> None:
    change, status, param = BAD_CHATS[name]
    r = httpx.post(server.url + "/v1/chat/completions", json={**CHAT, **change}, timeout=30)
    assert_openai_error(r, status, param)


def test_body_too_large(server: LiveServer) -> None:
    r = httpx.post(server.url + "/v1/completions", json={**GOOD, "prompt": "x" * 100_000}, timeout=30)
    assert_openai_error(r, 413)

    def chunked():  # no Content-Length: the limit must hold while reading
        yield b'{"prompt": "'
        for _ in range(100):
            yield b"x" * 1024
        yield b'"}'

    r = httpx.post(server.url + "/v1/completions", content=chunked(), timeout=30)
    assert_openai_error(r, 413)


def test_unknown_route_and_method(server: LiveServer) -> None:
    assert_openai_error(httpx.get(server.url + "/v1/nothing"), 404)
    assert_openai_error(httpx.get(server.url + "/v1/completions"), 405)


def test_server_keeps_serving_after_bad_input(server: LiveServer) -> None:
    assert_still_serving(server)
    metrics = httpx.get(server.url + "/metrics").text
    assert 'swiftspec_requests_total{endpoint="/v1/completions",status="400"}' in metrics
    assert 'status="5' not in metrics


def test_openai_client_raises_typed_errors(server: LiveServer) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="x", max_tokens=10**6)
    assert info.value.body["param"] == "max_tokens"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])


@pytest.fixture(scope="module")
def keyed_server(engine):  # shares the engine: the tests run one at a time, so one server decodes at once
    with LiveServer(engine, api_key=KEY) as srv:
        yield srv


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY},
                                     {"Authorization": f"Basic {KEY}"}])
def test_missing_or_wrong_key_is_401(keyed_server: LiveServer, headers: dict) -> None:
    for method, path in [("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                         ("GET", "/v1/models"), ("GET", "/metrics")]:
        r = httpx.request(method, keyed_server.url + path, json=GOOD, headers=headers, timeout=30)
        assert assert_openai_error(r, 401)["code"] == "invalid_api_key"


def test_health_needs_no_key_and_the_right_key_works(keyed_server: LiveServer) -> None:
    assert httpx.get(keyed_server.url + "/health").status_code == 200
    auth = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(keyed_server.url + "/v1/models", headers=auth).json()["data"][0]["id"] == MODEL
    client = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key=KEY, max_retries=0)
    assert client.completions.create(model=MODEL, prompt="x", max_tokens=2).usage.completion_tokens <= 2
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed_server.url + "/v1", api_key="bad", max_retries=0).models.list()
