"""The default `--device`: CPU unless the CUDA path is known to work on this machine.

"Known to work" means that a start-up check passed here: a tiny random model pair, built in a
temporary directory, decodes 16 tokens greedily with the serial tree engine on CUDA and gives
exactly the tokens it gives on CPU (float32, so no near-tie can differ).  That runs the CUDA
path end to end: the model, tree attention (Triton when importable), verification and the KV
commit.  The verdict is cached per GPU, CUDA and torch build and swiftspec version under
<cache>/device/, so only the first start pays for it; a failed check says why, once, on stderr.
`--device cuda` skips the check, and SWIFTSPEC_CUDA=0 keeps the default on CPU.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

import swiftspec
from swiftspec.config import EngineConfig, LoadConfig, TreeConfig
from swiftspec.engines import build_engine
from swiftspec.sampling import SamplingParams
from swiftspec.weights.bundled import cache_dir

CUDA_ENV = "SWIFTSPEC_CUDA"
CHECK_TOKENS = 16


def default_device() -> str:
    """"cuda" when CUDA is available and its check passed (now or at an earlier start), else "cpu"."""
    if os.environ.get(CUDA_ENV) == "0" or not torch.cuda.is_available():
        return "cpu"
    path = _verdict_path()
    try:
        verdict = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        verdict = _check_and_record(path)
    if not verdict.get("ok"):
        print(f"[swiftspec] using the CPU: the CUDA check failed here ({verdict.get('reason')}); "
              f"--device cuda forces CUDA, delete {path} to check again", file=sys.stderr)
        return "cpu"
    return "cuda"


def _verdict_path() -> Path:
    ident = f"{torch.cuda.get_device_name(0)}|{torch.version.cuda}|{torch.__version__}|{swiftspec.__version__}"
    return cache_dir() / "device" / f"cuda-{hashlib.sha1(ident.encode()).hexdigest()[:12]}.json"


def _check_and_record(path: Path) -> dict:
    print("[swiftspec] checking the CUDA path once (a tiny model on CUDA against the CPU)", file=sys.stderr)
    try:
        cpu, cuda = (greedy_tokens(device) for device in ("cpu", "cuda"))
        verdict = {"ok": cpu == cuda, "reason": "" if cpu == cuda else "CUDA decoded other tokens than the CPU"}
    except Exception as e:  # any failure of the CUDA stack means "not known to work"
        verdict = {"ok": False, "reason": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(verdict))
    return verdict


def greedy_tokens(device: str) -> list[int]:
    """CHECK_TOKENS greedy tokens of the serial tree engine on a tiny random pair, on `device`."""
    # imported here: the tiny models write GGUF files too, and a GPU machine's image may lack gguf
    from swiftspec.testing.tiny import make_perturbed_draft, make_tiny_checkpoint

    with tempfile.TemporaryDirectory(prefix="swiftspec-check-") as tmp:
        target = make_tiny_checkpoint(Path(tmp) / "target")
        draft = make_perturbed_draft(target, Path(tmp) / "draft")
        load = LoadConfig(device=device, dtype="float32", max_seq_len=128)
        engine = build_engine(EngineConfig(mode="tree", target=str(target), draft=str(draft), target_load=load,
                                           draft_load=load, tree=TreeConfig(depth=2, budget=96, adaptive=False)))
        try:
            prompt = engine.tokenizer.encode("def add(a, b):")
            return [t for chunk in engine.generate(prompt, SamplingParams(), CHECK_TOKENS) for t in chunk]
        finally:
            engine.close()
