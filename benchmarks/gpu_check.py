"""Offline GPU check of SwiftSpec's CUDA path: proves it runs and measures it on a lent device with
no network and no model files (benchmarks/gpu_check.sh runs it; docs/bench/gpu-check.md).

Steps, in the order that makes a short run yield the most; each is guarded (a failure prints one
line and the next step runs) and the results are rewritten after every step:
  1. `pytest -m gpu tests/gpu` (Triton kernels against their references, CUDA graphs);
  2. per-forward latency of target and draft at 1 and 8 rows, CUDA graphs on and off, and the
     floor of one tiny op (CUDA events);
  3. ar, chain, tree and async tok/s MEASURED on a random pair of the default pair's exact shapes,
     and PREDICTED tok/s from the measured rounds/s and the real pair's CPU acceptance lengths;
  4. how both groups can share one GPU: two processes alone and together, again under MPS if its
     daemon starts, stream priorities and green contexts detected;
  5. tree against async on the CPU cores with disjoint core sets (8+8, 12+4), int4 weights.
`--device cpu --tiny` rehearses every step that makes sense on a CPU with a tiny random pair.
Assumes only torch (and Triton on CUDA) besides the repository on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from gpu_forward import forward_latency, op_floor
from gpu_modes import ModeSetup, Workload, acceptance_table, cpu_split_step, modes_step, release
from gpu_pair import DEFAULT_PAIR, TINY_PAIR, Placement, random_target
from gpu_share import LoopJob, stream_features, two_processes, with_mps

REPO = Path(__file__).resolve().parent.parent
STEPS = {"1": "pytest -m gpu tests/gpu", "2": "per-forward latency and the launch floor",
         "3": "ar, chain, tree, async: measured on the random pair, predicted with CPU acceptance",
         "4": "sharing one GPU between the two groups", "5": "tree vs async on disjoint CPU core sets (int4)"}
PYTEST_TIMEOUT_S = 300
ACCEPTANCE_NOTE = ("predicted tok/s = measured rounds/s on the random pair x the acceptance length of the same "
                   "mode with the real pair on the CPU (HumanEval, greedy), from {report}")


class Skipped(Exception):
    """A step or measurement that does not apply here (one line says why)."""


@dataclass(slots=True)
class Report:
    """Everything measured so far; written out (JSON + Markdown) after every step."""

    out: Path
    deadline: float  # time.monotonic() after which no new step or measurement starts
    data: dict = field(default_factory=dict)

    def guard(self, name: str, fn: Callable[[], dict], show: bool = True) -> dict:
        """fn() or, when it fails or time is up, {"error"/"skipped": one line}; printed (the result
        itself only if show)."""
        if time.monotonic() > self.deadline:
            print(f"  {name}: skipped (out of the time budget)", flush=True)
            return {"skipped": "out of the time budget"}
        try:
            result = fn()
        except Skipped as why:
            print(f"  {name}: skipped ({why})", flush=True)
            return {"skipped": str(why)}
        except Exception as exc:  # noqa: BLE001 - every failure is one line and the run goes on
            line = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"
            print(f"  {name}: FAILED {line}", flush=True)
            return {"error": line}
        if show:
            print(f"  {name}: {json.dumps(result, default=_short)}", flush=True)
        return result

    def step(self, key: str, fn: Callable[[], dict]) -> None:
        print(f"== step {key}: {STEPS[key]}", flush=True)
        start = time.perf_counter()
        result = self.guard(f"step {key}", fn, show=False)
        seconds = round(time.perf_counter() - start, 1)
        self.data.setdefault("steps", {})[key] = {"title": STEPS[key], **result, "seconds": seconds}
        print(f"  step {key}: {seconds} s", flush=True)
        self.write()

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "gpu_check.json").write_text(json.dumps(self.data, indent=1, default=_short) + "\n")
        (self.out / "gpu_check.md").write_text(markdown(self.data))


def _short(value: object) -> object:
    return round(value, 3) if isinstance(value, float) else str(value)


def environment(device: str) -> dict:
    """Device, driver and versions (the driver from nvidia-smi where it is installed)."""
    env = {"device": device, "python": platform.python_version(), "torch": torch.__version__,
           "cuda (torch build)": torch.version.cuda, "cpu cores": len(os.sched_getaffinity(0)),
           "platform": platform.platform()}
    try:
        from importlib.metadata import version

        env["triton"] = version("triton")
    except Exception:  # noqa: BLE001 - not installed
        env["triton"] = None
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name()
        env["gpu memory GiB"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]
        env["driver (nvidia-smi)"] = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.strip()
    return env


def gpu_tests(opts: argparse.Namespace) -> dict:
    """Step 1 in a subprocess, with no conftest: tests/conftest.py imports the GGUF side of
    swiftspec.weights (gguf is not installed there), and tests/gpu needs none of its fixtures."""
    if not opts.device.startswith("cuda"):
        raise Skipped("the GPU tests need CUDA (--device cuda)")
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-rs", "-p", "no:cacheprovider",
           "--noconftest", "tests/gpu"]
    try:
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=PYTEST_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"pytest did not finish within {PYTEST_TIMEOUT_S} s") from None
    log = done.stdout + done.stderr
    (opts.out / "gpu_tests.txt").write_text(log)
    lines = [ln for ln in log.splitlines() if ln.strip()]
    return {"exit code": done.returncode, "summary": lines[-1] if lines else "", "log": "gpu_tests.txt"}


def latency(opts: argparse.Namespace, report: Report) -> dict:
    """Step 2: each model's forwards, then the op floor."""
    rows = [int(r) for r in opts.rows.split(",")]
    out = {}
    for role in ("target", "draft"):
        model = random_target(getattr(opts.shapes, role), Placement(device=opts.device, seed=opts.seed))
        out[f"{role} ms"] = report.guard(f"{role} forwards", lambda: forward_latency(model, rows, opts.prefix,
                                                                                     opts.iters))
        del model
        release()
    out["floor"] = report.guard("floor", lambda: op_floor(opts.device, opts.iters))
    out["note"] = (f"one forward of T chained tokens after a {opts.prefix}-token prefix, LM head over the full "
                   "vocabulary; median of CUDA-event times" if opts.device.startswith("cuda") else
                   f"one forward of T chained tokens after a {opts.prefix}-token prefix; median perf_counter time")
    return out


def sharing(opts: argparse.Namespace, report: Report) -> dict:
    """Step 4: two processes (target verifying bs rows, draft expanding w rows), then MPS, then the
    stream features."""
    cores = len(os.sched_getaffinity(0))
    place = Placement(device=opts.device, seed=opts.seed)
    jobs = [LoopJob(role=role, shapes=opts.shapes, place=place, rows=8, prefix=opts.prefix, window_s=opts.window,
                    threads=max(1, cores // 2)) for role in ("target", "draft")]
    cuda = opts.device.startswith("cuda")
    out = {"two processes": report.guard("two processes", lambda: two_processes(jobs))}
    out["two processes under MPS"] = report.guard("MPS", lambda: with_mps(jobs) if cuda else _skip("MPS is CUDA's"))
    out["stream features"] = report.guard("streams", lambda: stream_features() if cuda else _skip("CUDA streams"))
    return out


def _skip(what: str) -> dict:
    raise Skipped(f"{what}: GPU only")


def cpu_splits(opts: argparse.Namespace, report: Report, table: dict[str, float]) -> dict:
    """Step 5, once the C++ CPU kernels are built (int4 without them would time the torch reference)."""
    from swiftspec.kernels import cpu_ext

    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        built = cpu_ext.load() is not None
    if not built:
        why = caught[0].message if caught else "no reason given"
        raise Skipped(f"the C++ CPU kernels could not be built here ({why})")
    print(f"  C++ CPU kernels ready in {time.perf_counter() - start:.1f} s ({cpu_ext.isa()})", flush=True)
    setup = ModeSetup(shapes=opts.shapes, place=Placement(device="cpu", weights="int4", seed=opts.seed),
                      depth=opts.depth, max_seq_len=opts.max_seq_len, draft_vocab=opts.draft_vocab)
    work = Workload(prompts=opts.prompts, prompt_len=opts.prompt_len, tokens=opts.cpu_tokens, seed=opts.seed)
    splits = [tuple(int(n) for n in s.split("+")) for s in opts.splits.split(",")]
    return cpu_split_step(setup, work, splits, table, report.guard)


def imported_packages() -> list[str]:
    """Top-level names of the non-standard-library modules this process imported (not the bench's own)."""
    own = {p.stem for p in Path(__file__).parent.glob("*.py")}
    names = {name.split(".")[0] for name in list(sys.modules)}
    return sorted(n for n in names if n not in sys.stdlib_module_names and n not in own
                  and not n.startswith("_") and n not in ("__main__", "__mp_main__"))


def markdown(data: dict) -> str:
    """The report as Markdown: the environment, then one table per step (rows of a nested dict)."""
    lines = ["# SwiftSpec GPU check", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {_cell(v)} |" for k, v in data.get("environment", {}).items()]
    lines += ["", data.get("note", ""), ""]
    for key, step in data.get("steps", {}).items():
        lines += [f"## Step {key}: {step['title']} ({step['seconds']} s)", ""]
        flat = {k: v for k, v in step.items() if not isinstance(v, dict) and k not in ("title", "seconds")}
        lines += [f"- {k}: {_cell(v)}" for k, v in flat.items()]
        for name, table in ((k, v) for k, v in step.items() if isinstance(v, dict)):
            lines += ["", f"**{name}**", ""] + _table(table)
        lines.append("")
    lines += ["Packages imported by the driver: " + ", ".join(data.get("imported packages", [])), ""]
    return "\n".join(lines)


def _table(table: dict) -> list[str]:
    """Rows of dicts as one table (columns: the union of their keys), else a two-column table."""
    if table and all(isinstance(v, dict) for v in table.values()):
        cols = list(dict.fromkeys(c for row in table.values() for c in row))
        rows = [f"| {name} | " + " | ".join(_cell(row.get(c, "")) for c in cols) + " |" for name, row in table.items()]
        return ["| | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)] + rows
    return ["| | |", "|---|---|"] + [f"| {k} | {_cell(v)} |" for k, v in table.items()]


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value).replace("|", "/").replace("\n", " ")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", default="1,2,3,4,5", help="which steps to run, e.g. 2,3")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu_out"))
    ap.add_argument("--tiny", action="store_true", help="a tiny random pair (the CPU rehearsal)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="start no step or measurement after this")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rows", default="1,8", help="step 2: rows per forward")
    ap.add_argument("--prefix", type=int, default=256, help="steps 2 and 4: tokens in the cache before each forward")
    ap.add_argument("--iters", type=int, default=30, help="step 2: timed calls (median)")
    ap.add_argument("--prompts", type=int, default=3, help="steps 3 and 5: prompts of random ids")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=128, help="step 3: new tokens per prompt")
    ap.add_argument("--cpu-tokens", type=int, default=48, help="step 5: new tokens per prompt")
    ap.add_argument("--depth", type=int, default=4, help="steps 3 and 5: draft expansions per round (fixed)")
    ap.add_argument("--draft-vocab", type=int, default=32768, help="rows of the draft's pruned LM head")
    ap.add_argument("--max-seq-len", type=int, default=2048)
    ap.add_argument("--window", type=float, default=2.0, help="step 4: seconds each timing window lasts")
    ap.add_argument("--splits", default="8+8,12+4", help="step 5: target+draft cores of each async run")
    ap.add_argument("--acceptance", type=Path, default=REPO / "docs/bench/cpu-acceptance.json",
                    help="a `swiftspec bench` report.json of the real pair on the CPU (acceptance lengths)")
    opts = ap.parse_args(argv)
    opts.shapes = TINY_PAIR if opts.tiny else DEFAULT_PAIR
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    steps = set(opts.steps.split(","))
    report = Report(out=opts.out, deadline=time.monotonic() + opts.budget_s)
    table = acceptance_table(opts.acceptance) if opts.acceptance.is_file() else {}
    rel = opts.acceptance.relative_to(REPO) if opts.acceptance.is_relative_to(REPO) else opts.acceptance
    report.data |= {"environment": environment(opts.device) | {"random pair": opts.shapes.name},
                    "note": ACCEPTANCE_NOTE.format(report=rel) if table else f"no acceptance report at {rel}: "
                                                                                "nothing predicted"}
    setup = ModeSetup(shapes=opts.shapes, place=Placement(device=opts.device, seed=opts.seed), depth=opts.depth,
                      max_seq_len=opts.max_seq_len, draft_vocab=opts.draft_vocab)
    work = Workload(prompts=opts.prompts, prompt_len=opts.prompt_len, tokens=opts.tokens, seed=opts.seed)
    print(f"gpu_check: {opts.device}, {opts.shapes.name}, steps {opts.steps}, out {opts.out}", flush=True)
    plan = {"1": lambda: gpu_tests(opts), "2": lambda: latency(opts, report),
            "3": lambda: modes_step(setup, work, table, report.guard), "4": lambda: sharing(opts, report),
            "5": lambda: cpu_splits(opts, report, table)}
    for key in sorted(steps & set(plan)):
        report.step(key, plan[key])
    report.data["imported packages"] = imported_packages()
    report.write()
    print("imported packages: " + " ".join(report.data["imported packages"]))
    print(f"results: {opts.out / 'gpu_check.json'} and {opts.out / 'gpu_check.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
