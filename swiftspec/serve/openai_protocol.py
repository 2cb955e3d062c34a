"""OpenAI wire format: request schemas for /v1/completions and /v1/chat/completions, error bodies,
and the JSON of responses and stream chunks. Only n=1 and text output are supported.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256  # holding back a possible stop string costs O(length^2) per token


@dataclass(slots=True)
class APIError(Exception):
    """A request the server refuses; rendered as an OpenAI error body with this HTTP status."""

    status: int
    message: str
    param: str | None = None
    code: str | None = None
    type: str = "invalid_request_error"

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def fault_error(exc: Exception) -> APIError:
    """A request the engine lost to a worker fault (or to shutdown): 503, worth retrying."""
    return APIError(503, f"the engine failed on this request: {exc}", code="engine_fault", type="server_error")


def validation_error(exc: ValidationError) -> APIError:
    """The first pydantic error as a 400, naming the offending top-level field as `param`."""
    first = exc.errors(include_url=False)[0]
    loc = first.get("loc", ())
    param = str(loc[0]) if loc else None
    where = ".".join(str(part) for part in loc)
    return APIError(400, f"{where}: {first['msg']}" if where else first["msg"], param=param, code="invalid_value")


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    include_usage: bool | None = None


class GenerationRequest(BaseModel):
    """Fields shared by both endpoints; null means the default, as in OpenAI's API."""

    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)  # extension (vLLM); 0 = off
    min_p: float | None = Field(None, ge=0.0, lt=1.0)  # extension (vLLM); 0 = off
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: str | list[str] | None = None
    n: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, Any] | None = None
    user: str | None = None
    cache_prompt: bool | None = None  # extension (llama-server's): false = keep no cached KV for this prompt

    @field_validator("n")
    @classmethod
    def _only_one_choice(cls, n: int | None) -> int | None:
        if n not in (None, 1):
            raise ValueError("only n=1 is supported")
        return n

    @field_validator("stop")
    @classmethod
    def _few_short_stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        return few_short_stops(stop)

    @model_validator(mode="after")
    def _no_unsupported(self) -> "GenerationRequest":
        for name, value in self._unsupported().items():
            if value:
                raise ValueError(f"{name} is not supported by this server")
        return self

    def _unsupported(self) -> dict[str, Any]:
        """Fields this server accepts only at their neutral value (falsy = neutral)."""
        return {
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "logit_bias": self.logit_bias,
        }

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def token_limit(self) -> int | None:
        return self.max_tokens


def few_short_stops(stop: str | list[str] | None) -> str | list[str] | None:
    """stop as given, if it holds at most MAX_STOP_STRINGS strings of at most MAX_STOP_CHARS each."""
    stops = [stop] if isinstance(stop, str) else stop or []
    if len(stops) > MAX_STOP_STRINGS:
        raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are supported")
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise ValueError(f"a stop string may have at most {MAX_STOP_CHARS} characters")
    return stop


class CompletionRequest(GenerationRequest):
    """POST /v1/completions. The prompt is text or token ids, one prompt per request. A `suffix`
    (any string, "" too) makes it a fill-in-the-middle: the text goes between prompt and suffix."""

    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None

    def _unsupported(self) -> dict[str, Any]:
        best_of_other = self.best_of not in (None, 1)
        return {**super()._unsupported(), "logprobs": self.logprobs, "echo": self.echo,
                "best_of other than 1": best_of_other}

    @field_validator("prompt")
    @classmethod
    def _single_prompt(cls, prompt: Any) -> Any:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ValueError("only one prompt per request is supported")
            return prompt[0]
        return prompt


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def as_template_input(self) -> dict[str, str]:
        """The {role, content} dict the chat template takes; text parts are joined, developer is system."""
        content = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content or [])
        return {"role": "system" if self.role == "developer" else self.role, "content": content}


class ChatCompletionRequest(GenerationRequest):
    """POST /v1/chat/completions, rendered with the model's chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    tools: list[Any] | None = None

    def _unsupported(self) -> dict[str, Any]:
        return {**super()._unsupported(), "logprobs": self.logprobs, "tools": self.tools}

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


@dataclass(frozen=True, slots=True)
class ResponseHeader:
    """What every body and chunk of one response repeats."""

    id: str
    created: int
    model: str
    chat: bool
    fingerprint: str  # OpenAI's system_fingerprint: "swiftspec-" and the engine's mode (auto's choice)

    @classmethod
    def new(cls, model: str, chat: bool, fingerprint: str) -> "ResponseHeader":
        prefix = "chatcmpl" if chat else "cmpl"
        return cls(id=f"{prefix}-{uuid.uuid4().hex}", created=int(time.time()), model=model, chat=chat,
                   fingerprint=fingerprint)

    def envelope(self, object_name: str, choices: list[dict], usage: dict | None = None) -> dict[str, Any]:
        body = {"id": self.id, "object": object_name, "created": self.created, "model": self.model,
                "system_fingerprint": self.fingerprint, "choices": choices}
        if usage is not None:
            body["usage"] = usage
        return body


@dataclass(frozen=True, slots=True)
class Timings:
    """Seconds from arrival to the first token (queue wait included: "prompt") and from the first
    token to the last ("predicted")."""

    prompt_tokens: int
    prompt_s: float
    predicted_tokens: int
    predicted_s: float
    cached_tokens: int  # of prompt_tokens, those whose KV the prompt cache held
    speculation: dict[str, Any]  # how the engine decoded this request (Outcome.timings)

    def to_json(self) -> dict[str, Any]:
        """llama-server's timings: prompt_n counts the prompt tokens computed, cache_n those reused;
        and ours, `speculation`."""
        prompt_ms, predicted_ms = 1000 * self.prompt_s, 1000 * self.predicted_s
        computed = self.prompt_tokens - self.cached_tokens
        return {"cache_n": self.cached_tokens, "prompt_n": computed, "prompt_ms": prompt_ms,
                "prompt_per_token_ms": prompt_ms / max(1, computed),
                "prompt_per_second": computed / self.prompt_s if self.prompt_s > 0 else 0.0,
                "predicted_n": self.predicted_tokens, "predicted_ms": predicted_ms,
                "predicted_per_token_ms": predicted_ms / max(1, self.predicted_tokens),
                "predicted_per_second": self.predicted_tokens / self.predicted_s if self.predicted_s > 0 else 0.0,
                "speculation": self.speculation}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's usage, with the prompt tokens whose KV the prompt cache held."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def full_response(head: ResponseHeader, text: str, finish_reason: str, used: dict[str, Any],
                  timings: Timings) -> dict[str, Any]:
    """The non-streaming body, with llama-server's `timings` beside OpenAI's fields."""
    if head.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "logprobs": None, "finish_reason": finish_reason}
        body = head.envelope("chat.completion", [choice], used)
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        body = head.envelope("text_completion", [choice], used)
    return body | {"timings": timings.to_json()}


def chunk(head: ResponseHeader, text: str | None, finish_reason: str | None = None,
          timings: Timings | None = None) -> dict[str, Any]:
    """One stream chunk. For chat, text None is the opening chunk (the assistant role).  The one
    with the finish reason carries the request's timings (as llama-server's does)."""
    extra = {} if timings is None else {"timings": timings.to_json()}
    if head.chat:
        if text is None:
            delta = {"role": "assistant", "content": ""}
        else:
            delta = {"content": text} if text else {}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return head.envelope("chat.completion.chunk", [choice]) | extra
    choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
    return head.envelope("text_completion", [choice]) | extra


def usage_chunk(head: ResponseHeader, used: dict[str, Any]) -> dict[str, Any]:
    """The last chunk when stream_options.include_usage is set: no choices, only usage."""
    return head.envelope("chat.completion.chunk" if head.chat else "text_completion", [], used)
