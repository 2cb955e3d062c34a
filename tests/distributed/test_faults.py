"""Faults of the async engine's workers: the CLI ends with a one-line error and no orphans; in a long-
lived process the engine reports the fault truthfully on the request and recovers by a restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from swiftspec.config import EngineConfig, LoadConfig, TreeConfig
from swiftspec.engines import build_engine
from swiftspec.errors import EngineFault, LinkError
from swiftspec.sampling import SamplingParams

FP32 = LoadConfig(dtype="float32", max_seq_len=256)


def test_killed_draft_worker_ends_generate_with_error(tiny_qwen_dir, tiny_draft_dir) -> None:
    cmd = [sys.executable, "-m", "swiftspec.cli", "generate", "hello", "--mode", "async",
           "--model", str(tiny_qwen_dir), "--draft-model", str(tiny_draft_dir), "--device", "cpu",
           "--dtype", "float32", "--max-seq-len", "4096", "--max-tokens", "4000", "--depth", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=os.environ | {"PYTHONUNBUFFERED": "1"})
    front = psutil.Process(proc.pid)
    first = proc.stdout.read(1)  # generation has started once text streams
    assert first, proc.stderr.read()
    workers = front.children(recursive=True)  # the draft worker and multiprocessing's resource tracker
    draft = [p for p in workers if "spawn_main" in " ".join(p.cmdline())]
    assert draft, "the async engine should have spawned its draft worker"
    killed_at = time.monotonic()
    draft[0].send_signal(signal.SIGKILL)
    try:
        _, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert time.monotonic() - killed_at < 10
    assert proc.returncode == 3
    assert "error: async worker rank 1 (draft group) died" in err and "Traceback" not in err
    _, alive = psutil.wait_procs(workers, timeout=5)
    assert not alive


def flat(engine, prompt: list[int], n: int) -> list[int]:
    return [t for chunk in engine.generate(prompt, SamplingParams(), n) for t in chunk]


@pytest.fixture(scope="module")
def engine(tiny_qwen_dir, tiny_draft_dir):
    eng = build_engine(EngineConfig(mode="async", target=str(tiny_qwen_dir), draft=str(tiny_draft_dir),
                                    target_load=FP32, draft_load=FP32, tree=TreeConfig(depth=2)))
    yield eng
    eng.close()


def failing_after(calls: int, error: Exception):
    """A stand-in that works `calls` times, then raises `error`."""

    def wrap(real):
        left = [calls]

        def call(*args, **kwargs):
            left[0] -= 1
            if left[0] < 0:
                raise error
            return real(*args, **kwargs)

        return call

    return wrap


def test_other_errors_keep_their_type_and_the_engine_recovers(engine, monkeypatch: pytest.MonkeyPatch) -> None:
    want = flat(engine, [7, 8, 9], 24)
    monkeypatch.setattr(engine.verifier, "verify", failing_after(3, ValueError("bad tree"))(engine.verifier.verify))
    with pytest.raises(ValueError, match="^bad tree$"):
        flat(engine, [7, 8, 9], 24)
    monkeypatch.undo()
    assert "ValueError: bad tree" in engine.fault  # the groups are out of step: a restart is due
    with pytest.raises(EngineFault, match="must recover"):
        flat(engine, [7, 8, 9], 24)
    assert engine.recover() and engine.fault is None
    assert flat(engine, [7, 8, 9], 24) == want


def test_only_a_failed_message_is_lost_contact(engine, monkeypatch: pytest.MonkeyPatch) -> None:
    want = flat(engine, [5, 6], 24)
    monkeypatch.setattr(engine.link, "recv", failing_after(2, LinkError("Connection reset by peer"))(engine.link.recv))
    with pytest.raises(EngineFault, match="^lost contact with the async workers: Connection reset by peer$"):
        flat(engine, [5, 6], 24)
    monkeypatch.undo()
    assert engine.recover()
    assert flat(engine, [5, 6], 24) == want
