"""The prompt cache through the server: /infill reports llama-server's tokens_cached and timings
(cache_n, prompt_n), the OpenAI endpoints usage.prompt_tokens_details.cached_tokens; cache_prompt
false keeps nothing, n_predict 0 warms the cache, and a hit never changes the text."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from server_harness import MODEL, LiveServer, tiny_engine

pytestmark = pytest.mark.usefixtures("one_thread")

FILE = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(12))


@pytest.fixture(scope="module")
def server(tiny_fim_dir: Path):
    with pytest.MonkeyPatch.context() as mp:  # chunks of 16: the tiny context (256) still sees partial hits
        mp.setattr("swiftspec.runner.model_runner.PREFILL_CHUNK", 16)
        with tiny_engine(tiny_fim_dir) as engine, LiveServer(engine, max_tokens=64) as srv:
            yield srv


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def infill(srv: LiveServer, **fields) -> dict:
    body = {"input_prefix": FILE[:300], "input_suffix": FILE[300:], "prompt": "", "n_predict": 8,
            "temperature": 0.0, **fields}
    r = httpx.post(srv.url + "/infill", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_infill_reports_what_it_reused_and_the_text_stays(server: LiveServer) -> None:
    cold = infill(server, cache_prompt=False)
    assert cold["tokens_cached"] == 0 and cold["timings"]["cache_n"] == 0
    assert cold["timings"]["prompt_n"] == cold["tokens_evaluated"]
    again = infill(server)  # the identical prompt: its KV and its last logits are kept
    assert again["content"] == cold["content"]
    assert again["tokens_cached"] == again["tokens_evaluated"] == again["timings"]["cache_n"]
    assert again["timings"]["prompt_n"] == 0
    moved = infill(server, input_prefix=FILE[:330], input_suffix=FILE[330:])  # the cursor moved down
    assert 0 < moved["tokens_cached"] < moved["tokens_evaluated"]
    assert moved["content"] == infill(server, input_prefix=FILE[:330], input_suffix=FILE[330:],
                                      cache_prompt=False)["content"]


def test_a_warmup_with_n_predict_0_fills_the_cache(server: LiveServer) -> None:
    chunk = [{"filename": "util.py", "text": "def helper(y):\n    return y * 2\n" * 6}]
    warm = infill(server, input_extra=chunk, n_predict=0)
    assert warm["content"] == "" and warm["tokens_predicted"] == 0
    hit = infill(server, input_extra=chunk)
    assert hit["tokens_cached"] == hit["tokens_evaluated"]


def test_bad_cache_prompt_values_get_a_400(server: LiveServer, client: openai.OpenAI) -> None:
    for value in ("yes", 1, None, [True]):
        r = httpx.post(server.url + "/infill", json={"input_prefix": "a", "input_suffix": "b", "cache_prompt": value})
        assert r.status_code == 400 and "cache_prompt" in r.text, (value, r.text)
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "a", "cache_prompt": value})
        assert (r.status_code == 400 and "cache_prompt" in r.text) or value is None, (value, r.text)


def test_chat_turns_report_a_growing_cached_prefix(client: openai.OpenAI) -> None:
    messages, cached = [], []
    for turn in range(4):
        messages.append({"role": "user", "content": f"question {turn}: what is {turn} + {turn}?"})
        reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0)
        cached.append(reply.usage.prompt_tokens_details.cached_tokens)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    assert cached[0] <= cached[1] <= cached[2] <= cached[3] and cached[0] < cached[3], cached
    streamed = client.completions.create(model=MODEL, prompt=FILE, max_tokens=4, temperature=0, stream=True,
                                         stream_options={"include_usage": True})
    usage = [c.usage for c in streamed if c.usage is not None]
    whole = client.completions.create(model=MODEL, prompt=FILE, max_tokens=4, temperature=0)
    assert whole.usage.prompt_tokens_details.cached_tokens == whole.usage.prompt_tokens
    assert usage[0].prompt_tokens_details.cached_tokens <= whole.usage.prompt_tokens_details.cached_tokens
    off = client.completions.create(model=MODEL, prompt=FILE, max_tokens=4, temperature=0,
                                    extra_body={"cache_prompt": False})
    assert off.usage.prompt_tokens_details.cached_tokens == 0 and off.choices[0].text == whole.choices[0].text


def test_info_reads_a_servers_prompt_cache(server: LiveServer) -> None:
    from swiftspec.cli.cache_info import prompt_cache_line

    infill(server)
    infill(server)
    line = prompt_cache_line(server.url)
    assert line.startswith(f"prompt cache of {server.url}: ") and " texts; " in line and "reused (" in line, line
    assert "MiB of earlier texts' KV by default here" in prompt_cache_line(None)
