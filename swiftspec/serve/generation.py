"""From a validated OpenAI request to a response: prompt checks, the job, and text out (whole or SSE).

Both paths read the same token-by-token text pieces, so a stream joined equals the whole response.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import AsyncIterator

from starlette.requests import Request

from swiftspec.config import ServerConfig
from swiftspec.errors import EngineFault, UserError
from swiftspec.runtime.base import Engine
from swiftspec.sampling import SamplingParams
from swiftspec.serve import openai_protocol as proto
from swiftspec.serve.openai_protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    GenerationRequest,
    ResponseHeader,
)
from swiftspec.serve.scheduler import Job, QueueFull, Scheduler
from swiftspec.serve.text_stream import TextStream

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Plan:
    """A request that passed every check, ready to queue."""

    head: ResponseHeader
    prompt: list[int]
    params: SamplingParams
    max_tokens: int  # already clipped to the room left in the context
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool


@dataclass(slots=True)
class Outcome:
    """Filled in while the text is read."""

    completion_tokens: int = 0
    finish_reason: str = "length"


@dataclass(frozen=True, slots=True)
class Service:
    """What the endpoints share: the limits, the queue and its engine (read-only here)."""

    config: ServerConfig
    scheduler: Scheduler

    @property
    def engine(self) -> Engine:
        """The engine, once the scheduler has built it (until then every request gets a 503)."""
        engine = self.scheduler.engine
        if engine is None:
            raise APIError(503, "the server is starting: its engine is loading; retry shortly", code="starting",
                           type="server_error")
        return engine

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.config.served_model_name:
            raise APIError(404, f"The model {model!r} does not exist; this server serves "
                           f"{self.config.served_model_name!r}", param="model", code="model_not_found")

    def completion_prompt(self, req: CompletionRequest) -> list[int]:
        """Token ids of a completion prompt given as text or as ids."""
        if isinstance(req.prompt, str):
            return self.engine.tokenizer.encode(req.prompt)
        vocab = self.engine.tokenizer.vocab_size
        if any(not 0 <= t < vocab for t in req.prompt):
            raise APIError(400, f"prompt token ids must be in [0, {vocab})", param="prompt", code="invalid_value")
        return list(req.prompt)

    def plan(self, req: GenerationRequest, prompt: list[int]) -> Plan:
        """Check the prompt length and token budget; build the sampling params."""
        chat = isinstance(req, ChatCompletionRequest)
        where = "messages" if chat else "prompt"
        limit = min(self.config.max_prompt_tokens or self.engine.max_seq_len, self.engine.max_seq_len - 1)
        if not prompt:
            raise APIError(400, "the prompt is empty", param=where, code="invalid_value")
        if len(prompt) > limit:
            raise APIError(400, f"the prompt has {len(prompt)} tokens; this server accepts at most {limit}",
                           param=where, code="context_length_exceeded")
        cap, max_tokens = self.config.max_tokens, req.token_limit
        if max_tokens is not None and max_tokens > cap:
            raise APIError(400, f"max_tokens is {max_tokens}; this server allows at most {cap}",
                           param="max_tokens", code="invalid_value")
        params = SamplingParams(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=req.top_k or 0,
            min_p=req.min_p or 0.0,
            seed=req.seed,
        )
        room = self.engine.max_seq_len - len(prompt)
        return Plan(head=ResponseHeader.new(self.config.served_model_name, chat), prompt=prompt, params=params,
                    max_tokens=min(max_tokens or cap, room), stop=req.stop_strings, stream=bool(req.stream),
                    include_usage=req.include_usage)

    def submit(self, plan: Plan) -> Job:
        try:
            return self.scheduler.submit(plan.head.id, plan.prompt, plan.params, plan.max_tokens)
        except QueueFull:
            raise APIError(429, "the server is busy: too many requests are waiting; retry shortly",
                           code="queue_full", type="rate_limit_error") from None

    async def text_pieces(self, plan: Plan, job: Job, outcome: Outcome) -> AsyncIterator[str]:
        """The response text, one piece per token as soon as it is final; stops the job at a stop string."""
        text = TextStream(self.engine.tokenizer, plan.stop)
        async for ids in job.rounds():
            for token in ids:
                outcome.completion_tokens += 1
                piece = text.push(token)
                if piece:
                    yield piece
                if text.stopped:
                    job.stop.set()
                    outcome.finish_reason = "stop"
                    return
        tail = text.finish()
        if tail:
            yield tail
        hit_limit = outcome.completion_tokens >= plan.max_tokens and not text.stopped
        outcome.finish_reason = "length" if hit_limit else "stop"

    async def complete(self, plan: Plan, request: Request) -> dict:
        """The whole response body; the job is cancelled if the client disconnects while waiting."""
        job = self.submit(plan)
        watcher = asyncio.create_task(_cancel_on_disconnect(request, job, self.scheduler))
        outcome = Outcome()
        try:
            text = "".join([piece async for piece in self.text_pieces(plan, job, outcome)])
        finally:
            watcher.cancel()
            self.scheduler.cancel(job)
        used = proto.usage(len(plan.prompt), outcome.completion_tokens)
        return proto.full_response(plan.head, text, outcome.finish_reason, used)

    async def stream(self, plan: Plan, job: Job) -> AsyncIterator[str]:
        """SSE events for a queued job, ending with [DONE]; an error after the headers becomes an event
        (an OpenAI error body), and the stream still ends cleanly.
        The caller cancels the job when the response ends (JobStream), whether or not this was started."""
        outcome = Outcome()
        try:
            if plan.head.chat:
                yield _sse(proto.chunk(plan.head, None))
            async for piece in self.text_pieces(plan, job, outcome):
                yield _sse(proto.chunk(plan.head, piece))
            yield _sse(proto.chunk(plan.head, "", outcome.finish_reason))
            if plan.include_usage:
                yield _sse(proto.usage_chunk(plan.head, proto.usage(len(plan.prompt), outcome.completion_tokens)))
        except UserError as exc:
            yield _sse(APIError(400, str(exc)).body())
        except EngineFault as exc:
            yield _sse(proto.fault_error(exc).body())
        except Exception:  # noqa: BLE001 - the headers are sent; report in-band (the worker logged it)
            yield _sse(APIError(500, "the engine failed on this request", type="server_error").body())
        yield "data: [DONE]\n\n"


async def _cancel_on_disconnect(request: Request, job: Job, scheduler: Scheduler) -> None:
    """Wait for the client to hang up (the body has been read, so the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    log.debug("client of %s disconnected", job.request_id)
    scheduler.cancel(job)


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"
