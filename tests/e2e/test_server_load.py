"""Many clients at once: answers stay right, the engine takes requests in arrival order, a full queue
answers 429, and a client that hangs up mid-stream frees the engine for the next request."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from pathlib import Path

import httpx
import pytest

from server_harness import MODEL, LiveServer, tiny_engine

PROMPTS = ["def add(a, b):", "class Stack:", "for number in range(10):", "Hello, world!"]
CLIENTS, REQUESTS_EACH = 16, 4
LONG = 1500  # tokens: several seconds of decoding on the tiny model


@pytest.fixture(scope="module")
def engine(tiny_qwen_dir: Path):
    with tiny_engine(tiny_qwen_dir, max_seq_len=2048) as eng:
        yield eng


def body(prompt: str, max_tokens: int, **extra: object) -> dict:
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}


def scheduler_events(records: list[logging.LogRecord], kind: str) -> list[str]:
    pattern = re.compile(rf"^{kind} (\S+)")
    return [m.group(1) for r in records if (m := pattern.match(r.getMessage()))]


def test_concurrent_clients_complete_correctly_in_fifo_order(engine, caplog: pytest.LogCaptureFixture) -> None:
    with LiveServer(engine, max_queue=CLIENTS) as srv:
        expected = {p: httpx.post(srv.url + "/v1/completions", json=body(p, 8), timeout=60).json() for p in PROMPTS}
        caplog.set_level(logging.DEBUG, logger="swiftspec.serve.scheduler")

        async def one_client(client: httpx.AsyncClient, index: int) -> list[tuple[str, dict]]:
            answers = []
            for k in range(REQUESTS_EACH):
                prompt = PROMPTS[(index + k) % len(PROMPTS)]
                r = await client.post("/v1/completions", json=body(prompt, 8))
                assert r.status_code == 200, r.text
                answers.append((prompt, r.json()))
            return answers

        async def all_clients() -> list[list[tuple[str, dict]]]:
            limits = httpx.Limits(max_connections=CLIENTS)
            async with httpx.AsyncClient(base_url=srv.url, timeout=120, limits=limits) as client:
                return await asyncio.gather(*(one_client(client, i) for i in range(CLIENTS)))

        results = asyncio.run(all_clients())
    answers = [a for per_client in results for a in per_client]
    assert len(answers) == CLIENTS * REQUESTS_EACH
    for prompt, answer in answers:
        assert answer["choices"][0]["text"] == expected[prompt]["choices"][0]["text"]
        cached = answer["usage"].pop("prompt_tokens_details")["cached_tokens"]  # what the prompt cache held
        assert 0 <= cached < answer["usage"]["prompt_tokens"]
        assert answer["usage"] == {k: v for k, v in expected[prompt]["usage"].items() if k != "prompt_tokens_details"}
    queued, started = scheduler_events(caplog.records, "queued"), scheduler_events(caplog.records, "started")
    assert len(queued) == CLIENTS * REQUESTS_EACH
    assert started == queued
    assert {a["id"] for _, a in answers} == set(queued)


def stream_in_background(url: str, request: dict, opened: threading.Event, release: threading.Event) -> threading.Thread:
    """Open a stream, note the first chunk, then hold the connection until `release` is set."""

    def run() -> None:
        with httpx.stream("POST", url + "/v1/completions", json=request, timeout=60) as r:
            lines = r.iter_lines()  # held: dropping the iterator would close the connection
            if any(line.startswith("data: ") for line in lines):
                opened.set()
            release.wait(timeout=60)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def wait_until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_full_queue_gets_429_with_retry_after(engine) -> None:
    with LiveServer(engine, max_queue=2, max_tokens=LONG) as srv:
        scheduler = srv.app.state.service.scheduler
        release = threading.Event()
        opened = threading.Event()
        threads = [stream_in_background(srv.url, body(PROMPTS[0], LONG, stream=True), opened, release)]
        assert opened.wait(timeout=30)
        for _ in range(2):  # these wait behind the running one
            threads.append(stream_in_background(srv.url, body(PROMPTS[1], 4, stream=True), threading.Event(), release))
        wait_until(lambda: scheduler.waiting == 2)
        r = httpx.post(srv.url + "/v1/completions", json=body(PROMPTS[2], 4), timeout=30)
        assert r.status_code == 429
        assert r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "queue_full"
        assert "swiftspec_queue_depth 2.0" in httpx.get(srv.url + "/metrics").text
        release.set()
        for t in threads:
            t.join(timeout=60)
        assert httpx.post(srv.url + "/v1/completions", json=body(PROMPTS[2], 4), timeout=30).status_code == 200


def completion_tokens_total(srv: LiveServer) -> float:
    text = httpx.get(srv.url + "/metrics").text
    return float(re.search(r'^swiftspec_tokens_total\{kind="completion"\} (\S+)$', text, re.M).group(1))


def hang_up_after_first_tokens(srv: LiveServer, stream: bool) -> None:
    """Start a long request and drop the connection while it decodes."""
    request = body(PROMPTS[0], LONG, stream=stream)
    if not stream:
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
            httpx.post(srv.url + "/v1/completions", json=request, timeout=httpx.Timeout(60, read=0.3))
        return
    with httpx.stream("POST", srv.url + "/v1/completions", json=request, timeout=60) as r:
        chunks = 0
        for line in r.iter_lines():
            chunks += line.startswith("data: ")
            if chunks == 3:
                break
    # The context exit closed the connection with the body unread: the client is gone.


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_frees_the_engine(engine, stream: bool) -> None:
    with LiveServer(engine, max_tokens=LONG) as srv:
        hang_up_after_first_tokens(srv, stream)
        start = time.perf_counter()
        with httpx.stream("POST", srv.url + "/v1/completions", json=body(PROMPTS[1], 4, stream=True),
                          timeout=60) as r:
            first = next(line for line in r.iter_lines() if line.startswith("data: "))
            waited = time.perf_counter() - start
            assert "text_completion" in first
        assert waited < 1.0, f"the next request waited {waited:.2f} s for its first token"
        assert completion_tokens_total(srv) < LONG  # the abandoned request did not run to its end
