"""POST /infill, llama.cpp's fill-in-the-middle endpoint for editor plugins: from a validated request
to the FIM prompt and the plan, then the whole body or an SSE stream (`data:` events, the last one
with "stop": true; no [DONE], as llama.cpp).

The prompt must leave room for the text: it gets the context less the tokens asked for, yet at
least half the prompt limit; what does not fit is left out (serve/fim.py: repo_prompt) and the
response says "truncated": true.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from swiftspec.fim import repo_prompt
from swiftspec.serve.generation import JobStream, Outcome, Plan, Service, require_fim_tokens, sse_events
from swiftspec.serve.infill_protocol import InfillRequest, InfillResult, final_body, partial_body
from swiftspec.serve.scheduler import Job


@dataclass(frozen=True, slots=True)
class InfillPlan:
    """A checked /infill request and the plan of its generation (max_tokens 0: nothing to generate)."""

    req: InfillRequest
    plan: Plan
    truncated: bool  # context was left out of the prompt


def plan_infill(service: Service, req: InfillRequest) -> InfillPlan:
    """The FIM prompt in the room the request leaves, checked; the sampling and stops of llama.cpp's fields."""
    engine = service.engine
    tokens = require_fim_tokens(engine.tokenizer, None)
    max_tokens = service.token_limit(req.token_limit, "n_predict")
    limit = service.prompt_limit
    budget = min(limit, max(engine.max_seq_len - max_tokens, limit // 2))
    fim = repo_prompt(engine.tokenizer, tokens, req.fim_input(), budget)
    service.check_prompt(fim.ids, "prompt")
    plan = Plan(head=service.response_header(chat=False), prompt=fim.ids,
                params=req.sampling(), max_tokens=min(max_tokens, engine.max_seq_len - len(fim.ids)),
                stop=req.stop_strings, stream=req.stream, include_usage=False, stop_ids=tokens.stops,
                min_indent=req.n_indent, time_limit_s=req.t_max_predict_ms / 1000, reuse=req.cache_prompt)
    return InfillPlan(req=req, plan=plan, truncated=fim.truncated)


async def respond(service: Service, infill: InfillPlan, request: Request) -> Response:
    """The body, or the stream if asked.  n_predict 0 only prefills the prompt into the prompt
    cache and answers with no text (the plugins send such requests to warm the cache: llama.vim's
    input_extra chunks); with cache_prompt false it answers at once."""
    plan, outcome = infill.plan, Outcome()
    run = plan.max_tokens > 0 or plan.reuse
    if plan.stream:
        job = service.submit(plan) if run else None
        return JobStream(sse_events(_events(service, infill, job, outcome)), service.scheduler, job)
    text = await service.whole_text(plan, request, outcome) if run else ""
    return JSONResponse(_final(service, infill, text, outcome))


async def _events(service: Service, infill: InfillPlan, job: Job | None, outcome: Outcome) -> AsyncIterator[dict]:
    if job is not None:
        async for piece in service.text_pieces(infill.plan, job, outcome):
            yield partial_body(piece, outcome.completion_tokens, len(infill.plan.prompt))
    yield _final(service, infill, "", outcome)


def _final(service: Service, infill: InfillPlan, content: str, outcome: Outcome) -> dict:
    timings = outcome.timings(len(infill.plan.prompt), service.engine.mode)
    result = InfillResult(content=content, stop_type=outcome.stop_type, stopping_word=outcome.stop_word,
                          truncated=infill.truncated, timings=timings)
    return final_body(infill.req, service.config.served_model_name, result)
