"""The `--mode auto` cache: one profile per machine and model pair, as JSON under <cache>/auto/.

The key holds what changes the measurements: the ISA level the kernels run (or the GPU), the
threads, the device, dtype and weight formats, each model's identity (a bundled model's sha256,
else its files' paths, sizes and modification times) and the engine and profile versions.  Tree
settings are not in it: the prediction is recomputed from the cached measurements every start.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import torch

import swiftspec
from swiftspec.config import EngineConfig
from swiftspec.engines.auto.predict import Costs, DraftProfile, PairProfile, Position
from swiftspec.kernels import cpu_ext
from swiftspec.weights.bundled import BUNDLED, cache_dir
from swiftspec.weights.source import resolve_source

PROFILE_VERSION = 1  # bump when what a profile measures, or how, changes


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProfileKey:
    """What a cached profile is valid for."""

    isa: str
    threads: int
    draft_cores: int
    device: str
    dtype: str
    target_weights: str
    draft_weights: tuple[str, ...]  # the draft formats profiled
    draft_vocab: int
    target: str  # model identities (model_identity)
    draft: str
    version: str

    def digest(self) -> str:
        text = json.dumps(dataclasses.asdict(self), sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:16]


def model_identity(source: str) -> str:
    """A bundled model's sha256, else the resolved files' paths, sizes and modification times."""
    if source in BUNDLED:
        return f"{source} sha256:{BUNDLED[source].sha256}"
    path = resolve_source(source).resolve()
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.suffix in (".json", ".safetensors"))
    return ";".join(f"{p} {p.stat().st_size} {p.stat().st_mtime_ns}" for p in files)


def _machine(device: str) -> str:
    if device.startswith("cuda"):
        return f"cuda:{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"

    return f"cpu:{cpu_ext.isa() if cpu_ext.load() is not None else 'torch'}"


def profile_key(config: EngineConfig, draft_formats: tuple[str, ...]) -> ProfileKey:
    load = config.target_load
    return ProfileKey(isa=_machine(load.device), threads=torch.get_num_threads(), draft_cores=config.draft_cores,
                      device=load.device, dtype=load.dtype, target_weights=load.weights,
                      draft_weights=draft_formats, draft_vocab=config.draft_vocab,
                      target=model_identity(config.target), draft=model_identity(config.draft),
                      version=f"{swiftspec.__version__}/{PROFILE_VERSION}")


def profile_path(key: ProfileKey) -> Path:
    return cache_dir() / "auto" / f"{key.digest()}.json"


def load(key: ProfileKey) -> PairProfile | None:
    """The cached profile for key; None when there is none (or it cannot be read)."""
    path = profile_path(key)
    try:
        return profile_from_json(json.loads(path.read_text())["profile"])
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


def save(key: ProfileKey, profile: PairProfile) -> Path:
    path = profile_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"key": dataclasses.asdict(key), "profile": dataclasses.asdict(profile)}))
    tmp.replace(path)
    return path


def _costs(d: dict) -> Costs:
    return Costs(rows=tuple(d["rows"]), seconds=tuple(d["seconds"]))


def profile_from_json(d: dict) -> PairProfile:
    drafts = tuple(
        DraftProfile(weights=x["weights"], alone=_costs(x["alone"]), grouped=_costs(x["grouped"]),
                     texts=tuple(tuple(Position(on_path=p["on_path"], rank=p["rank"], logprobs=tuple(p["logprobs"]))
                                       for p in text) for text in x["texts"]))
        for x in d["drafts"])
    return PairProfile(device=d["device"], cores=d["cores"], target_cores=d["target_cores"], devices=d["devices"],
                       target_bytes=d["target_bytes"], draft_bytes=dict(d["draft_bytes"]),
                       target_alone=_costs(d["target_alone"]), target_grouped=_costs(d["target_grouped"]),
                       drafts=drafts, seconds=d["seconds"])
