"""`serve --mode async` outlives its workers: a killed or stopped worker fails the running request
(503, or an in-band error event), the server restarts the workers, and the waiting requests are
served; /health and /metrics say so. Runs the official `openai` client against a live server."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pytest

from injection import Injection
from server_harness import MODEL, LiveServer, tiny_async_engine
from spec_stats import sharp_pair
from swiftspec.engines.base import Generation

PROMPT = "def fibonacci(n):"
LONG = 3000  # tokens: many seconds of decoding, so that the fault lands mid-stream
SHORT = 16
HANG_LIMIT_S = 3.0  # --worker-timeout of the SIGSTOP test


def client_for(srv: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def complete(client: openai.OpenAI, max_tokens: int = SHORT) -> str:
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=max_tokens, temperature=0)
    return r.choices[0].text


def started_stream(client: openai.OpenAI, chunks: int) -> iter:
    """A long greedy stream, read until `chunks` text chunks have arrived."""
    stream = iter(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=LONG, temperature=0,
                                            stream=True))
    for _ in range(chunks):
        next(stream)
    return stream


def worker_pid(engine, role: str) -> int:
    """The draft leader, or the first target tensor-parallel follower (rank 1)."""
    return engine.workers.pool.pids[engine.layout.draft_leader if role == "draft" else 1]


@dataclass
class StreamResult:
    text: str = ""
    first_token_at: float | None = None  # time.monotonic()
    error: Exception | None = None


def stream_in_thread(client: openai.OpenAI, result: StreamResult) -> threading.Thread:
    def run() -> None:
        try:
            for chunk in client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=SHORT, temperature=0,
                                                   stream=True):
                if result.first_token_at is None:
                    result.first_token_at = time.monotonic()
                result.text += chunk.choices[0].text
        except openai.APIError as exc:
            result.error = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@dataclass
class HealthLog:
    """Polls /health every 20 ms in a thread and keeps each change of status."""

    url: str
    seen: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> "HealthLog":
        def run() -> None:
            while not self.stop.wait(0.02):
                self.poll()

        self.poll()
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        return self

    def poll(self) -> None:
        r = httpx.get(self.url + "/health", timeout=10)
        status = r.json()["status"]
        assert r.status_code == (200 if status == "ok" else 503)
        if not self.seen or self.seen[-1] != status:
            self.seen.append(status)

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


def wait_until(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def watch_generations(engine) -> list[Generation]:
    """From now on, every Generation the engine's generate() returns, newest last: their stats
    say how far each request has come."""
    returned: list[Generation] = []
    generate = engine.generate

    def watched(*args, **kwargs) -> Generation:
        returned.append(generate(*args, **kwargs))
        return returned[-1]

    engine.generate = watched
    return returned


def metric(srv: LiveServer, line_start: str) -> float:
    for line in httpx.get(srv.url + "/metrics").text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.split()[-1])
    return 0.0


@pytest.mark.parametrize("role,target_tp", [("draft", 1), ("target", 2)], ids=["draft", "target-tp-follower"])
def test_killed_worker_fails_only_the_running_stream(tiny_qwen_dir: Path, tiny_draft_dir: Path, role: str,
                                                     target_tp: int) -> None:
    with tiny_async_engine(tiny_qwen_dir, tiny_draft_dir, target_tp=target_tp) as engine, \
            LiveServer(engine, max_tokens=LONG) as srv:
        client = client_for(srv)
        expected = complete(client)
        running = started_stream(client, chunks=5)
        queued = [StreamResult() for _ in range(2)]
        threads = [stream_in_thread(client, r) for r in queued]
        wait_until(lambda: srv.app.state.service.scheduler.waiting == 2)
        with HealthLog(srv.url) as health:
            killed_at = time.monotonic()
            os.kill(worker_pid(engine, role), signal.SIGKILL)
            with pytest.raises(openai.APIError) as info:
                for _ in running:
                    pass
            for t in threads:
                t.join(timeout=120)
            wait_until(lambda: health.seen[-1:] == ["ok"])
        assert "died" in info.value.message and f"({role} group)" in info.value.message
        assert [(r.error, r.text) for r in queued] == [(None, expected)] * 2  # served by the new workers
        recovery_s = min(r.first_token_at for r in queued) - killed_at
        print(f"\nrecovery ({role} killed, target_tp={target_tp}): {recovery_s:.2f} s from the kill to the next token")
        assert health.seen == ["ok", "degraded", "ok"]
        assert [complete(client) for _ in range(3)] == [expected] * 3
        assert metric(srv, "swiftspec_worker_restarts_total") == 1
        assert metric(srv, 'swiftspec_failed_requests_total{cause="fault"}') == 1
        assert 'endpoint="/v1/completions",status="5' not in httpx.get(srv.url + "/metrics").text  # 200 + error event


def kill_new_workers(engine, known: set[int], count: int) -> threading.Thread:
    """A thread that kills the first `count` workers spawned after `known`, as soon as they appear."""

    def run() -> None:
        killed = 0
        deadline = time.monotonic() + 120
        while killed < count and time.monotonic() < deadline:
            for pid in set(engine.workers.pool.pids.values()) - known:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                known.add(pid)
                killed += 1
            time.sleep(0.005)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_failed_restart_fails_each_waiting_request(tiny_qwen_dir: Path, tiny_draft_dir: Path) -> None:
    with tiny_async_engine(tiny_qwen_dir, tiny_draft_dir) as engine, LiveServer(engine, max_tokens=LONG) as srv:
        client = client_for(srv)
        expected = complete(client)
        running = started_stream(client, chunks=5)
        queued = [StreamResult() for _ in range(2)]
        threads = [stream_in_thread(client, r) for r in queued]
        wait_until(lambda: srv.app.state.service.scheduler.waiting == 2)
        killer = kill_new_workers(engine, set(engine.workers.pool.pids.values()), count=1)  # the restart's worker
        os.kill(worker_pid(engine, "draft"), signal.SIGKILL)
        with pytest.raises(openai.APIError):
            for _ in running:
                pass
        killer.join(timeout=120)
        for t in threads:
            t.join(timeout=120)
        assert all(r.error is not None and "did not start" in r.error.message for r in queued), queued
        assert httpx.get(srv.url + "/health").json() == {"status": "degraded"}
        assert complete(client) == expected  # the next request tries the restart again
        assert httpx.get(srv.url + "/health").json() == {"status": "ok"}
        assert metric(srv, 'swiftspec_failed_requests_total{cause="fault"}') == 3


def test_killed_worker_fails_a_whole_response_with_503(tiny_qwen_dir: Path, tiny_draft_dir: Path) -> None:
    with tiny_async_engine(tiny_qwen_dir, tiny_draft_dir) as engine, LiveServer(engine, max_tokens=LONG) as srv:
        client = client_for(srv)
        answer: dict = {}
        generations = watch_generations(engine)
        thread = threading.Thread(target=lambda: answer.update(r=httpx.post(
            srv.url + "/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": LONG,
                                               "temperature": 0}, timeout=120)), daemon=True)
        thread.start()
        wait_until(lambda: generations and generations[-1].stats.new_tokens > 20)  # decoding
        os.kill(worker_pid(engine, "draft"), signal.SIGKILL)
        thread.join(timeout=120)
        r = answer["r"]
        assert r.status_code == 503, r.text
        error = r.json()["error"]
        assert error["type"] == "server_error" and error["code"] == "engine_fault" and "died" in error["message"]
        assert complete(client)


def test_stopped_worker_fails_the_request_within_the_timeout(tiny_qwen_dir: Path, tiny_draft_dir: Path) -> None:
    with tiny_async_engine(tiny_qwen_dir, tiny_draft_dir, worker_timeout=HANG_LIMIT_S) as engine, \
            LiveServer(engine, max_tokens=LONG) as srv:
        client = client_for(srv)
        expected = complete(client)
        running = started_stream(client, chunks=10)  # past the first round (which also covers prefill)
        pid = worker_pid(engine, "draft")
        stopped_at = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        try:
            with pytest.raises(openai.APIError) as info:
                for _ in running:
                    pass
            failed_after = time.monotonic() - stopped_at
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        assert failed_after < HANG_LIMIT_S + 2.0, failed_after
        assert "no progress" in info.value.message and "rank 1 (draft group) is stopped" in info.value.message
        assert complete(client) == expected  # fresh workers
        assert httpx.get(srv.url + "/health").json() == {"status": "ok"}
        assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_same_seed_same_text_whatever_the_draft_timing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The draft sleeps a random 0..30 ms before each round (injected into the spawned workers by
    tests/support/inject), so the verified tokens reach it after a varying number of expansions: a
    seeded sampled request must still give the same text. The sharp pair's draft is confident, so
    its trees grow deep and their shape follows the timing."""
    jitter = Injection(log=tmp_path / "inject.log", draft_jitter_s=0.03)
    for name, value in jitter.env().items():
        monkeypatch.setenv(name, value)
    target, draft = sharp_pair(tmp_path)
    with tiny_async_engine(target, draft, depth=4) as engine, LiveServer(engine) as srv:
        client = client_for(srv)

        def sample(seed: int | None) -> str:
            return client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=48, temperature=1.0,
                                             seed=seed).choices[0].text

        texts = [sample(1234) for _ in range(10)]
        assert len(set(texts)) == 1, set(texts)
        assert {sample(s) for s in (1, 2, 3)} != {texts[0]}
        unseeded = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=48, temperature=1.0)
        assert unseeded.choices[0].finish_reason in ("stop", "length")  # the timing-driven schedule still serves
        # (its text may be empty: an unseeded draw may pick EOS first)
        greedy = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=48, temperature=0)
        spec = greedy.model_extra["timings"]["speculation"]  # how the engine decoded it, in llama-server's timings
        assert spec["mode"] == "async" and spec["plain_rounds"] == 0 and spec["acceptance_length"] > 1, spec
        sleeps = jitter.sleeps("jitter")
        assert {pid for pid, _ in sleeps} == {worker_pid(engine, "draft")}  # the draft worker, only
    assert len(sleeps) >= 24, len(sleeps)  # a round or more per request
    assert min(s for _, s in sleeps) < 0.01 < max(s for _, s in sleeps)  # the timing varied
