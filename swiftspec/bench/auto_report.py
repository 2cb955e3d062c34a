"""The bench's view of `--mode auto`: resolves `auto` modes to the engine auto chooses, and reports
the choice beside the fastest measured mode, so that a wrong choice is visible."""

from __future__ import annotations

import dataclasses
import sys

from swiftspec.bench.harness import ModeSpec
from swiftspec.bench.runners import mode_config
from swiftspec.config import AUTO, EngineConfig
from swiftspec.engines.auto.choose import decide


def decide_for(base: EngineConfig, spec: ModeSpec, draft_weights: str | None):  # -> Decision

    decision = decide(mode_config(base, dataclasses.replace(spec, variant=AUTO), draft_weights))
    print(f"bench: {spec.name}: {decision.line()}", file=sys.stderr)
    return decision


def resolve(specs: list[ModeSpec], base: EngineConfig, draft_weights: str | None) -> tuple[list[ModeSpec], dict]:
    """specs with every `auto` mode replaced by auto's choice (same name), and the decisions by
    name; the plain target weights get a decision even when no `auto` mode is benched, for the
    report (key "auto"), as long as one of our modes is."""
    decisions = {}
    out = []
    for spec in specs:
        if spec.kind == "ours" and spec.variant == AUTO:
            d = decisions[spec.name] = decide_for(base, spec, draft_weights)
            spec = dataclasses.replace(spec, variant=d.config.mode, draft_weights=d.config.draft_load.weights)
        out.append(spec)
    plain = [s for s in specs if s.kind == "ours" and s.variant == AUTO and not s.weights]
    if not plain and any(s.kind == "ours" for s in specs):
        decisions[AUTO] = decide_for(base, ModeSpec(AUTO, "ours", AUTO), draft_weights)
    return out, decisions


def auto_entries(decisions: dict, specs: list[ModeSpec], modes: dict[str, dict], plain_weights: str) -> dict[str, dict]:
    """Per decision: the choice, its line, predicted and measured speeds, and how the choice (the
    `auto` mode when benched, else the measured mode of the same engine and target weights)
    compares with the fastest measured mode of those target weights (plain_weights: what a mode
    without @weights runs, the target's default format)."""
    out = {}
    for name, d in decisions.items():
        target_weights = d.config.target_load.weights
        same = {s.name: modes[s.name]["tokens_per_s"]["mean"] for s in specs
                if s.kind == "ours" and s.name in modes and (s.weights or plain_weights) == target_weights}
        measured_choice = name if name in same else next(
            (s.name for s in specs if s.name in same and s.variant == d.choice.mode and s.name not in decisions), None)
        best = max(same, key=same.get) if same else None
        ratio = same[measured_choice] / same[best] if measured_choice and best and same[best] > 0 else None
        out[name] = {"choice": d.choice.mode, "draft_weights": d.choice.draft_weights, "line": d.line(),
                     "predicted_tokens_per_s": {p.label: p.tokens_per_s for p in d.best_per_mode},
                     "measured_choice": measured_choice, "measured_best": best, "choice_of_best": ratio}
    return out


def markdown_lines(entries: dict[str, dict]) -> list[str]:
    lines = []
    for name, e in entries.items():
        choice = e["choice"] + (f" ({e['draft_weights']} draft)" if e["draft_weights"] else "")
        if e["choice_of_best"] is None:
            verdict = "not measured here (bench its mode, or `auto`, to compare)"
        else:
            verdict = (f"measured as `{e['measured_choice']}` at {100 * e['choice_of_best']:.0f}% of the fastest "
                       f"measured mode (`{e['measured_best']}`)")
        lines.append(f"- `{name}` chose **{choice}**: {verdict}. Its line: `{e['line']}`")
    return ["", "Auto choice:"] + lines if lines else []
