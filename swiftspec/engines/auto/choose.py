"""`--mode auto`: the engine and draft weight format predicted fastest for this machine and pair,
from the cached profile (or a fresh one), with the one line that says what was chosen and why."""

from __future__ import annotations

import dataclasses
import sys

from swiftspec.config import NO_DRAFT, EngineConfig, TreeConfig, chain_config, require_settled
from swiftspec.engines.auto import store
from swiftspec.engines.auto.predict import (
    Calibration,
    DraftProfile,
    PairProfile,
    Prediction,
    predict_ar,
    predict_async,
    predict_chain,
    predict_tree,
)
from swiftspec.engines.auto.profile import profile_pair
from swiftspec.engines.startup import StartupProfile, async_depth, deepest_depth, serial_depth
from swiftspec.kernels import cpu_ext
from swiftspec.weights.source import resolve_source


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """The chosen engine and what the profile predicted for every candidate."""

    config: EngineConfig  # the chosen engine's config, ready for build_engine
    choice: Prediction
    ar: Prediction  # the reference every speed-up is relative to
    best_per_mode: tuple[Prediction, ...]  # each candidate mode with its best draft format
    async_own_devices: Prediction | None  # async as if each group had its own devices and memory
    profile: PairProfile
    cached: bool
    startup: StartupProfile | None  # the chosen engine's start-up profile, read from `profile` (None: ar)

    def speedup(self, p: Prediction) -> float:
        return p.tokens_per_s / self.ar.tokens_per_s

    def _async_note(self, p: Prediction) -> str:
        """Why async runs slower here than its overlap promises (empty when it does not)."""
        if p.slowdown <= 1.05:
            return ""
        if self.profile.device == "cuda":
            return ": both groups share one GPU"
        cores = self.profile.cores
        split = f"{self.profile.target_cores} of {cores} cores" if cores > 1 else "one core"
        bus = f" and both groups share one memory bus (+{100 * (p.bus - 1):.0f}%)" if p.bus > 1.02 else ""
        return f": its target verifies on {split}{bus}, {p.slowdown:.1f}x the serial verify time"

    def line(self) -> str:
        """`auto: tree (int8 draft): 2.7x ar here; chain 2.4x; async 0.7x: ... [profiled in 14 s]`."""
        c = self.choice
        head = f"auto: {c.label}: " + ("fastest here" if c.mode == "ar" else f"{self.speedup(c):.1f}x ar here")
        rest = [f"{p.mode} {self.speedup(p):.1f}x" + (self._async_note(p) if p.mode == "async" else "")
                for p in self.best_per_mode if p.mode not in (c.mode, "ar")]
        how = "cached profile" if self.cached else f"profiled in {self.profile.seconds:.0f} s, " + (
            "not cached: other work slowed it" if self.profile.disturbed else "cached")
        return "; ".join([head] + rest) + f" [{how}; --reprofile measures again]"

    def async_needs(self) -> str:
        """What async would need to beat the choice here, in one line."""
        own, asy = self.async_own_devices, next((p for p in self.best_per_mode if p.mode == "async"), None)
        if own is None or asy is None:
            return "async was not a candidate here, so the profile says nothing about it"
        if asy is self.choice:
            return ("the profile predicted async fastest here; when a run disagrees, the machine's load has "
                    "changed since it was profiled: --reprofile measures again")
        best = f"{self.choice.label}'s {self.speedup(self.choice):.1f}x ar"
        if own.tokens_per_s > self.choice.tokens_per_s:
            return (f"async needs its own devices or separate memory to win: here its target verifies "
                    f"{asy.slowdown:.1f}x as long as the serial engines'; with each group on its own it would "
                    f"reach ~{self.speedup(own):.1f}x ar against {best}")
        return (f"async would lose even with its own devices (~{self.speedup(own):.1f}x ar against {best}): "
                "drafting costs too little here next to verification for hiding it to repay async's "
                "rendezvous and its tree grown before the verified branch is known")


CPU_DRAFT_FORMATS = ("int8", "int4")


def draft_formats(config: EngineConfig) -> tuple[str, ...]:
    """Draft weight formats to profile: on CPU with the C++ kernels and bf16 activations, int4 beside a
    4-bit target (gguf, int4) and int8 and int4 beside a wider one (the draft's precision never
    changes the output; a bf16 draft accepts no more than an int8 one and reads twice the bytes:
    engines.defaults.default_draft_weights), else the configured one."""
    if not config.auto.choose_draft_weights:
        return (config.draft_load.weights,)
    load = config.draft_load
    if not load.device.startswith("cpu") or load.dtype != "bfloat16":
        return (load.weights,)

    if cpu_ext.load() is None:
        return (load.weights,)
    # Beside a 4-bit target an int8 draft reads as many bytes per forward as a third of the target's,
    # and lost every bench where auto chose it (0.87x the int4 draft's tree on an AVX-512 host,
    # issue 35); profiling it cost half of the first start.
    return ("int4",) if config.target_load.weights in ("gguf", "int4") else CPU_DRAFT_FORMATS


def predictions(profile: PairProfile, config: EngineConfig, cal: Calibration = Calibration()) -> list[Prediction]:
    """Every candidate engine with every profiled draft format."""
    tree, modes = config.tree, config.auto.modes
    out = [predict_ar(profile)] if "ar" in modes else []
    for draft in profile.drafts:
        if "chain" in modes:
            out.append(predict_chain(profile, draft, tree, cal))
        if "tree" in modes:
            out.append(predict_tree(profile, draft, tree, tree_depth(profile, draft, tree), cal))
        if "async" in modes:
            out.append(predict_async(profile, draft, tree, cal))
    return out


def tree_depth(profile: PairProfile, draft: DraftProfile, tree: TreeConfig) -> int:
    """The serial tree's d, by the rules its own start-up profile follows (engines/startup.py)."""
    if tree.depth or tree.adaptive:
        return tree.depth or deepest_depth(tree.verify_size)
    t_verify, t_expand = profile.target_alone.at(tree.verify_size), draft.alone.at(tree.width)
    return serial_depth(t_verify, t_expand, tree.verify_size)


def startup_profile(profile: PairProfile, config: EngineConfig) -> StartupProfile | None:
    """The start-up profile of the engine `config` names (mode and draft format chosen), read from
    the pair profile by the rules the engine's own would follow (engines/startup.py), so that the
    engine measures nothing again: d, and the seconds to verify 1..bs nodes on the target's cores
    (the forward costs; the engine's running costs scale them to what its rounds measure)."""
    tree = chain_config(config.tree) if config.mode == "chain" else config.tree
    draft = next((d for d in profile.drafts if d.weights == config.draft_load.weights), None)
    if config.mode == "ar" or draft is None:
        return None
    sizes = range(1, tree.verify_size + 1)
    if config.mode == "async":
        target, t_draft = profile.target_grouped, draft.grouped.at(tree.width)
        depth = tree.depth or async_depth(target.at(tree.verify_size), t_draft)
    else:
        target, t_draft = profile.target_alone, draft.alone.at(tree.width)
        depth = tree_depth(profile, draft, tree)
    timed = tree.adaptive_verify and (tree.adaptive or config.mode == "async")
    return StartupProfile(depth=depth, t_target_s=target.at(tree.verify_size), t_draft_s=t_draft,
                          verify_s=tuple(target.at(n) for n in sizes) if timed else ())


def decide(config: EngineConfig, cal: Calibration = Calibration()) -> Decision:
    """Profile (or read the cached profile) and choose; config.mode is replaced by the choice.
    config: settled by engines.defaults.resolve_defaults."""
    require_settled(config)
    formats = draft_formats(config)
    key = store.profile_key(config, formats)
    profile = None if config.auto.reprofile else store.load(key)
    cached = profile is not None
    if profile is None:
        for source in (config.target, config.draft):  # pulled first: a download is no part of the profile
            if source != NO_DRAFT:
                resolve_source(source)
        print("[swiftspec] auto: profiling this machine and model pair once (cached afterwards)", file=sys.stderr)
        profile = profile_pair(config, formats)
        if not profile.disturbed:  # a profile of a busy moment is used once, then measured again
            store.save(key, profile)
    return choose(profile, config, cached, cal)


def choose(profile: PairProfile, config: EngineConfig, cached: bool, cal: Calibration = Calibration()) -> Decision:
    """The candidate predicted fastest (each mode with its best draft format)."""
    best: dict[str, Prediction] = {}
    for p in predictions(profile, config, cal):
        if p.mode not in best or p.tokens_per_s > best[p.mode].tokens_per_s:
            best[p.mode] = p
    choice = max(best.values(), key=lambda p: p.tokens_per_s)
    weights = choice.draft_weights or config.draft_load.weights
    serial = choice.mode in ("tree", "chain")  # a request its drafting slows decodes plainly (speculate/fallback.py)
    chosen = dataclasses.replace(config, mode=choice.mode, tree=dataclasses.replace(config.tree, fallback=serial),
                                 draft_load=dataclasses.replace(config.draft_load, weights=weights))
    own = None
    if "async" in best:
        draft = next(d for d in profile.drafts if d.weights == best["async"].draft_weights)
        own = predict_async(profile, draft, config.tree, cal, own_devices=True)
    return Decision(config=chosen, choice=choice, ar=predict_ar(profile), best_per_mode=tuple(best.values()),
                    async_own_devices=own, profile=profile, cached=cached, startup=startup_profile(profile, chosen))
