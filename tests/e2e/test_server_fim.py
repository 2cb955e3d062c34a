"""Fill-in-the-middle through the server on a tiny model with FIM tokens: /v1/completions with a
`suffix` (the official `openai` client) and llama.cpp's /infill (the bodies llama.vim sends), whole
and streamed; what the model generates is what the engine makes of the FIM prompt, and the tree and
chain engines (prompt lookup on) emit exactly the ar engine's greedy text."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server_harness import MODEL, LiveServer, ScriptedEngine, tiny_engine
from swiftspec.config import EngineConfig, LoadConfig, TreeConfig
from swiftspec.engines import build_engine
from swiftspec.fim import FimInput, find_fim_tokens, plain_prompt, repo_prompt
from swiftspec.runner.load import load_target
from swiftspec.sampling import SamplingParams
from swiftspec.testing.tiny import make_perturbed_draft
from swiftspec.tokenizer import Tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

PREFIX, SUFFIX = "def add(a, b):\n", "\n\nprint(add(1, 2))\n"
# What llama.vim sends for a completion (autoload/llama.vim, llama#fim), tuning fields included.
LLAMA_VIM = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "prompt": "    ret", "n_predict": 12, "n_indent": 4,
             "input_extra": [{"text": "x = 1\n", "time": [1, 2], "filename": "a.py"}], "top_k": 40, "top_p": 0.99,
             "stream": False, "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True,
             "t_max_prompt_ms": 500, "t_max_predict_ms": 1500, "response_fields": ["content", "timings/prompt_n"]}
GREEDY = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "prompt": "", "n_predict": 16, "temperature": 0.0}
LLAMA_VIM_GREEDY = {**LLAMA_VIM, **GREEDY, "response_fields": None, "t_max_predict_ms": 0}  # no time limit


@pytest.fixture(scope="module")
def server(tiny_fim_dir: Path):
    with tiny_engine(tiny_fim_dir) as engine, LiveServer(engine, max_tokens=64) as srv:
        srv.engine = engine
        yield srv


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def infill(srv: LiveServer, body: dict) -> httpx.Response:
    return httpx.post(srv.url + "/infill", json=body, timeout=60)


def infill_events(srv: LiveServer, body: dict) -> list[dict]:
    with httpx.stream("POST", srv.url + "/infill", json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)  # llama.cpp ends with stop: true, not [DONE]
    return [json.loads(line[len("data: "):]) for line in lines]


def engine_text(srv: LiveServer, prompt: list[int], max_tokens: int) -> str:
    """The greedy text the engine itself makes of a prompt (all EOS and FIM stops are in reach)."""
    ids = [t for chunk in srv.engine.generate(prompt, SamplingParams(), max_tokens) for t in chunk]
    stops = find_fim_tokens(srv.engine.tokenizer).stops
    ids = ids[: next((i for i, t in enumerate(ids) if t in stops), len(ids))]
    return srv.engine.tokenizer.decode(ids)


def test_completion_with_suffix_is_the_fim_prompt(server: LiveServer, client: openai.OpenAI) -> None:
    tok = server.engine.tokenizer
    ids = plain_prompt(tok, find_fim_tokens(tok), FimInput(prefix=PREFIX, suffix=SUFFIX))
    r = client.completions.create(model=MODEL, prompt=PREFIX, suffix=SUFFIX, max_tokens=16, temperature=0)
    assert r.usage.prompt_tokens == len(ids)
    assert r.choices[0].text == engine_text(server, ids, 16)
    chunks = list(client.completions.create(model=MODEL, prompt=PREFIX, suffix=SUFFIX, max_tokens=16,
                                            temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text
    plain = client.completions.create(model=MODEL, prompt=PREFIX, max_tokens=4, temperature=0)
    assert plain.usage.prompt_tokens == len(tok.encode(PREFIX))  # no suffix: no FIM


def test_empty_suffix_is_fim_and_control_spellings_stay_text(server: LiveServer, client: openai.OpenAI) -> None:
    tok = server.engine.tokenizer
    r = client.completions.create(model=MODEL, prompt=PREFIX, suffix="", max_tokens=2, temperature=0)
    assert r.usage.prompt_tokens == len(tok.encode_text(PREFIX)) + 3
    sneaky = "s = '<|fim_middle|><|endoftext|>'\n"
    r = client.completions.create(model=MODEL, prompt=sneaky, suffix=SUFFIX, max_tokens=2, temperature=0)
    assert r.usage.prompt_tokens == len(tok.encode_text(sneaky)) + len(tok.encode_text(SUFFIX)) + 3


def test_infill_body_is_llama_cpp_shaped(server: LiveServer) -> None:
    tok = server.engine.tokenizer
    r = infill(server, GREEDY)
    assert r.status_code == 200, r.text
    body = r.json()
    ids = repo_prompt(tok, find_fim_tokens(tok), FimInput(prefix=PREFIX, suffix=SUFFIX), 10_000).ids
    assert body["content"] == engine_text(server, ids, 16)
    assert body["stop"] is True and body["tokens_evaluated"] == len(ids) and not body["truncated"]
    assert body["stop_type"] in ("eos", "limit") and body["tokens_predicted"] <= 16
    assert set(body["timings"]) >= {"prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "predicted_per_second"}
    assert body["generation_settings"]["n_predict"] == 16
    events = infill_events(server, GREEDY)
    assert [e["stop"] for e in events] == [False] * (len(events) - 1) + [True]
    assert "".join(e["content"] for e in events) == body["content"]
    assert events[-1]["tokens_predicted"] == body["tokens_predicted"]


def test_llama_vim_requests_work(server: LiveServer) -> None:
    r = infill(server, LLAMA_VIM)
    assert r.status_code == 200, r.text
    assert set(r.json()) == {"content", "timings/prompt_n"}  # response_fields: flat "a/b" keys, as llama.cpp
    warm = {**LLAMA_VIM, "input_prefix": "", "input_suffix": "", "prompt": "", "n_predict": 0, "samplers": [],
            "t_max_predict_ms": 1, "response_fields": [""]}
    r = infill(server, warm)  # the ring-buffer update: nothing to generate, and no fields asked for
    assert r.status_code == 200 and r.json() == {}
    r = infill(server, {**warm, "response_fields": None})
    assert r.json()["content"] == "" and r.json()["tokens_predicted"] == 0


def test_extra_context_that_does_not_fit_is_left_out(server: LiveServer) -> None:
    extra = [{"filename": f"f{i}.py", "text": f"value_{i} = {i}\n" * 8} for i in range(30)]
    r = infill(server, {**GREEDY, "input_extra": extra, "n_predict": 4})
    assert r.status_code == 200, r.text
    assert r.json()["truncated"] is True and r.json()["tokens_evaluated"] < 256  # tiny_engine's context


def test_fim_stop_tokens_end_fim_text_only(tiny_fim_dir: Path) -> None:
    tok = Tokenizer.from_dir(tiny_fim_dir)
    ids = tok.encode_text("x = 1\n") + [tok.added_token_id("<|fim_pad|>")] + tok.encode_text("junk")
    with LiveServer(ScriptedEngine(tok, [ids[:3], ids[3:]])) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        r = client.completions.create(model=MODEL, prompt=PREFIX, suffix=SUFFIX, max_tokens=32)
        assert (r.choices[0].text, r.choices[0].finish_reason) == ("x = 1\n", "stop")
        assert r.usage.completion_tokens == len(tok.encode_text("x = 1\n"))  # the stop token counts as EOS does
        body = infill(srv, GREEDY).json()
        assert (body["content"], body["stop_type"]) == ("x = 1\n", "eos")
        r = client.completions.create(model=MODEL, prompt=PREFIX, max_tokens=32)  # no FIM: <|fim_pad|> is text
        assert r.choices[0].text == "x = 1\njunk"


def test_infill_n_indent_stop_and_time_limit(tiny_fim_dir: Path) -> None:
    tok = Tokenizer.from_dir(tiny_fim_dir)
    ids = tok.encode_text("a\n    b\n  c\nd")
    with LiveServer(ScriptedEngine(tok, [[t] for t in ids], round_s=0.02)) as srv:
        body = infill(srv, {**GREEDY, "n_predict": 32}).json()
        assert (body["content"], body["stop_type"]) == ("a\n    b\n  c\nd", "eos")
        body = infill(srv, {**GREEDY, "n_indent": 4}).json()  # llama.cpp keeps the short line's blanks
        assert (body["content"], body["stop_type"]) == ("a\n    b\n  ", "limit")
        body = infill(srv, {**GREEDY, "stop": ["b"]}).json()
        assert (body["content"], body["stop_type"], body["stopping_word"]) == ("a\n    ", "word", "b")
        body = infill(srv, {**GREEDY, "t_max_predict_ms": 1}).json()  # rounds come 20 ms apart
        assert (body["content"], body["stop_type"]) == ("a\n", "limit")
        events = infill_events(srv, {**GREEDY, "n_indent": 4})
        assert "".join(e["content"] for e in events) == "a\n    b\n  " and events[-1]["stop_type"] == "limit"


BAD_INFILLS = {
    "no input_prefix": ({"input_prefix": None}, "input_prefix"),
    "input_prefix not text": ({"input_prefix": 5}, "input_prefix"),
    "no input_suffix": ({"input_suffix": None}, "input_suffix"),
    "input_extra not a list": ({"input_extra": "x"}, "input_extra"),
    "chunk without text": ({"input_extra": [{"filename": "a.py"}]}, "input_extra"),
    "chunk filename not text": ({"input_extra": [{"text": "x", "filename": 3}]}, "input_extra"),
    "prompt not text": ({"prompt": [1, 2]}, "prompt"),
    "n_predict below -1": ({"n_predict": -2}, "n_predict"),
    "n_predict over the cap": ({"n_predict": 65}, "n_predict"),
    "temperature not a number": ({"temperature": "hot"}, "temperature"),
    "top_p zero": ({"top_p": 0}, "top_p"),
    "repeat_penalty": ({"repeat_penalty": 1.1}, None),
    "grammar": ({"grammar": "root ::= \"x\""}, None),
    "lora": ({"lora": [{"id": 0, "scale": 0.5}]}, None),
    "too many stops": ({"stop": ["a"] * 17}, "stop"),
}


@pytest.mark.parametrize("name", BAD_INFILLS)
def test_bad_infill_requests(server: LiveServer, name: str) -> None:
    change, param = BAD_INFILLS[name]
    body = {k: v for k, v in {**GREEDY, **change}.items() if v is not None}
    r = infill(server, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and "\n" not in error["message"]


def test_bad_suffix_requests(server: LiveServer, client: openai.OpenAI) -> None:
    r = httpx.post(server.url + "/v1/completions", json={"prompt": [1, 2, 3], "suffix": "x"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt=PREFIX, suffix=5, max_tokens=2)  # type: ignore[arg-type]
    assert httpx.post(server.url + "/infill", content=b"{", timeout=30).status_code == 400


INFILL_FIELDS = {
    "input_prefix": st.text(max_size=30), "input_suffix": st.text(max_size=30), "prompt": st.text(max_size=10),
    "input_extra": st.lists(st.fixed_dictionaries({"text": st.text(max_size=20)},
                                                  optional={"filename": st.text(max_size=8)}), max_size=3),
    "n_predict": st.integers(-1, 4), "temperature": st.floats(0, 2), "top_k": st.integers(-5, 50),
    "top_p": st.floats(0.01, 1), "seed": st.integers(-1, 2**32), "stream": st.booleans(),
    "n_indent": st.integers(0, 8), "stop": st.lists(st.text(max_size=3), max_size=3),
    "response_fields": st.lists(st.sampled_from(["content", "timings/prompt_n", "stop", "x/y"]), max_size=3),
}
any_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
                        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                    max_size=3), max_leaves=8)


@st.composite
def near_valid_infill(draw: st.DrawFn) -> dict:
    """A valid /infill body with up to two fields replaced by any JSON value or removed."""
    required = ("input_prefix", "input_suffix")
    body = dict(draw(st.fixed_dictionaries({k: INFILL_FIELDS[k] for k in required},
                                           optional={k: v for k, v in INFILL_FIELDS.items() if k not in required})))
    for _ in range(draw(st.integers(0, 2))):
        key = draw(st.sampled_from(sorted(INFILL_FIELDS)))
        if draw(st.booleans()):
            body[key] = draw(any_json)
        else:
            body.pop(key, None)
    return body


def test_fuzzed_infill_bodies_never_get_a_5xx(server: LiveServer) -> None:
    statuses: list[int] = []
    with LiveServer(server.engine, max_tokens=4) as small, httpx.Client(base_url=small.url, timeout=30) as client:

        @settings(max_examples=150, deadline=None, database=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(body=near_valid_infill())
        def one(body: dict) -> None:
            r = client.post("/infill", json=body)
            assert r.status_code < 500 and "server_error" not in r.text, r.text
            statuses.append(r.status_code)

        one()
        assert statuses.count(200) >= 30 and len(statuses) - statuses.count(200) >= 30  # both sides explored
        assert 'status="5' not in client.get("/metrics").text


def test_model_without_fim_tokens_is_refused(tiny_qwen_dir: Path) -> None:
    with tiny_engine(tiny_qwen_dir) as engine, LiveServer(engine) as srv:
        r = infill(srv, GREEDY)
        assert r.status_code == 400 and r.json()["error"]["message"] == "this model has no fill-in-the-middle tokens"
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model=MODEL, prompt=PREFIX, suffix=SUFFIX, max_tokens=2)
        assert info.value.body["param"] == "suffix"
        assert client.completions.create(model=MODEL, prompt=PREFIX, max_tokens=2).choices  # plain still works


@contextlib.contextmanager
def speculative_server(mode: str, target_dir: Path, draft_dir: Path, target):
    load = LoadConfig(device="cpu", dtype="float32", max_seq_len=256)
    config = EngineConfig(mode=mode, target=str(target_dir), draft=str(draft_dir), target_load=load, draft_load=load,
                          tree=TreeConfig(depth=2, chain_length=3))
    engine = build_engine(config, target)
    try:
        with LiveServer(engine) as srv:
            yield srv
    finally:
        engine.close()


def test_speculation_inside_fim_is_lossless(tiny_fim_dir: Path, tmp_path: Path) -> None:
    draft_dir = make_perturbed_draft(tiny_fim_dir, tmp_path / "draft")
    target = load_target(str(tiny_fim_dir), LoadConfig(device="cpu", dtype="float32", max_seq_len=256))
    with speculative_server("ar", tiny_fim_dir, draft_dir, target) as ar:
        want_suffix = _suffix_text(ar)
        want_infill = infill(ar, LLAMA_VIM_GREEDY).json()["content"]
    assert want_suffix and want_infill
    for mode in ("tree", "chain"):
        with speculative_server(mode, tiny_fim_dir, draft_dir, target) as srv:
            assert _suffix_text(srv) == want_suffix, mode
            assert infill(srv, LLAMA_VIM_GREEDY).json()["content"] == want_infill, mode
            assert "".join(e["content"] for e in infill_events(srv, {**GREEDY, "n_predict": 24})) == \
                infill(srv, {**GREEDY, "n_predict": 24}).json()["content"], mode
            assert _metric(srv, "swiftspec_acceptance_length_sum") > _metric(srv, "swiftspec_acceptance_length_count")


def _suffix_text(srv: LiveServer) -> str:
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    prompt = "def fibonacci(n):\n    result = [0, 1]\n    for i in range(2, n):\n"
    r = client.completions.create(model=MODEL, prompt=prompt, suffix="    return result[:n]\n", max_tokens=32,
                                  temperature=0)
    return r.choices[0].text


def _metric(srv: LiveServer, name: str) -> float:
    """A sample's value: here, that some rounds emitted more than one token (drafts were accepted)."""
    lines = httpx.get(srv.url + "/metrics").text.splitlines()
    return float(next(line.split()[-1] for line in lines if line.startswith(name + " ")))
