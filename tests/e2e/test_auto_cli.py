"""`swiftspec generate` with no mode flag: auto profiles the pair once, says what it chose in one
line, reuses the cached profile afterwards, and `--reprofile` measures again."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from swiftspec.cli.main import main
from swiftspec.config import MODES
from swiftspec.engines.auto.predict import PairProfile


@pytest.fixture(autouse=True)
def quiet_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every profile counts as taken on a quiet host, so it is cached whatever the load beside the
    tests (a busy CI host made one "disturbed": not cached, measured again, and the second run said
    "profiled" where "cached profile" was due).  These tests are about reading and reusing the
    profile; test_auto.py checks the busy-host rule on profiles of its own."""
    monkeypatch.setattr(PairProfile, "disturbed", property(lambda self: False))


AUTO_LINE = re.compile(r"^auto: (ar|chain|tree|async)( \((bf16|int8|int4) draft\))?: .*\[(.*)\]$", re.M)


def _generate(pair: tuple[Path, Path], capsys: pytest.CaptureFixture, *extra: str) -> str:
    target, draft = pair
    rc = main(["generate", "def add(a, b):", "--model", str(target), "--draft-model", str(draft), "--device", "cpu",
               "--dtype", "float32", "--max-tokens", "8", "--max-seq-len", "256", *extra])
    err = capsys.readouterr().err
    assert rc == 0, err
    return err


def test_generate_defaults_to_auto(tmp_cache: Path, tiny_qwen_dir: Path, tiny_draft_dir: Path,
                                   capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    pair = (tiny_qwen_dir, tiny_draft_dir)
    first = AUTO_LINE.search(_generate(pair, capsys, "--trace", str(tmp_path / "t.json")))
    assert first and first[4].startswith("profiled in ")
    assert len(list((tmp_cache / "auto").glob("*.json"))) == 1
    trace = json.loads((tmp_path / "t.json").read_text())
    assert trace["otherData"]["mode"] == first[1]  # the trace names the engine auto chose
    again = AUTO_LINE.search(_generate(pair, capsys))
    assert again and again[4].startswith("cached profile") and again[1] == first[1]
    fresh = AUTO_LINE.search(_generate(pair, capsys, "--reprofile"))
    assert fresh and fresh[4].startswith("profiled in ")


def test_flags_narrow_the_choice(tmp_cache: Path, tiny_qwen_dir: Path, tiny_draft_dir: Path,
                                 capsys: pytest.CaptureFixture) -> None:
    line = AUTO_LINE.search(_generate((tiny_qwen_dir, tiny_draft_dir), capsys, "--chain-length", "2"))
    assert line and line[1] == "chain"
    assert all(f"; {m} " not in line[0] for m in MODES)  # no other candidate was left


def test_an_explicit_mode_refuses_foreign_flags(tiny_qwen_dir: Path, capsys: pytest.CaptureFixture) -> None:
    rc = main(["generate", "x", "--model", str(tiny_qwen_dir), "--mode", "ar", "--chain-length", "3"])
    err = capsys.readouterr().err
    assert rc == 2 and err == "error: --chain-length applies to chain only; --mode ar would ignore it\n"


def test_forecast_prints_each_mode_and_the_two_host_break_even(tmp_cache: Path, tiny_qwen_dir: Path,
                                                                tiny_draft_dir: Path,
                                                                capsys: pytest.CaptureFixture) -> None:
    pair = ["--model", str(tiny_qwen_dir), "--draft-model", str(tiny_draft_dir), "--device", "cpu",
            "--dtype", "float32", "--max-seq-len", "256"]
    assert main(["forecast", *pair, "--rtt-ms", "2", "--draft-speed", "3"]) == 0
    out = capsys.readouterr().out
    assert AUTO_LINE.search(out)
    assert all(re.search(rf"^  {m}\b.*: [\d.]+ tok/s predicted", out, re.M) for m in MODES)
    assert re.search(r"^one host: tree [\d.]+ tok/s, async [\d.]+ tok/s", out, re.M)
    assert re.search(r"^two hosts \(draft x1, rtt 2 ms\)", out, re.M)
    assert re.search(r"^two hosts \(draft x3, rtt 2 ms\)", out, re.M)
    assert re.search(r"^break-even: ", out, re.M)
    assert main(["forecast", *pair, "--rtt-ms", "-1"]) == 2
    assert capsys.readouterr().err == "error: --rtt-ms must be >= 0 and --draft-speed > 0\n"


@pytest.mark.parametrize("adaptive", [True, False])
def test_the_chosen_engine_starts_from_the_pair_profile(tmp_cache: Path, tiny_qwen_dir: Path, tiny_draft_dir: Path,
                                                         monkeypatch: pytest.MonkeyPatch, adaptive: bool) -> None:
    """The engine auto builds runs with the start-up profile read from auto's pair profile (its d,
    and with adaptive rounds the verify times of 1..bs nodes): it times no verification and no
    warm-up of its own, and the same request gives the same tokens as a tree engine that does."""
    import dataclasses

    from swiftspec.cli.engine_args import engine_config_from_args
    from swiftspec.cli.main import build_parser
    from swiftspec.engines import build_engine
    from swiftspec.engines.auto.choose import decide
    from swiftspec.engines.defaults import resolve_defaults
    from swiftspec.engines.serial import SerialEngine
    from swiftspec.sampling import SamplingParams

    argv = ["generate", "x", "--model", str(tiny_qwen_dir), "--draft-model", str(tiny_draft_dir), "--device", "cpu",
            "--dtype", "float32", "--max-seq-len", "256"] + ([] if adaptive else ["--no-adaptive"])
    config = resolve_defaults(engine_config_from_args(build_parser().parse_args(argv)))
    auto = dataclasses.replace(config, auto=dataclasses.replace(config.auto, modes=("tree",)))
    own = build_engine(dataclasses.replace(auto, mode="tree"))  # profiles itself
    prompt, params = own.tokenizer.encode("def add(a, b):"), SamplingParams()
    want = [t for chunk in own.generate(prompt, params, 24) for t in chunk]

    def measured(*args, **kwargs):
        raise AssertionError("the engine measured its start-up profile again")

    with monkeypatch.context() as m:
        m.setattr(SerialEngine, "verify_times", measured)
        m.setattr(SerialEngine, "warmup", measured)
        engine = build_engine(auto)
    decision = decide(auto)  # the cached profile's
    assert isinstance(engine, SerialEngine) and engine.profile == decision.startup
    assert engine.mode == decision.config.mode == "tree"  # what auto chose: /metrics and system_fingerprint say it
    if adaptive:  # the cap of adaptive rounds (startup.deepest_depth), whoever profiles
        assert engine.profile.depth == own.profile.depth and len(engine.profile.verify_s) == config.tree.verify_size
    else:  # serial_depth of the pair profile's forward times
        assert engine.profile.depth >= 2 and engine.profile.verify_s == ()
    assert [t for chunk in engine.generate(prompt, params, 24) for t in chunk] == want
