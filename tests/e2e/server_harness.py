"""Shared pieces of the server tests: a real uvicorn server on a free loopback port in a thread,
the tiny engine, and a scripted engine whose output the text tests choose token by token."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import torch
import uvicorn

from swiftspec.config import EngineConfig, LoadConfig, ServerConfig, TreeConfig
from swiftspec.engines import build_engine
from swiftspec.engines.base import Engine, Generation, GenerationStats, Rounds
from swiftspec.sampling import SamplingParams
from swiftspec.serve.server import create_app
from swiftspec.tokenizer import Tokenizer

MODEL = "tiny"


@contextlib.contextmanager
def tiny_engine(model_dir: Path, max_seq_len: int = 256) -> Iterator[Engine]:
    """The autoregressive engine over a tiny checkpoint (conftest's tiny_qwen_dir), float32 on CPU.

    It runs on one torch thread: the tiny model gains nothing from more, and on a busy shared
    machine two spinning threads make each token ten times slower.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    load = LoadConfig(device="cpu", dtype="float32", max_seq_len=max_seq_len)
    engine = build_engine(EngineConfig(mode="ar", target=str(model_dir), target_load=load))
    try:
        yield engine
    finally:
        engine.close()
        torch.set_num_threads(threads)


@contextlib.contextmanager
def tiny_async_engine(model_dir: Path, draft_dir: Path, max_seq_len: int = 4096, depth: int = 2,
                      **settings: object) -> Iterator[Engine]:
    """The async engine over the tiny pair (conftest's tiny_qwen_dir, tiny_draft_dir), float32 on CPU;
    settings go to EngineConfig (target_tp, worker_timeout)."""
    load = LoadConfig(device="cpu", dtype="float32", max_seq_len=max_seq_len)
    engine = build_engine(EngineConfig(mode="async", target=str(model_dir), draft=str(draft_dir), target_load=load,
                                       draft_load=load, tree=TreeConfig(depth=depth), **settings))
    try:
        yield engine
    finally:
        engine.close()


class LiveServer:
    """`with LiveServer(engine, **server_settings) as srv:` serves on srv.url until the block ends."""

    def __init__(self, engine: Engine, **settings: object) -> None:
        config = ServerConfig(port=0, served_model_name=MODEL, **settings)
        self.app = create_app(lambda: engine, config, on_start_error=self._start_failed)
        self._server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning",
                                                     timeout_graceful_shutdown=2))
        self._thread = threading.Thread(target=self._server.run, name="test-uvicorn", daemon=True)
        self.url = ""

    def __enter__(self) -> "LiveServer":
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        while self.app.state.service.scheduler.health != "ok":  # the worker thread has taken the engine
            if time.monotonic() > deadline:
                raise RuntimeError("the test server's engine did not start")
            time.sleep(0.01)
        return self

    @staticmethod
    def _start_failed(exc: Exception) -> None:
        raise AssertionError("the engine of a test server cannot fail to start") from exc

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the server runs on (in its own thread)."""
        return self._server.servers[0].get_loop()

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
        assert not self._thread.is_alive(), "the test server did not shut down"


class ScriptedEngine:
    """Yields the same scripted rounds of token ids for any prompt, `round_s` seconds apart."""

    fault: str | None = None
    prompt_store = None  # keeps no earlier texts
    mode = "scripted"

    def __init__(self, tokenizer: Tokenizer, rounds: list[list[int]], round_s: float = 0.0,
                 max_seq_len: int = 256) -> None:
        self.tokenizer = tokenizer
        self.rounds = rounds
        self.round_s = round_s
        self.max_seq_len = max_seq_len

    def generate(self, prompt: list[int], params: SamplingParams, max_new_tokens: int,
                 should_stop: Callable[[], bool] | None = None, reuse: bool = True) -> Generation:
        stats = GenerationStats(prompt_tokens=len(prompt))
        return Generation(self._rounds(stats, max_new_tokens, should_stop), stats)

    def _rounds(self, stats: GenerationStats, max_new_tokens: int, should_stop: Callable[[], bool] | None) -> Rounds:
        left = max_new_tokens
        for ids in self.rounds if left else ():
            time.sleep(self.round_s)
            out = ids[:left]
            left -= len(out)
            stats.new_tokens += len(out)
            stats.accept_lengths.append(len(out))
            yield out
            if left <= 0 or (should_stop is not None and should_stop()):
                return

    def recover(self) -> bool:
        return False

    def close(self) -> None:
        self.rounds = []
