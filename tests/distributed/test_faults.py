"""A worker killed mid-generation ends the command with a clear error, fast, with no orphans."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil


def test_killed_draft_worker_ends_generate_with_error(tiny_qwen_dir, tiny_draft_dir) -> None:
    cmd = [sys.executable, "-m", "swiftspec.serve.cli", "generate", "hello", "--mode", "async",
           "--model", str(tiny_qwen_dir), "--draft-model", str(tiny_draft_dir), "--device", "cpu",
           "--dtype", "float32", "--max-seq-len", "4096", "--max-tokens", "4000", "--depth", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=os.environ | {"PYTHONUNBUFFERED": "1"})
    front = psutil.Process(proc.pid)
    first = proc.stdout.read(1)  # generation has started once text streams
    assert first, proc.stderr.read()
    workers = [p for p in front.children(recursive=True) if "spawn" in " ".join(p.cmdline())]
    assert workers, "the async engine should have spawned its draft worker"
    killed_at = time.monotonic()
    workers[0].send_signal(signal.SIGKILL)
    try:
        _, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert time.monotonic() - killed_at < 10
    assert proc.returncode != 0
    assert "error:" in err and "died" in err and "Traceback" not in err
    time.sleep(0.5)
    assert not [p for p in workers if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
