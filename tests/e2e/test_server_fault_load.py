"""Under load (16 clients x 4 streaming requests, `serve --mode async` on the tiny pair), one killed
worker loses no request: each gets its full answer or an error, and every request after it completes."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import openai

from server_harness import MODEL, LiveServer, tiny_async_engine

PROMPTS = ["def add(a, b):", "class Stack:", "for number in range(10):", "Hello, world!"]
CLIENTS, REQUESTS_EACH = 16, 4
MAX_TOKENS = 12
KILL_AFTER = 12  # completed requests before the draft worker is killed


@dataclass
class Outcome:
    prompt: str
    sent_at: float  # time.monotonic()
    text: str = ""
    finish_reason: str | None = None
    error: openai.APIError | None = None


async def one_request(client: openai.AsyncOpenAI, prompt: str) -> Outcome:
    out = Outcome(prompt, time.monotonic())
    try:
        stream = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS,
                                                 temperature=0, stream=True)
        async for chunk in stream:
            out.text += chunk.choices[0].text
            out.finish_reason = chunk.choices[0].finish_reason or out.finish_reason
    except openai.APIError as exc:
        out.error = exc
    return out


def test_one_worker_kill_under_load_loses_no_request(tiny_qwen_dir: Path, tiny_draft_dir: Path) -> None:
    with tiny_async_engine(tiny_qwen_dir, tiny_draft_dir) as engine, LiveServer(engine, max_queue=64) as srv:
        draft_pid = engine.workers.pool.pids[engine.layout.draft_leader]

        async def run() -> tuple[dict[str, Outcome], list[Outcome], float]:
            client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=300)
            expected = {p: await one_request(client, p) for p in PROMPTS}
            done: list[Outcome] = []
            killed = asyncio.Event()
            killed_at = 0.0

            async def one_client(index: int) -> None:
                nonlocal killed_at
                for k in range(REQUESTS_EACH):
                    done.append(await one_request(client, PROMPTS[(index + k) % len(PROMPTS)]))
                    if len(done) >= KILL_AFTER and not killed.is_set():
                        killed.set()
                        killed_at = time.monotonic()
                        os.kill(draft_pid, signal.SIGKILL)

            await asyncio.gather(*(one_client(i) for i in range(CLIENTS)))
            return expected, done, killed_at

        expected, outcomes, killed_at = asyncio.run(run())
        assert engine.workers.pool.pids[engine.layout.draft_leader] != draft_pid  # fresh workers took over
    assert len(outcomes) == CLIENTS * REQUESTS_EACH
    failed = [o for o in outcomes if o.error is not None]
    for o in outcomes:
        if o.error is None:
            assert (o.text, o.finish_reason) == (expected[o.prompt].text, expected[o.prompt].finish_reason), o
        else:
            assert "died" in o.error.message and o.sent_at < killed_at, o
    print(f"\nload with one kill: {len(outcomes) - len(failed)} full answers, {len(failed)} errors")
    assert len(failed) <= 1  # only the request that was running when the worker died
    after = [o for o in outcomes if o.sent_at > killed_at]
    assert after and all(o.error is None for o in after)
