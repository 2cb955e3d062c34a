"""The official `openai` client against a live server on the tiny model: completions and chat,
streaming and not, seeded and not; plus /v1/models and the metrics the requests leave behind."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from server_harness import MODEL, LiveServer, tiny_engine

PROMPT = "def fibonacci(n):"
MESSAGES = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "Add two numbers."}]


@pytest.fixture(scope="module")
def server(tiny_qwen_dir: Path):
    with tiny_engine(tiny_qwen_dir) as engine, LiveServer(engine) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def complete(client: openai.OpenAI, stream: bool, **kwargs) -> str:
    if not stream:
        r = client.completions.create(model=MODEL, prompt=PROMPT, stream=False, **kwargs)
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
        return r.choices[0].text
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, stream=True, **kwargs))
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    return "".join(c.choices[0].text for c in chunks)


def chat(client: openai.OpenAI, stream: bool, **kwargs) -> str:
    if not stream:
        r = client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=False, **kwargs)
        assert r.choices[0].message.role == "assistant"
        assert r.usage.completion_tokens <= kwargs["max_tokens"]
        return r.choices[0].message.content
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert {c.system_fingerprint for c in chunks} == {"swiftspec-ar"}
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    return "".join(c.choices[0].delta.content or "" for c in chunks)


@pytest.mark.parametrize("call", [complete, chat])
def test_greedy_stream_joined_equals_whole_text(client: openai.OpenAI, call) -> None:
    whole = call(client, stream=False, max_tokens=24, temperature=0)
    assert whole
    assert call(client, stream=True, max_tokens=24, temperature=0) == whole
    assert call(client, stream=False, max_tokens=24, temperature=0) == whole


@pytest.mark.parametrize("call", [complete, chat])
def test_same_seed_gives_same_text(client: openai.OpenAI, call) -> None:
    first = call(client, stream=False, max_tokens=24, temperature=1.0, seed=1234)
    assert call(client, stream=False, max_tokens=24, temperature=1.0, seed=1234) == first
    assert call(client, stream=True, max_tokens=24, temperature=1.0, seed=1234) == first
    others = {call(client, stream=False, max_tokens=24, temperature=1.0, seed=s) for s in (1, 2, 3)}
    assert others != {first}


@pytest.mark.parametrize("call", [complete, chat])
def test_unseeded_sampling_works(client: openai.OpenAI, call) -> None:
    for stream in (False, True):
        assert isinstance(call(client, stream=stream, max_tokens=8, temperature=0.8, top_p=0.9), str)


def test_finish_reason_length_and_usage(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0)
    assert r.model == MODEL and r.object == "text_completion" and r.id.startswith("cmpl-")
    assert r.system_fingerprint == "swiftspec-ar"  # which engine answered (build_engine's mode)
    if r.choices[0].finish_reason == "length":
        assert r.usage.completion_tokens == 5
    else:
        assert r.usage.completion_tokens < 5


def test_responses_say_how_the_engine_decoded(client: openai.OpenAI) -> None:
    """llama-server's `timings` beside OpenAI's fields (the whole body, a stream's finishing chunk),
    with ours: the engine's mode, its target forwards after the prefill, those that verified the
    root alone (auto's fallback), and the tokens per forward."""
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0)
    timings = r.model_extra["timings"]
    assert timings["predicted_n"] == r.usage.completion_tokens and timings["cache_n"] >= 0
    # ar: a forward per token (the stats count the prefill's token's round too)
    assert timings["speculation"] == {"mode": "ar", "rounds": r.usage.completion_tokens, "plain_rounds": 0,
                                      "acceptance_length": 1.0}
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, stream=True))
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishing) == 1 and finishing[0].model_extra["timings"]["speculation"]["mode"] == "ar"


def test_stop_string_from_the_greedy_text(client: openai.OpenAI) -> None:
    whole = complete(client, stream=False, max_tokens=24, temperature=0)
    stop = whole[3:7]  # almost surely spans a token boundary
    cut = whole[: whole.index(stop)]
    for stream in (False, True):
        assert complete(client, stream=stream, max_tokens=24, temperature=0, stop=[stop]) == cut


def test_models_endpoint(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]


def test_metrics_after_requests(client: openai.OpenAI, server: LiveServer) -> None:
    complete(client, stream=False, max_tokens=4, temperature=0)
    text = httpx.get(server.url + "/metrics").text
    for name in ("swiftspec_time_to_first_token_seconds_count", "swiftspec_time_per_output_token_seconds_count",
                 "swiftspec_acceptance_length_count", "swiftspec_draft_seconds_total",
                 "swiftspec_verify_seconds_total", "swiftspec_plain_rounds_total", "swiftspec_queue_depth"):
        assert name in text
    assert 'swiftspec_requests_total{endpoint="/v1/completions",status="200"}' in text
    assert 'swiftspec_tokens_total{kind="completion"}' in text
    assert 'swiftspec_engine{mode="ar"} 1.0' in text
