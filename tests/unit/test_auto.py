"""`--mode auto` without models: the round simulation, the predictions, the choice and its line, the
cache, and how flags narrow auto's candidates or are refused by an explicit mode."""

from __future__ import annotations

import dataclasses

import pytest

from swiftspec.cli.engine_args import auto_candidates, engine_config_from_args
from swiftspec.cli.main import build_parser
from swiftspec.config import AutoConfig, ConfigError, EngineConfig, TreeConfig
from swiftspec.engines.auto import store
from swiftspec.engines.auto.choose import Decision, choose, predictions
from swiftspec.engines.auto.predict import (
    Costs,
    DraftProfile,
    PairProfile,
    Position,
    bus_slowdown,
    chain_round,
    simulate,
    tree_round,
)

SURE, UNSURE = (-0.05, -4.0, -5.0), (-0.9, -1.0, -2.0)


def pos(rank: int, lps=SURE, on_path: bool = True) -> Position:
    return Position(on_path=on_path, rank=rank, logprobs=lps)


def test_costs_interpolate_and_extrapolate() -> None:
    c = Costs(rows=(1, 4, 8), seconds=(0.010, 0.013, 0.021))
    assert c.at(1) == 0.010 and c.at(4) == pytest.approx(0.013)
    assert c.at(6) == pytest.approx(0.017) and c.at(16) == pytest.approx(0.037)


def test_chain_round() -> None:
    text = (pos(1), pos(1), pos(2), pos(1))
    assert chain_round(text, 0, 4) == 2 and chain_round(text, 0, 1) == 1 and chain_round(text, 2, 4) == 0
    off = (pos(1), pos(1, on_path=False), pos(1))
    assert chain_round(off, 0, 3) == 2  # the text leaves the target's path: the round ends there


def test_tree_round_covers_second_choices_while_the_budget_lasts() -> None:
    text = (pos(1), pos(2, UNSURE), pos(1), pos(1))
    assert chain_round(text, 0, 4) == 1
    assert tree_round(text, 0, size=8, depth=8) == 4  # the uncertain sibling fits in 7 nodes
    assert tree_round(text, 0, size=3, depth=8) == 1  # two path nodes and a likelier sibling do not fit
    assert tree_round(text, 0, size=8, depth=2) == 2
    assert tree_round((pos(0),), 0, size=8, depth=8) == 0


def test_simulate_walks_each_text_to_its_end() -> None:
    text = tuple(pos(1) for _ in range(12))
    assert simulate((text,), lambda t, i: chain_round(t, i, 4)) == [4, 4, 2]  # 5 + 5 + 2 positions


def _profile(accept: int = 1, draft_s: float = 0.01, grouped: float = 2.0) -> PairProfile:
    target = Costs(rows=(1, 8, 16), seconds=(0.100, 0.110, 0.160))
    draft = Costs(rows=(1, 8), seconds=(draft_s, draft_s * 1.2))
    text = tuple(pos(accept) for _ in range(60))
    d = DraftProfile(weights="int8", alone=draft, grouped=draft.scaled(grouped), texts=(text,))
    return PairProfile(device="cpu", cores=2, target_cores=1, devices=0, target_bytes=3_000_000_000,
                       draft_bytes={"int8": 500_000_000}, target_alone=target,
                       target_grouped=target.scaled(grouped), drafts=(d,), seconds=12.0)


def _decide(profile: PairProfile, config: EngineConfig = EngineConfig()) -> Decision:
    return choose(profile, config, cached=True)


def test_a_good_draft_picks_speculation_and_a_bad_one_ar() -> None:
    good = _decide(_profile(accept=1))
    assert good.choice.mode in ("tree", "chain") and good.speedup(good.choice) > 2
    assert good.config.tree.fallback  # and each request drafts only while drafting pays
    bad = _decide(_profile(accept=0))
    assert bad.choice.mode == "ar"
    assert bad.line().startswith("auto: ar: fastest here; ")


def test_the_line_names_the_choice_and_why_async_loses() -> None:
    d = _decide(_profile())
    line = d.line()
    assert "\n" not in line and line.startswith(f"auto: {d.choice.mode} (int8 draft): ")
    assert "async" in line and "its target verifies on 1 of 2 cores" in line and "[cached profile" in line


def test_bus_slowdown() -> None:
    p = _profile()
    d = p.drafts[0]
    assert bus_slowdown(p, d, 0.2, 0.02) >= 1.0
    alone = dataclasses.replace(p, device="cuda", devices=2)
    assert bus_slowdown(alone, d, 0.2, 0.02) == 1.0


def test_candidates_narrow_the_prediction() -> None:
    config = EngineConfig(auto=AutoConfig(modes=("chain",)))
    assert {p.mode for p in predictions(_profile(), config)} == {"chain"}
    with pytest.raises(ConfigError):
        AutoConfig(modes=())


def _args(*argv: str):
    return build_parser().parse_args(["generate", "x", "--device", "cpu", *argv])


def test_flags_narrow_auto() -> None:
    assert auto_candidates(_args()) == ("ar", "chain", "tree", "async")
    assert auto_candidates(_args("--draft-model", "d", "--draft-weights", "int4")) == ("ar", "chain", "tree", "async")
    assert auto_candidates(_args("--width", "4")) == ("tree", "async")
    assert auto_candidates(_args("--no-adaptive")) == ("tree",)
    assert auto_candidates(_args("--target-tp", "2")) == ("async",)
    with pytest.raises(ConfigError, match="flags --chain-length, --draft-cores apply to no common mode"):
        auto_candidates(_args("--chain-length", "3", "--draft-cores", "1"))
    config = engine_config_from_args(_args("--draft-weights", "int4", "--depth", "3"))
    assert config.mode == "auto" and config.auto.modes == ("tree", "async") and not config.auto.choose_draft_weights
    assert config.tree.depth == 3 and config.draft_load.weights == "int4"


@pytest.mark.parametrize("argv", [("--mode", "ar", "--draft-model", "d"), ("--mode", "tree", "--chain-length", "3"),
                                  ("--mode", "chain", "--target-tp", "2"), ("--mode", "async", "--no-adaptive"),
                                  ("--mode", "async", "--fallback")])
def test_an_explicit_mode_refuses_flags_it_would_ignore(argv) -> None:
    with pytest.raises(ConfigError) as err:
        engine_config_from_args(_args(*argv))
    assert "would ignore it" in str(err.value) and "\n" not in str(err.value)


def test_fallback_is_a_serial_switch_that_auto_always_sets() -> None:
    assert engine_config_from_args(_args("--mode", "tree", "--fallback")).tree.fallback is True
    assert engine_config_from_args(_args("--fallback")).auto.modes == ("chain", "tree")  # it narrows auto
    with pytest.raises(ConfigError, match="auto always decodes plainly"):
        engine_config_from_args(_args("--no-fallback"))


def test_switches_are_booleans() -> None:
    config = engine_config_from_args(_args("--mode", "tree", "--no-adaptive", "--adaptive-verify", "--no-lookup"))
    assert config.tree.adaptive is False and config.tree.adaptive_verify is True and config.tree.lookup is False
    with pytest.raises(ConfigError):
        TreeConfig(adaptive=0)


def test_defaults_are_auto_and_cpu() -> None:
    config = engine_config_from_args(_args())
    assert config.mode == "auto" and config.tree == TreeConfig() and config.draft == EngineConfig().draft
    assert engine_config_from_args(_args("--mode", "tree", "--width", "4")).tree.width == 4


def test_profile_cache_round_trip(tmp_cache, tiny_qwen_dir, tiny_draft_dir) -> None:
    config = EngineConfig(target=str(tiny_qwen_dir), draft=str(tiny_draft_dir))
    key = store.profile_key(config, ("bf16",))
    assert store.load(key) is None
    store.save(key, _profile())
    assert store.load(key) == _profile()
    assert store.profile_path(key).parent == tmp_cache / "auto"
    other = store.profile_key(dataclasses.replace(config, draft_vocab=0), ("bf16",))
    assert other.digest() != key.digest() and store.load(other) is None
    assert str(tiny_qwen_dir) in key.target


def test_a_profile_taken_while_other_work_ran_is_not_kept(monkeypatch, tmp_path) -> None:
    """All cores slower than one core's share means other processes competed: such a profile
    decides this start only, says so, and is not cached."""
    from swiftspec.engines.auto import choose as choose_mod
    from swiftspec.engines.auto import store

    quiet, busy = _profile(), _profile(grouped=0.5)  # busy: the 2-core forward ran 2x the 1-core one
    assert not quiet.disturbed and busy.disturbed
    saved = []
    monkeypatch.setattr(store, "load", lambda key: None)
    monkeypatch.setattr(store, "save", lambda key, profile: saved.append(profile))
    monkeypatch.setattr("swiftspec.engines.auto.choose.resolve_source", lambda source: tmp_path)  # pulls nothing
    monkeypatch.setattr("swiftspec.engines.auto.choose.profile_pair", lambda config, formats: busy)
    decision = choose_mod.decide(EngineConfig(mode="auto"))
    assert saved == [] and "not cached: other work slowed it" in decision.line()
    monkeypatch.setattr("swiftspec.engines.auto.choose.profile_pair", lambda config, formats: quiet)
    assert "cached;" in choose_mod.decide(EngineConfig(mode="auto")).line() and saved == [quiet]


def test_bench_auto_entry_compares_plain_modes_in_the_default_target_format() -> None:
    """The bench's auto line: a mode without @weights runs the target's default format (gguf for a
    GGUF target on the CPU), so `auto` is compared with those modes, not with bf16 ones."""
    from types import SimpleNamespace

    from swiftspec.bench.auto_report import auto_entries
    from swiftspec.bench.harness import ModeSpec

    decision = SimpleNamespace(config=SimpleNamespace(target_load=SimpleNamespace(weights="gguf")),
                               choice=SimpleNamespace(mode="tree", draft_weights="int4"), best_per_mode=[],
                               line=lambda: "tree")
    specs = [ModeSpec("auto", "ours", "tree"), ModeSpec("ar", "ours", "ar"), ModeSpec("tree@int4", "ours", "tree", "int4")]
    modes = {name: {"tokens_per_s": {"mean": speed}} for name, speed in (("auto", 20.0), ("ar", 25.0), ("tree@int4", 40.0))}
    entry = auto_entries({"auto": decision}, specs, modes, "gguf")["auto"]
    assert entry["measured_best"] == "ar" and entry["choice_of_best"] == pytest.approx(0.8)


def test_both_models_are_pulled_before_the_profile_starts(monkeypatch, tmp_path) -> None:
    """A first start downloads the pair before profiling it: the profile's time, which the line
    reports, holds no download."""
    from swiftspec.engines.auto import choose as choose_mod
    from swiftspec.engines.auto import store

    events = []
    monkeypatch.setattr(store, "load", lambda key: None)
    monkeypatch.setattr(store, "save", lambda key, profile: None)
    monkeypatch.setattr("swiftspec.engines.auto.choose.resolve_source", lambda source: events.append(source) or tmp_path)
    monkeypatch.setattr("swiftspec.engines.auto.choose.profile_pair",
                        lambda config, formats: events.append("profile") or _profile())
    config = EngineConfig(mode="auto")
    choose_mod.decide(config)
    assert events == [config.target, config.draft, "profile"]
