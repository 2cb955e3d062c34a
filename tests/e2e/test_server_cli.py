"""`swiftspec serve` end to end: flags, the engine it builds, the key, and a clean exit on Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from swiftspec.config import ConfigError
from swiftspec.serve.cli import build_parser
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
    cmd = [sys.executable, "-m", "swiftspec.serve.cli", "serve", "--model", str(tiny_qwen_dir), "--mode", "ar",
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
        assert httpx.get(url + "/health").status_code == 200
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
