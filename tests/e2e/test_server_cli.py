"""`swiftspec serve` end to end: flags, the engine it builds, the key, a clean exit on Ctrl-C, and no
worker left behind when an async server is terminated or killed."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from swiftspec.cli.main import build_parser
from swiftspec.config import ConfigError
from swiftspec.serve.server import server_config_from_args


def test_serve_flags_build_the_server_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWIFTSPEC_API_KEY", "from-env")
    args = build_parser().parse_args(["serve", "--model", "/models/Qwen2.5-0.5B.gguf", "--max-queue", "3"])
    config = server_config_from_args(args)
    assert (config.host, config.port, config.max_queue, config.api_key) == ("127.0.0.1", 8000, 3, "from-env")
    assert config.served_model_name == "Qwen2.5-0.5B"
    with pytest.raises(ConfigError):
        server_config_from_args(build_parser().parse_args(["serve", "--max-queue", "0"]))


def test_swiftspec_serve_subprocess(tiny_qwen_dir: Path) -> None:
    cmd = [sys.executable, "-m", "swiftspec.cli", "serve", "--model", str(tiny_qwen_dir), "--mode", "ar",
           "--device", "cpu", "--dtype", "float32", "--max-seq-len", "256", "--port", "0", "--api-key", "k"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = None
        for line in proc.stderr:  # uvicorn logs the address it bound once it is ready
            if m := re.search(r"Uvicorn running on (http://127\.0\.0\.1:\d+)", line):
                url = m.group(1)
                break
        assert url, "the server did not start"
        assert _health_until_ok(url)[-1] == "ok"
        assert httpx.get(url + "/v1/models").status_code == 401
        auth = {"Authorization": "Bearer k"}
        body = {"model": tiny_qwen_dir.name, "prompt": "def add(a, b):", "max_tokens": 3, "temperature": 0}
        r = httpx.post(url + "/v1/completions", json=body, headers=auth, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] <= 3
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=30)
    assert rc == 0


def test_sigterm_ends_streams_with_done_and_exits_within_the_grace(tiny_qwen_dir: Path) -> None:
    cmd = [sys.executable, "-m", "swiftspec.cli", "serve", "--model", str(tiny_qwen_dir), "--mode", "ar",
           "--device", "cpu", "--dtype", "float32", "--max-seq-len", "256", "--port", "0", "--shutdown-grace-s", "1"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    log: list[str] = []
    try:
        url = None
        for line in proc.stderr:
            if m := re.search(r"Uvicorn running on (http://127\.0\.0\.1:\d+)", line):
                url = m.group(1)
                break
        reader = threading.Thread(target=lambda: log.extend(proc.stderr), daemon=True)
        reader.start()
        assert url and _health_until_ok(url)[-1] == "ok"
        body = {"model": tiny_qwen_dir.name, "prompt": "def add(a, b):", "max_tokens": 200, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            proc.send_signal(signal.SIGTERM)
            started = time.monotonic()
            rest = [line for line in lines if line]
        rc = proc.wait(timeout=30)
        took = time.monotonic() - started
        reader.join(timeout=5)
    finally:
        proc.kill()
    assert rest[-1] == "data: [DONE]"  # finished in the grace, or ended with an error event first
    assert rc == 0 and took < 1 + 3, (rc, took)
    assert not any("Traceback" in line for line in log), "".join(log)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_async_serve_leaves_no_orphan(tiny_qwen_dir: Path, tiny_draft_dir: Path, sig: signal.Signals) -> None:
    cmd = [sys.executable, "-m", "swiftspec.cli", "serve", "--mode", "async", "--model", str(tiny_qwen_dir),
           "--draft-model", str(tiny_draft_dir), "--device", "cpu", "--dtype", "float32", "--max-seq-len", "256",
           "--depth", "2", "--port", "0"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        url = _served_url(proc)
        assert _health_until_ok(url) == ["starting", "ok"]  # it listens while the engine loads
        workers = [p for p in psutil.Process(proc.pid).children(recursive=True)]
        assert len(workers) >= 2, "the draft worker and multiprocessing's resource tracker"
        body = {"model": tiny_qwen_dir.name, "prompt": "def add(a, b):", "max_tokens": 3, "temperature": 0}
        assert httpx.post(url + "/v1/completions", json=body, timeout=60).status_code == 200
        proc.send_signal(sig)
        rc = proc.wait(timeout=60)
    finally:
        proc.kill()
    assert rc == (0 if sig == signal.SIGTERM else -signal.SIGKILL)
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, [p.cmdline() for p in alive]


def _served_url(proc: subprocess.Popen) -> str:
    for line in proc.stderr:  # uvicorn logs the address it bound once it is ready
        if m := re.search(r"Uvicorn running on (http://127\.0\.0\.1:\d+)", line):
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
            return m.group(1)
    raise AssertionError("the server did not start")


def _health_until_ok(url: str, timeout: float = 120.0) -> list[str]:
    """The /health statuses seen, in order, until "ok" (200; any other status answers 503)."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while not seen or seen[-1] != "ok":
        assert time.monotonic() < deadline, seen
        r = httpx.get(url + "/health", timeout=10)
        status = r.json()["status"]
        assert r.status_code == (200 if status == "ok" else 503), r.text
        if not seen or seen[-1] != status:
            seen.append(status)
        time.sleep(0.05)
    return seen
