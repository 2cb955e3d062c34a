"""`--trace` writes Chrome trace-event JSON in every mode, and `swiftspec trace --png` draws it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from swiftspec.cli.main import main
from swiftspec.config import EngineConfig, LoadConfig, TreeConfig
from swiftspec.engines import build_engine
from swiftspec.sampling import SamplingParams
from swiftspec.trace import Timeline, TraceFile, chrome_trace, request_trace
from trace_format import trace_problems

FP32 = LoadConfig(dtype="float32", max_seq_len=128)


def _timelines() -> tuple[Timeline, Timeline]:
    target, draft = Timeline(), Timeline()
    for _ in range(3):
        with draft.span("expand"):
            time.sleep(0.001)
        with target.span("forward"):
            time.sleep(0.001)
        target.count(accepted=3, tree_size=8)
    return target, draft


def test_chrome_trace_format() -> None:
    target, draft = _timelines()
    doc = chrome_trace([request_trace(target, draft), request_trace(target, draft.as_tensor())], "async")
    assert trace_problems(doc) == []
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert {e["tid"] for e in spans} == {1, 2} and min(e["ts"] for e in spans) == 0.0
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert names == {"target group", "draft group"}
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert {e["name"] for e in counters} == {"accepted tokens", "tree size"} and len(counters) == 12


def test_the_checker_catches_bad_traces() -> None:
    assert trace_problems([]) != []
    assert trace_problems({"traceEvents": [{"ph": "X", "name": "a", "ts": 0}]}) != []  # no dur
    overlapping = [{"ph": "X", "name": "a", "ts": 0, "dur": 10, "pid": 1, "tid": 1},
                   {"ph": "X", "name": "b", "ts": 5, "dur": 10, "pid": 1, "tid": 1}]
    assert trace_problems({"traceEvents": overlapping}) != []


@pytest.mark.parametrize("mode", ["ar", "chain", "tree"])
def test_serial_modes_write_traces(tiny_qwen_dir: Path, tiny_draft_dir: Path, tmp_path: Path, mode: str) -> None:
    path = tmp_path / f"{mode}.json"
    engine = build_engine(EngineConfig(mode=mode, target=str(tiny_qwen_dir), draft=str(tiny_draft_dir),
                                       target_load=FP32, draft_load=FP32, tree=TreeConfig(depth=2, budget=96),
                                       trace=str(path)))
    try:
        for prompt in ([5, 6, 7], [8, 9]):
            list(engine.generate(prompt, SamplingParams(), 12))
    finally:
        engine.close()
    doc = json.loads(path.read_text())
    assert trace_problems(doc) == []
    assert doc["otherData"] == {"mode": mode, "requests": 2, "version": 1}  # start-up profiling is not traced
    steps = {e["cat"] for e in doc["traceEvents"] if e["ph"] == "X"}
    want = {"prefill", "forward", "verify"} | (set() if mode == "ar" else {"expand", "select", "reroot"})
    assert steps == want
    rounds = [e["args"]["accepted tokens"] for e in doc["traceEvents"] if e["name"] == "accepted tokens"]
    assert len(rounds) >= 2 and all(r >= 1 for r in rounds)


def test_trace_file_is_rewritten_whole(tmp_path: Path) -> None:
    target, draft = _timelines()
    trace = TraceFile(tmp_path / "sub" / "t.json", "tree")
    trace.add(request_trace(target, draft))
    trace.add(request_trace(target, draft))
    assert json.loads((tmp_path / "sub" / "t.json").read_text())["otherData"]["requests"] == 2


def test_trace_png(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    target, draft = _timelines()
    path = tmp_path / "t.json"
    TraceFile(path, "async").add(request_trace(target, draft))
    assert main(["trace", str(path), "--png", str(tmp_path / "t.png")]) == 0
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "target group: busy" in out and "draft group: busy" in out
    (tmp_path / "bad.json").write_text("{}")
    assert main(["trace", str(tmp_path / "bad.json")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
