"""Careless and hostile clients: a prefill too long for the machine is refused at once, a body that
never arrives gets 408, a request cancelled while queued ends, /health says busy while one job holds
the engine far past its time, a drain ends running streams with an error event and [DONE], and a
bounded soak leaves the task count, the queue and the memory where they were."""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import time
from pathlib import Path

import httpx
import psutil
import pytest

from server_harness import MODEL, LiveServer, ScriptedEngine, tiny_engine
from swiftspec.tokenizer import Tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")
KINDS = ("ok", "stream", "bad_json", "bad_type", "oversized", "abandon")  # the soak's requests, in turn


@pytest.fixture(scope="module")
def tok(tiny_qwen_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(tiny_qwen_dir)


def test_a_prefill_over_the_limit_is_refused_at_once(tiny_qwen_dir: Path) -> None:
    with tiny_engine(tiny_qwen_dir) as engine, LiveServer(engine, max_prefill_s=1e-6) as srv:
        pace = srv.app.state.service.scheduler.pace
        assert pace.prefill_token_s > 0  # the start-up probe measured the prefill rate
        started = time.perf_counter()
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": list(range(3, 200)), "max_tokens": 2})
        assert r.status_code == 400 and r.json()["error"]["code"] == "prefill_too_long", r.text
        assert "197 tokens" in r.json()["error"]["message"] and "--max-prefill-s" in r.json()["error"]["message"]
        assert time.perf_counter() - started < 5
        pace.prefill_token_s = 1e-9  # at a faster rate the same prompt fits, and is served
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": list(range(3, 200)), "max_tokens": 2})
        assert r.status_code == 200, r.text


def test_a_body_that_never_arrives_gets_408(tok: Tokenizer) -> None:
    with LiveServer(ScriptedEngine(tok, [[5]]), body_timeout_s=0.5) as srv:
        host, port = srv.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{\"prompt\": ")  # 11 of the 100 bytes promised
            started = time.perf_counter()
            reply = b""
            while b"request_timeout" not in reply and (part := sock.recv(4096)):  # headers, then the body
                reply += part
            reply = reply.decode()
        assert reply.startswith("HTTP/1.1 408") and "request_timeout" in reply, reply
        assert time.perf_counter() - started < 5


def test_busy_health_and_a_drain_that_ends_streams_cleanly(tok: Tokenizer, monkeypatch) -> None:
    monkeypatch.setattr("swiftspec.serve.pace.BUSY_SLACK_S", 0.2)
    slow = ScriptedEngine(tok, [[tok.encode_text("a")[0]]] * 100, round_s=0.05)
    with LiveServer(slow, max_tokens=200) as srv:
        body = {"prompt": "x", "max_tokens": 100, "stream": True}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            time.sleep(0.5)
            health = httpx.get(srv.url + "/health").json()
            assert health["status"] == "busy" and health["phase"] == "decode" and health["job_age_s"] > 0.2, health
            assert httpx.get(srv.url + "/health/ready").status_code == 503
            assert "swiftspec_running_job_age_seconds" in httpx.get(srv.url + "/metrics").text
            srv.app.state.service.scheduler.drain(0.3)  # what SIGTERM starts
            refused = httpx.post(srv.url + "/v1/completions", json={"prompt": "y", "max_tokens": 2})
            assert refused.status_code == 503 and "shutting down" in refused.text
            rest = [line for line in lines if line]
        events = [json.loads(line[6:]) for line in rest if line != "data: [DONE]"]
        assert rest[-1] == "data: [DONE]" and "shutting down" in events[-1]["error"]["message"]
        assert httpx.get(srv.url + "/health").json() == {"status": "stopping"}


def test_a_request_cancelled_while_queued_ends(tok: Tokenizer) -> None:
    """Scheduler.cancel of a waiting job delivers its end: its awaiting coroutine returns."""
    with LiveServer(ScriptedEngine(tok, [[5]] * 40, round_s=0.05)) as srv:
        scheduler = srv.app.state.service.scheduler

        async def scenario() -> list[list[int]]:
            running = scheduler.submit("a", [1], None, 40)
            waiting = scheduler.submit("b", [1], None, 40)
            scheduler.cancel(waiting)
            got = await asyncio.wait_for(_all(waiting), 2)
            scheduler.cancel(running)
            await asyncio.wait_for(_all(running), 5)
            return got

        assert asyncio.run(scenario()) == [] and scheduler.waiting == 0


async def _all(job) -> list[list[int]]:
    return [ids async for ids in job.rounds()]


def test_soak_of_mixed_clients_leaves_nothing_behind(tiny_qwen_dir: Path) -> None:
    """120 requests from 8 clients, bounded in count and time, on 127.0.0.1: valid, invalid,
    oversized, streamed and abandoned ones.  After them the server's tasks, queue and memory are
    back where they started, and every valid request was answered."""
    with tiny_engine(tiny_qwen_dir) as engine, LiveServer(engine, max_queue=16, max_body_bytes=4096) as srv:
        loop_tasks = _server_tasks(srv)
        rss = psutil.Process().memory_info().rss
        counts = asyncio.run(_soak(srv.url, clients=8, each=15))
        deadline = time.monotonic() + 10
        while (_server_tasks(srv) > loop_tasks or srv.app.state.service.scheduler.waiting) and time.monotonic() < deadline:
            time.sleep(0.05)
        gc.collect()
        grown = (psutil.Process().memory_info().rss - rss) / 2**20
        assert _server_tasks(srv) <= loop_tasks and srv.app.state.service.scheduler.waiting == 0
        outcome = {"ok": "ok", "stream": "ok", "abandon": "abandoned"}
        sent = [outcome.get(KINDS[(i + k) % len(KINDS)], "4xx") for i in range(8) for k in range(15)]
        assert counts == {"error": 0, **{c: sent.count(c) for c in ("ok", "4xx", "abandoned")}}, counts
        assert grown < 200, grown
        print(f"soak: {sum(counts.values())} requests {counts}, tasks {loop_tasks} -> {_server_tasks(srv)}, "
              f"RSS +{grown:.1f} MiB")


def _server_tasks(srv: LiveServer) -> int:
    """Tasks alive on the server's event loop, counted on that loop."""
    async def count() -> int:
        return len(asyncio.all_tasks()) - 1  # this one aside

    return asyncio.run_coroutine_threadsafe(count(), srv.loop).result(10)


async def _soak(url: str, clients: int, each: int) -> dict[str, int]:
    counts = {"ok": 0, "4xx": 0, "abandoned": 0, "error": 0}

    async def client(index: int) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            for k in range(each):
                kind = KINDS[(index + k) % len(KINDS)]
                try:
                    counts[await _one(http, kind, index * each + k)] += 1
                except Exception:  # noqa: BLE001 - counted: the assertion reports it
                    counts["error"] += 1

    await asyncio.wait_for(asyncio.gather(*(client(i) for i in range(clients))), 240)
    return counts


async def _one(http: httpx.AsyncClient, kind: str, n: int) -> str:
    body = {"model": MODEL, "prompt": [3 + n % 400, 7, 9], "max_tokens": 4, "temperature": 0}
    if kind == "ok":
        r = await http.post("/v1/completions", json=body)
        return "ok" if r.status_code == 200 else "error"
    if kind == "stream":
        async with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            lines = [line async for line in r.aiter_lines() if line]
        return "ok" if lines[-1] == "data: [DONE]" else "error"
    if kind == "abandon":  # hang up after the first event, or while queued
        try:
            async with http.stream("POST", "/v1/completions", json={**body, "max_tokens": 64, "stream": True},
                                   timeout=0.05) as r:
                async for _ in r.aiter_lines():
                    break
        except httpx.TimeoutException:
            pass
        return "abandoned"
    content = {"bad_json": b"{not json", "bad_type": json.dumps({**body, "max_tokens": "4"}).encode(),
               "oversized": json.dumps({**body, "prompt": "x" * 5000}).encode()}[kind]
    r = await http.post("/v1/completions", content=content, headers={"Content-Type": "application/json"})
    return "4xx" if 400 <= r.status_code < 500 else "error"
