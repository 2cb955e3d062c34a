"""llama.cpp's POST /infill wire format, as editor plugins speak it (llama.vim, llama.vscode): the
request schema and the JSON of responses and stream events.

Sampling defaults are llama.cpp's (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05), since these
clients leave them to the server. `cache_prompt` (default true) is honoured: false keeps no cached KV
for the prompt. Tuning fields that only make llama.cpp faster (t_max_prompt_ms, id_slot, samplers'
order...) are accepted and ignored; fields that would change
the text in a way we cannot honour are accepted only at their neutral value (UNSUPPORTED).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from swiftspec.fim import ExtraChunk, FimInput
from swiftspec.sampling import SamplingParams
from swiftspec.serve.openai_protocol import Timings, few_short_stops

# llama.cpp fields this server cannot honour, with their neutral value (also accepted: null, "", [], {}).
UNSUPPORTED = {
    "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "typical_p": 1.0,
    "mirostat": 0, "dynatemp_range": 0.0, "xtc_probability": 0.0, "dry_multiplier": 0.0, "top_n_sigma": -1.0,
    "grammar": "", "json_schema": {}, "logit_bias": [], "n_probs": 0, "ignore_eos": False, "lora": [],
    "n_cmpl": 1, "image_data": [], "multimodal_data": [],
}
LLAMA_RANDOM_SEED = 0xFFFFFFFF  # llama.cpp's default seed: a random one


class InfillChunk(BaseModel):
    """One `input_extra` entry: {"filename": string, "text": string} (llama.vim adds "time")."""

    model_config = ConfigDict(strict=True, extra="ignore")

    text: str
    filename: str = "tmp"  # llama.cpp's name for a chunk without one


class InfillRequest(BaseModel):
    """POST /infill. `prompt` is text typed before the cursor on its line: it follows the prefix."""

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)

    input_prefix: str
    input_suffix: str
    input_extra: list[InfillChunk] | None = None
    prompt: str = ""
    n_predict: int | None = Field(None, ge=-1)  # -1: as many as the server allows
    max_tokens: int | None = Field(None, ge=-1)  # llama.cpp's other name for n_predict
    temperature: float = Field(0.8, ge=0.0)  # 0 = greedy
    top_k: int = 40  # <= 0: off
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    min_p: float = Field(0.05, ge=0.0, lt=1.0)
    seed: int = Field(-1, ge=-1, lt=2**63)  # -1 (or LLAMA_RANDOM_SEED): random
    stop: list[str] | str | None = None
    stream: bool = False
    n_indent: int = Field(0, ge=0)  # end before a later line indented by fewer blanks
    t_max_predict_ms: float = Field(0.0, ge=0.0)  # once a line has ended, stop after this long; 0 = off
    response_fields: list[str] | None = None  # return only these ("a/b" = body["a"]["b"]), as flat keys
    cache_prompt: bool = True  # false: the prefill keeps no cached KV (every prompt token is computed)

    @field_validator("stop")
    @classmethod
    def _few_short_stops(cls, stop: list[str] | str | None) -> list[str] | str | None:
        return few_short_stops(stop)

    @model_validator(mode="after")
    def _no_unsupported(self) -> "InfillRequest":
        extra = self.model_extra or {}
        for name, neutral in UNSUPPORTED.items():
            value = extra.get(name)
            if value not in (None, "", [], {}) and value != neutral:
                raise ValueError(f"{name} is not supported by this server")
        return self

    @property
    def token_limit(self) -> int | None:
        """The new tokens asked for; None (absent or -1): the server's cap."""
        asked = self.n_predict if self.n_predict is not None else self.max_tokens
        return None if asked is None or asked < 0 else asked

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=max(0, self.top_k),
                              min_p=self.min_p, seed=None if self.seed in (-1, LLAMA_RANDOM_SEED) else self.seed)

    def fim_input(self) -> FimInput:
        extra = tuple(ExtraChunk(filename=c.filename, text=c.text) for c in self.input_extra or ())
        return FimInput(prefix=self.input_prefix, suffix=self.input_suffix, middle=self.prompt, extra=extra)

    def settings(self) -> dict[str, Any]:
        """The `generation_settings` of a response."""
        return {"n_predict": -1 if self.token_limit is None else self.token_limit, "temperature": self.temperature,
                "top_k": self.top_k, "top_p": self.top_p, "min_p": self.min_p, "seed": self.seed,
                "stop": list(self.stop_strings), "stream": self.stream, "n_indent": self.n_indent,
                "t_max_predict_ms": self.t_max_predict_ms}


@dataclass(frozen=True, slots=True)
class InfillResult:
    """What the final body reports."""

    content: str  # "" in a stream: the text went out in the chunks
    stop_type: str  # "eos" | "word" | "limit"
    stopping_word: str
    truncated: bool  # context was left out of the prompt to fit
    timings: Timings


def final_body(req: InfillRequest, model: str, result: InfillResult) -> dict[str, Any]:
    """The whole response (or a stream's last event), cut down to `response_fields` if given."""
    t = result.timings
    body = {"index": 0, "content": result.content, "tokens": [], "id_slot": 0, "stop": True, "model": model,
            "tokens_predicted": t.predicted_tokens, "tokens_evaluated": t.prompt_tokens,
            "generation_settings": req.settings(), "truncated": result.truncated, "stop_type": result.stop_type, "stopping_word": result.stopping_word,
            "tokens_cached": t.cached_tokens, "timings": t.to_json()}
    return body if req.response_fields is None else nested_values(body, req.response_fields)


def partial_body(content: str, predicted: int, evaluated: int) -> dict[str, Any]:
    """One stream event before the last."""
    return {"index": 0, "content": content, "tokens": [], "stop": False, "id_slot": 0,
            "tokens_predicted": predicted, "tokens_evaluated": evaluated}


def nested_values(body: dict[str, Any], paths: list[str]) -> dict[str, Any]:
    """{path: value} for each "a/b" path that names a value (body["a"]["b"]), as llama.cpp's response_fields."""
    out = {}
    for path in paths:
        value: Any = body
        for key in path.split("/"):
            value = value.get(key, _MISSING) if isinstance(value, dict) else _MISSING
        if value is not _MISSING:
            out[path] = value
    return out


_MISSING = object()
