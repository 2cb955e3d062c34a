"""The OpenAI-compatible HTTP server: app wiring, auth, body limits, error mapping and `swiftspec serve`.

Endpoints: POST /v1/completions, POST /v1/chat/completions, POST /infill (llama.cpp's, for editor
plugins; all three may stream SSE), GET /v1/models, GET /health (never needs a key; 200 only when
"ok") and GET /metrics (Prometheus). Every error is an OpenAI error body; a failed engine worker
answers 503, and the server restarts the workers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hmac
import ipaddress
import json
import logging
import os
import signal
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator, Callable, TypeVar

import uvicorn
from fastapi import Depends, FastAPI
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from swiftspec.config import EngineConfig, ServerConfig
from swiftspec.engines import build_engine
from swiftspec.engines.base import Engine
from swiftspec.engines.defaults import resolve_defaults
from swiftspec.errors import EngineFault, UserError
from swiftspec.serve import infill
from swiftspec.serve.generation import JobStream, Plan, Service
from swiftspec.serve.infill_protocol import InfillRequest
from swiftspec.serve.metrics import RequestCounter, ServerMetrics
from swiftspec.serve.openai_protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    fault_error,
    validation_error,
)
from swiftspec.serve.scheduler import DEGRADED, OK, Hooks, Scheduler

BUSY = "busy"  # /health: serving, but the running job is far past its expected time
SHUTDOWN_SLACK_S = 2.0  # uvicorn closes connections this long after the drain's grace: the error events go out first

log = logging.getLogger(__name__)

ENDPOINTS = frozenset({"/v1/completions", "/v1/chat/completions", "/infill", "/v1/models", "/health",
                       "/health/ready", "/metrics"})
RequestT = TypeVar("RequestT", bound=BaseModel)


def create_app(load: Callable[[], Engine], config: ServerConfig,
               on_start_error: Callable[[Exception], None]) -> FastAPI:
    """An app serving the engine that `load()` builds on the worker thread, which starts and stops
    with the app's lifespan; until the engine is built, /health says "starting" and requests get 503.
    on_start_error(exc) is called (on that thread) if load() fails."""
    metrics = ServerMetrics()
    hooks = Hooks(on_end=metrics.observe, on_restart=metrics.restarts.inc, on_start_error=on_start_error)
    scheduler = Scheduler(load, config.max_queue, hooks)
    metrics.watch_engine(lambda: None if scheduler.engine is None else scheduler.engine.mode)
    metrics.watch_queue(lambda: scheduler.waiting)
    metrics.watch_store(lambda: getattr(scheduler.engine, "prompt_store", None))
    metrics.watch_running(scheduler.running)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        scheduler.start()
        yield
        scheduler.close()

    app = FastAPI(title="SwiftSpec", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.service = Service(config=config, scheduler=scheduler)
    app.state.metrics = metrics
    app.add_middleware(RequestCounter, metrics=metrics, endpoints=ENDPOINTS)
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(UserError, _user_error)
    app.add_exception_handler(EngineFault, _engine_fault)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)
    app.add_api_route("/health", _health, methods=["GET"])
    app.add_api_route("/health/ready", _ready, methods=["GET"])
    auth = [Depends(_require_key)]
    app.add_api_route("/v1/models", _models, methods=["GET"], dependencies=auth)
    app.add_api_route("/metrics", _metrics, methods=["GET"], dependencies=auth)
    app.add_api_route("/v1/completions", _completions, methods=["POST"], dependencies=auth)
    app.add_api_route("/v1/chat/completions", _chat_completions, methods=["POST"], dependencies=auth)
    app.add_api_route("/infill", _infill, methods=["POST"], dependencies=auth)
    return app


async def _health(request: Request) -> JSONResponse:
    """starting | ok | degraded (a worker failed; restarting) | stopping: 200 only for ok, so a
    supervisor can act.  A target host serving without its draft host (engines/remote.py) is
    degraded but serving: 200.  busy (200): serving, but the running job has held the engine far
    longer than its size should take (a long prefill): its age and phase say so."""
    body, serving = _health_state(request.app.state.service.scheduler)
    return JSONResponse(body, status_code=200 if serving else 503)


async def _ready(request: Request) -> JSONResponse:
    """Readiness: 200 while a new request would start soon (ok, and not busy), else 503."""
    status = _health_state(request.app.state.service.scheduler)[0]["status"]
    return JSONResponse({"ready": status == OK, "status": status}, status_code=200 if status == OK else 503)


def _health_state(scheduler: Scheduler) -> tuple[dict, bool]:
    """/health's body, and whether the server is serving (ok, busy, or degraded but serving)."""
    why = getattr(scheduler.engine, "degraded", None) if scheduler.health == OK else None
    if why:
        return {"status": DEGRADED, "reason": why}, True
    running = scheduler.running() if scheduler.health == OK else None
    if running is not None and running.late:
        return {"status": BUSY, "phase": running.phase, "job_age_s": round(running.age_s, 1),
                "waiting": scheduler.waiting}, True
    return {"status": scheduler.health}, scheduler.health == OK


async def _models(request: Request) -> dict:
    service: Service = request.app.state.service
    card = {"id": service.config.served_model_name, "object": "model", "created": 0, "owned_by": "swiftspec",
            "max_model_len": service.engine.max_seq_len}
    return {"object": "list", "data": [card]}


async def _metrics(request: Request) -> Response:
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


async def _completions(request: Request) -> Response:
    service: Service = request.app.state.service
    req = await _read_request(request, CompletionRequest, service.config.max_body_bytes)
    service.check_model(req.model)
    return await _respond(service, service.completion_plan(req), request)


async def _chat_completions(request: Request) -> Response:
    service: Service = request.app.state.service
    req = await _read_request(request, ChatCompletionRequest, service.config.max_body_bytes)
    service.check_model(req.model)
    prompt = service.engine.tokenizer.chat([m.as_template_input() for m in req.messages])
    return await _respond(service, service.plan(req, prompt), request)


async def _infill(request: Request) -> Response:
    """llama.cpp's fill-in-the-middle endpoint (llama.vim, llama.vscode); it names no model."""
    service: Service = request.app.state.service
    req = await _read_request(request, InfillRequest, service.config.max_body_bytes)
    return await infill.respond(service, infill.plan_infill(service, req), request)


async def _respond(service: Service, plan: Plan, request: Request) -> Response:
    if plan.stream:
        job = service.submit(plan)
        return JobStream(service.stream(plan, job), service.scheduler, job)
    return JSONResponse(await service.complete(plan, request))


async def _read_request(request: Request, model: type[RequestT], max_bytes: int) -> RequestT:
    """Read at most max_bytes of body, then decode UTF-8 and JSON and validate it against `model`."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    body = bytearray()
    try:
        async with asyncio.timeout(request.app.state.service.config.body_timeout_s):
            async for part in request.stream():
                body += part
                if len(body) > max_bytes:
                    raise _too_large(max_bytes)
    except TimeoutError:
        raise APIError(408, "the request body did not arrive in time", code="request_timeout") from None
    try:
        data = json.loads(body.decode("utf-8"))
        json.dumps(data, ensure_ascii=False).encode("utf-8")  # lone surrogates ("\ud800") are not text
    except UnicodeError:
        raise APIError(400, "the request body is not valid UTF-8 text", code="invalid_body") from None
    except (ValueError, RecursionError) as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None


def _too_large(max_bytes: int) -> APIError:
    return APIError(413, f"the request body is larger than {max_bytes} bytes", code="request_too_large")


async def _require_key(request: Request) -> None:
    """Every endpoint but /health needs `Authorization: Bearer <key>` when the server has a key."""
    key = request.app.state.service.config.api_key
    if not key:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        raise APIError(401, "missing or incorrect API key: send 'Authorization: Bearer <key>'",
                       code="invalid_api_key")


async def _api_error(_: Request, exc: APIError) -> JSONResponse:
    headers = {"Retry-After": "1"} if exc.status in (429, 503) else None
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


async def _user_error(request: Request, exc: UserError) -> JSONResponse:
    return await _api_error(request, APIError(400, str(exc) or type(exc).__name__))


async def _engine_fault(request: Request, exc: EngineFault) -> JSONResponse:
    return await _api_error(request, fault_error(exc))


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
    return await _api_error(request, APIError(exc.status_code, str(exc.detail), type=kind))


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    return await _api_error(request, APIError(500, "internal server error", type="server_error"))


_FLAG_HELP = {
    "host": "address to bind (default 127.0.0.1; anything else exposes the server)",
    "port": "port to listen on (0 = any free port)",
    "api_key": "require 'Authorization: Bearer <key>' (default: $SWIFTSPEC_API_KEY, else no key)",
    "max_queue": "requests that may wait behind the running one; more get 429",
    "max_tokens": "most new tokens one request may ask for (also the default)",
    "max_body_bytes": "largest request body; larger ones get 413",
    "max_prompt_tokens": "longest prompt in tokens (0 = the context length - 1)",
    "served_model_name": "the model name clients send (default: the --model's file or directory name)",
    "max_prefill_s": "refuse (400) a prompt whose prefill would take longer than this many seconds at the "
                     "prefill rate measured here, its cached prefix aside (0 = no limit)",
    "shutdown_grace_s": "on SIGTERM, running requests may finish for this long; then each ends with an error "
                        "(a stream with an error event and [DONE])",
    "body_timeout_s": "a request body not received in full within this many seconds gets 408",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The server flags of `swiftspec serve`, one per ServerConfig field (engine flags are added apart)."""
    for f in dataclasses.fields(ServerConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.name == "api_key":
            parser.add_argument(flag, default=os.environ.get("SWIFTSPEC_API_KEY", ""), help=_FLAG_HELP[f.name])
        elif f.name == "served_model_name":
            parser.add_argument(flag, default=None, help=_FLAG_HELP[f.name])
        else:
            parser.add_argument(flag, type=type(f.default), default=f.default, help=_FLAG_HELP[f.name])


def server_config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The ServerConfig of parsed flags (raises ConfigError on bad values)."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(ServerConfig)}
    if values["served_model_name"] is None:
        values["served_model_name"] = Path(args.model).name.removesuffix(".gguf") or "swiftspec"
    return ServerConfig(**values)


def run(config: ServerConfig, engine_config: EngineConfig) -> int:
    """`swiftspec serve`: listen at once (/health: starting), build the engine meanwhile, and serve
    it until interrupted. An engine that cannot be built stops the server, and its error is raised.
    engine_config: as parsed; its open defaults are settled (engines.defaults.resolve_defaults) in the
    build, after the server listens, since settling them may run the CUDA check and compile the C++
    kernels."""
    if not config.api_key and not _is_loopback(config.host):
        log.warning("serving on %s without --api-key: anyone who can reach it may use it", config.host)
    signal.signal(signal.SIGTERM, _terminated)
    failed: list[Exception] = []

    def start_failed(exc: Exception) -> None:
        failed.append(exc)
        server.should_exit = True

    app = create_app(lambda: build_engine(resolve_defaults(engine_config)), config, start_failed)
    server = _DrainingServer(uvicorn.Config(app, host=config.host, port=config.port, log_level="info",
                                            timeout_graceful_shutdown=config.shutdown_grace_s + SHUTDOWN_SLACK_S),
                             app.state.service.scheduler, config.shutdown_grace_s)
    try:
        with contextlib.suppress(KeyboardInterrupt):  # uvicorn raises Ctrl-C again once it has shut down
            server.run()
    finally:
        engine = app.state.service.scheduler.engine
        if engine is not None:
            engine.close()
    if failed:
        raise failed[0]
    return 0


class _DrainingServer(uvicorn.Server):
    """uvicorn's server, whose first SIGTERM or Ctrl-C also starts the scheduler's drain: running
    requests may finish for the grace, then end with an error event, before uvicorn's own grace
    (SHUTDOWN_SLACK_S longer) would cut their connections."""

    def __init__(self, config: uvicorn.Config, scheduler: Scheduler, grace_s: float) -> None:
        super().__init__(config)
        self._scheduler, self._grace_s = scheduler, grace_s

    def handle_exit(self, sig: int, frame: object) -> None:
        if not self.should_exit:
            self._scheduler.drain(self._grace_s)
        super().handle_exit(sig, frame)


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM: uvicorn drains the requests, then raises the signal again; exit cleanly then, after
    the engine has stopped its workers, instead of dying by the signal's default action."""
    raise SystemExit(0)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
