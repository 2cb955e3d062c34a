"""From a validated OpenAI request to a response: prompt checks, the job, and text out (whole or SSE).

Both paths read the same token-by-token text pieces, so a stream joined equals the whole response.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import AsyncIterator

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from swiftspec.config import ServerConfig
from swiftspec.engines.base import Engine, GenerationStats
from swiftspec.errors import EngineFault, UserError
from swiftspec.fim import FimInput, FimTokens, find_fim_tokens, plain_prompt
from swiftspec.sampling import SamplingParams
from swiftspec.serve import openai_protocol as proto
from swiftspec.serve.openai_protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    GenerationRequest,
    ResponseHeader,
    Timings,
)
from swiftspec.serve.scheduler import Job, QueueFull, Scheduler
from swiftspec.serve.text_stream import INDENT, TOKEN, WORD, TextStream
from swiftspec.tokenizer import Tokenizer

log = logging.getLogger(__name__)
EOS, STOP_WORD, LIMIT = "eos", "word", "limit"  # why a text ended (llama.cpp's stop_type)
_STOP_TYPES = {TOKEN: EOS, WORD: STOP_WORD, INDENT: LIMIT}


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
    stop_ids: frozenset[int] = frozenset()  # tokens that end the text like EOS (FIM's end tokens)
    min_indent: int = 0  # /infill's n_indent: end before a later line indented less
    time_limit_s: float = 0.0  # /infill's t_max_predict_ms: once a line has ended, stop after this long
    reuse: bool = True  # cache_prompt: the prefill may keep the prompt cache's KV


@dataclass(slots=True)
class Outcome:
    """Filled in while the text is read."""

    completion_tokens: int = 0
    stop_type: str = LIMIT  # EOS | STOP_WORD | LIMIT (max tokens, end of context, n_indent, time limit)
    stop_word: str = ""  # the stop string met, if STOP_WORD
    started: float = field(default_factory=time.perf_counter)  # made just before the job is queued
    first_token_at: float | None = None  # time.perf_counter() of the first and the latest round
    last_token_at: float | None = None
    stats: GenerationStats | None = None  # the engine's for this request (once its job ran)

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens whose KV the prompt cache held (0 until the job ran)."""
        return 0 if self.stats is None else self.stats.cached_tokens

    @property
    def finish_reason(self) -> str:
        return "length" if self.stop_type == LIMIT else "stop"

    def timings(self, prompt_tokens: int, mode: str) -> Timings:
        """llama-server's timings of the request, and how the engine (`mode`) decoded it: its target
        forwards after the prefill, those that verified the root alone (auto's fallback), and the
        tokens each forward gave."""
        first = self.first_token_at or time.perf_counter()
        stats = self.stats or GenerationStats()
        speculation = {"mode": mode, "rounds": stats.rounds, "plain_rounds": stats.plain_rounds,
                       "acceptance_length": round(stats.acceptance_length, 3)}
        return Timings(prompt_tokens=prompt_tokens, prompt_s=first - self.started,
                       predicted_tokens=self.completion_tokens, predicted_s=(self.last_token_at or first) - first,
                       cached_tokens=self.cached_tokens, speculation=speculation)

    def timed(self) -> float:
        """Note a round's arrival; the seconds since the first round."""
        self.last_token_at = time.perf_counter()
        self.first_token_at = self.first_token_at or self.last_token_at
        return self.last_token_at - self.first_token_at


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

    def completion_plan(self, req: CompletionRequest) -> Plan:
        """A completion's plan; with a suffix, the prompt is the prefix of a fill-in-the-middle."""
        if req.suffix is None:
            return self.plan(req, self.completion_prompt(req))
        if not isinstance(req.prompt, str):
            raise APIError(400, "a suffix (fill-in-the-middle) needs a text prompt, not token ids",
                           param="suffix", code="invalid_value")
        tokenizer = self.engine.tokenizer
        tokens = require_fim_tokens(tokenizer, "suffix")
        prompt = plain_prompt(tokenizer, tokens, FimInput(prefix=req.prompt, suffix=req.suffix))
        return self.plan(req, prompt, tokens.stops)

    def completion_prompt(self, req: CompletionRequest) -> list[int]:
        """Token ids of a completion prompt given as text or as ids."""
        if isinstance(req.prompt, str):
            return self.engine.tokenizer.encode(req.prompt)
        vocab = self.engine.tokenizer.vocab_size
        if any(not 0 <= t < vocab for t in req.prompt):
            raise APIError(400, f"prompt token ids must be in [0, {vocab})", param="prompt", code="invalid_value")
        return list(req.prompt)

    def response_header(self, chat: bool) -> ResponseHeader:
        """A new response's header; its system_fingerprint names the engine that answers (auto's
        choice where it chose)."""
        return ResponseHeader.new(self.config.served_model_name, chat, f"swiftspec-{self.engine.mode}")

    @property
    def prompt_limit(self) -> int:
        """The most tokens a prompt may have."""
        return min(self.config.max_prompt_tokens or self.engine.max_seq_len, self.engine.max_seq_len - 1)

    def check_prompt(self, prompt: list[int], where: str) -> None:
        """The prompt fits the context, and its prefill (the tokens the prompt cache lacks, at the
        rate measured here) fits --max-prefill-s."""
        if not prompt:
            raise APIError(400, "the prompt is empty", param=where, code="invalid_value")
        if len(prompt) > self.prompt_limit:
            raise APIError(400, f"the prompt has {len(prompt)} tokens; this server accepts at most "
                           f"{self.prompt_limit}", param=where, code="context_length_exceeded")
        limit, pace = self.config.max_prefill_s, self.scheduler.pace
        if limit <= 0 or pace.prefill_token_s <= 0:
            return
        cached = getattr(self.engine, "cached_prefix", lambda _: 0)(prompt)
        seconds = pace.prefill_s(len(prompt) - cached)
        if seconds > limit:
            raise APIError(400, f"the prompt has {len(prompt)} tokens ({cached} cached); at the "
                           f"{1 / pace.prefill_token_s:.0f} tokens/s this server prefills, that takes ~{seconds:.0f} s, "
                           f"over its limit of {limit:g} s (--max-prefill-s)", param=where, code="prefill_too_long")

    def token_limit(self, asked: int | None, param: str) -> int:
        """The new tokens a request asked for (None: the cap), refused above the server's cap."""
        cap = self.config.max_tokens
        if asked is not None and asked > cap:
            raise APIError(400, f"{param} is {asked}; this server allows at most {cap}", param=param,
                           code="invalid_value")
        return cap if asked is None else asked

    def plan(self, req: GenerationRequest, prompt: list[int], stop_ids: frozenset[int] = frozenset()) -> Plan:
        """Check the prompt length and token budget; build the sampling params."""
        chat = isinstance(req, ChatCompletionRequest)
        self.check_prompt(prompt, "messages" if chat else "prompt")
        max_tokens = self.token_limit(req.token_limit, "max_tokens")
        params = SamplingParams(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=req.top_k or 0,
            min_p=req.min_p or 0.0,
            seed=req.seed,
        )
        room = self.engine.max_seq_len - len(prompt)
        return Plan(head=self.response_header(chat), prompt=prompt, params=params,
                    max_tokens=min(max_tokens, room), stop=req.stop_strings, stream=bool(req.stream),
                    include_usage=req.include_usage, stop_ids=stop_ids, reuse=req.cache_prompt is not False)

    def submit(self, plan: Plan) -> Job:
        try:
            return self.scheduler.submit(plan.head.id, plan.prompt, plan.params, plan.max_tokens, plan.reuse)
        except QueueFull:
            raise APIError(429, "the server is busy: too many requests are waiting; retry shortly",
                           code="queue_full", type="rate_limit_error") from None

    async def text_pieces(self, plan: Plan, job: Job, outcome: Outcome) -> AsyncIterator[str]:
        """The response text, one piece per token as soon as it is final; stops the job at a stop
        (string, token, indentation or time limit). A stop token is not counted, as EOS is not."""
        text = TextStream(self.engine.tokenizer, plan.stop, plan.stop_ids, plan.min_indent)
        async for ids in self._rounds(job, outcome):
            decoding_s = outcome.timed()
            for token in ids:
                outcome.completion_tokens += token not in plan.stop_ids
                piece = text.push(token)
                late = plan.time_limit_s > 0 and text.saw_newline and decoding_s > plan.time_limit_s
                piece += text.finish() if late and not text.stopped else ""
                if piece:
                    yield piece
                if text.stopped or late:
                    job.stop.set()
                    outcome.stop_type = _STOP_TYPES[text.stop_reason] if text.stopped else LIMIT
                    outcome.stop_word = text.stop_word
                    return
        tail = text.finish()
        if tail:
            yield tail
        if text.stopped:
            outcome.stop_type, outcome.stop_word = _STOP_TYPES[text.stop_reason], text.stop_word
        else:
            outcome.stop_type = LIMIT if outcome.completion_tokens >= plan.max_tokens else EOS

    @staticmethod
    async def _rounds(job: Job, outcome: Outcome) -> AsyncIterator[list[int]]:
        """The job's rounds; once they end (or the text stops them), the outcome learns what the
        prompt cache held."""
        try:
            async for ids in job.rounds():
                yield ids
        finally:
            outcome.stats = job.stats

    async def whole_text(self, plan: Plan, request: Request, outcome: Outcome) -> str:
        """The whole text; the job is cancelled if the client disconnects while waiting."""
        job = self.submit(plan)
        watcher = asyncio.create_task(_cancel_on_disconnect(request, job, self.scheduler))
        try:
            return "".join([piece async for piece in self.text_pieces(plan, job, outcome)])
        finally:
            watcher.cancel()
            self.scheduler.cancel(job)

    async def complete(self, plan: Plan, request: Request) -> dict:
        """The whole response body."""
        outcome = Outcome()
        text = await self.whole_text(plan, request, outcome)
        used = proto.usage(len(plan.prompt), outcome.completion_tokens, outcome.cached_tokens)
        return proto.full_response(plan.head, text, outcome.finish_reason, used,
                                   outcome.timings(len(plan.prompt), self.engine.mode))

    async def stream(self, plan: Plan, job: Job) -> AsyncIterator[str]:
        """SSE events for a queued job, ending with [DONE] (see sse_events for errors).
        The caller cancels the job when the response ends (JobStream), whether or not this was started."""
        async for event in sse_events(self._chunks(plan, job)):
            yield event
        yield "data: [DONE]\n\n"

    async def _chunks(self, plan: Plan, job: Job) -> AsyncIterator[dict]:
        outcome = Outcome()
        if plan.head.chat:
            yield proto.chunk(plan.head, None)
        async for piece in self.text_pieces(plan, job, outcome):
            yield proto.chunk(plan.head, piece)
        yield proto.chunk(plan.head, "", outcome.finish_reason, outcome.timings(len(plan.prompt), self.engine.mode))
        if plan.include_usage:
            used = proto.usage(len(plan.prompt), outcome.completion_tokens, outcome.cached_tokens)
            yield proto.usage_chunk(plan.head, used)


async def sse_events(payloads: AsyncIterator[dict]) -> AsyncIterator[str]:
    """Each payload as an SSE `data:` event. An error after the headers are sent becomes an event (an
    OpenAI error body), and the stream still ends cleanly."""
    try:
        async for payload in payloads:
            yield _sse(payload)
    except UserError as exc:
        yield _sse(APIError(400, str(exc)).body())
    except EngineFault as exc:
        yield _sse(proto.fault_error(exc).body())
    except Exception:  # noqa: BLE001 - the headers are sent; report in-band (the worker logged it)
        yield _sse(APIError(500, "the engine failed on this request", type="server_error").body())


class JobStream(StreamingResponse):
    """An SSE response that cancels its job (if any) when it ends for any reason (done, error, client gone)."""

    def __init__(self, events: AsyncIterator[str], scheduler: Scheduler, job: Job | None) -> None:
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._scheduler = scheduler
        self._job = job

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self._job is not None:
                self._scheduler.cancel(self._job)


async def _cancel_on_disconnect(request: Request, job: Job, scheduler: Scheduler) -> None:
    """Wait for the client to hang up (the body has been read, so the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    log.debug("client of %s disconnected", job.request_id)
    scheduler.cancel(job)


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def require_fim_tokens(tokenizer: Tokenizer, param: str | None) -> FimTokens:
    """find_fim_tokens, or a 400 naming `param` (the field that asked for FIM)."""
    tokens = find_fim_tokens(tokenizer)
    if tokens is None:
        raise APIError(400, "this model has no fill-in-the-middle tokens", param=param, code="fim_unsupported")
    return tokens
