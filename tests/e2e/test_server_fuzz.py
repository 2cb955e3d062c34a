"""Property-based fuzzing of the live server: random JSON and near-valid requests never get a 5xx."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server_harness import MODEL, LiveServer, tiny_engine

ENDPOINTS = ("/v1/completions", "/v1/chat/completions")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
message = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]),
                                  "content": st.text(max_size=40)})
# Valid values of every field: a request built from these alone should succeed.
VALID = {
    "max_tokens": st.integers(1, 4),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1),
    "top_k": st.integers(0, 50),
    "seed": st.integers(0, 2**63 - 1),
    "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=4),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
}
valid_completion = st.fixed_dictionaries(
    {"model": st.just(MODEL), "prompt": st.text(min_size=1, max_size=40) | st.lists(st.integers(0, 500), min_size=1)},
    optional=VALID,
)
valid_chat = st.fixed_dictionaries({"model": st.just(MODEL), "messages": st.lists(message, min_size=1, max_size=3)},
                                   optional=VALID)
FIELDS = (*VALID, "model", "prompt", "messages", "n", "logprobs")


@st.composite
def near_valid(draw: st.DrawFn) -> tuple[str, bytes]:
    """A valid request with up to two fields replaced by any JSON value or removed."""
    endpoint = draw(st.sampled_from(ENDPOINTS))
    body = dict(draw(valid_completion if endpoint == ENDPOINTS[0] else valid_chat))
    for _ in range(draw(st.integers(0, 2))):
        key = draw(st.sampled_from(FIELDS))
        if draw(st.booleans()):
            body[key] = draw(json_values)
        else:
            body.pop(key, None)
    return endpoint, json.dumps(body).encode()


anything = st.tuples(st.sampled_from(ENDPOINTS), json_values.map(lambda v: json.dumps(v).encode()) | st.binary())
requests = near_valid() | anything


@pytest.fixture(scope="module")
def server(tiny_qwen_dir: Path):
    with tiny_engine(tiny_qwen_dir) as engine, LiveServer(engine, max_tokens=4) as srv:  # at most 4 tokens each
        yield srv


def check_response(r: httpx.Response) -> None:
    assert r.status_code < 500, r.text
    if r.status_code != 200:
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    elif r.headers["content-type"].startswith("text/event-stream"):
        lines = [line for line in r.text.splitlines() if line]
        assert lines[-1] == "data: [DONE]"
        assert all('"server_error"' not in line for line in lines)
    else:
        assert r.json()["usage"]["completion_tokens"] <= 4


def test_fuzzed_bodies_never_get_a_5xx(server: LiveServer) -> None:
    statuses: list[int] = []
    with httpx.Client(base_url=server.url, timeout=30) as client:

        @settings(max_examples=500, deadline=None, database=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(request=requests)
        def one(request: tuple[str, bytes]) -> None:
            endpoint, body = request
            r = client.post(endpoint, content=body, headers={"content-type": "application/json"})
            check_response(r)
            statuses.append(r.status_code)

        one()
        assert len(statuses) >= 500
        assert statuses.count(200) >= 100 and len(statuses) - statuses.count(200) >= 100  # both sides explored
        assert client.get("/health").json() == {"status": "ok"}
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2})
        assert r.status_code == 200
    assert 'status="5' not in httpx.get(server.url + "/metrics").text
