"""How the two groups can share one device, for benchmarks/gpu_check.py (step 4).

Two processes (what the async engine runs): a target process verifying bs rows and a draft
process expanding w rows, each timing its forward for a fixed window alone and then with the other
running at the same time; again under MPS when its control daemon starts (best effort, stopped
after).  Stream priorities and green contexts are detected and reported, not measured.
"""

from __future__ import annotations

import queue
import shutil
import statistics
import subprocess
import time
from dataclasses import dataclass

import torch
import torch.multiprocessing as mp
from gpu_forward import WARMUP_CALLS, chain_call, prefilled_runner
from gpu_pair import PairShapes, Placement, random_target

PHASES = ("target", "draft", "both")  # who runs in each window
RESULT_TIMEOUT_S = 240.0  # the processes' start-up, model build and every window
MPS_CONTROL = "nvidia-cuda-mps-control"


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopJob:
    """One process of the pair: which model, how many rows, how long each window lasts."""

    role: str  # "target" | "draft"
    shapes: PairShapes
    place: Placement
    rows: int
    prefix: int
    window_s: float
    threads: int  # CPU intra-op threads of this process


def forward_loop(job: LoopJob, barrier, results) -> None:  # mp.Barrier, mp.Queue
    """Child: build the model, then in each phase's window time back-to-back forwards if this
    process runs in that phase (else wait), and report (role, phase, median ms, calls)."""
    torch.set_num_threads(job.threads)
    args = job.shapes.target if job.role == "target" else job.shapes.draft
    model = random_target(args, job.place)
    runner = prefilled_runner(model, job.prefix, job.rows)
    call = chain_call(runner, job.rows)
    cuda = job.place.device.startswith("cuda")
    for _ in range(WARMUP_CALLS):
        call()
    for phase in PHASES:
        barrier.wait()
        if phase not in (job.role, "both"):
            continue
        samples, end = [], time.perf_counter() + job.window_s
        while time.perf_counter() < end:
            t = time.perf_counter()
            call()
            if cuda:
                torch.cuda.synchronize()
            samples.append(1e3 * (time.perf_counter() - t))
        results.put((job.role, phase, statistics.median(samples), len(samples)))
    barrier.wait()


def two_processes(jobs: list[LoopJob]) -> dict[str, float]:
    """Run the two loops; {"<role> alone ms", "<role> shared ms", "<role> slowdown"} per role."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(len(jobs), timeout=RESULT_TIMEOUT_S), ctx.Queue()
    procs = [ctx.Process(target=forward_loop, args=(job, barrier, results), daemon=True) for job in jobs]
    for proc in procs:
        proc.start()
    got = {}
    try:
        for _ in range(2 * len(jobs)):
            role, phase, ms, calls = results.get(timeout=RESULT_TIMEOUT_S)
            got[f"{role} {'shared' if phase == 'both' else 'alone'} ms"] = ms
            got[f"{role} {'shared' if phase == 'both' else 'alone'} calls"] = calls
    except queue.Empty:
        raise RuntimeError(f"the two processes reported {len(got) // 2} of {2 * len(jobs)} windows "
                           f"within {RESULT_TIMEOUT_S:.0f} s") from None
    finally:
        for proc in procs:
            proc.join(30.0)
            if proc.is_alive():
                proc.kill()
    for job in jobs:
        got[f"{job.role} slowdown"] = got[f"{job.role} shared ms"] / got[f"{job.role} alone ms"]
    return got


def mps(command: str) -> str:
    """Send one command to the MPS control daemon; its reply."""
    done = subprocess.run([MPS_CONTROL], input=command + "\n", capture_output=True, text=True, timeout=20)
    return (done.stdout + done.stderr).strip()


def with_mps(jobs: list[LoopJob]) -> dict:
    """two_processes under MPS: start the control daemon, run, report which server served the
    clients, stop the daemon (always).  Raises when the daemon is missing or does not start."""
    if shutil.which(MPS_CONTROL) is None:
        raise RuntimeError(f"{MPS_CONTROL} is not on PATH")
    started = subprocess.run([MPS_CONTROL, "-d"], capture_output=True, text=True, timeout=20)
    if started.returncode != 0:
        raise RuntimeError(f"{MPS_CONTROL} -d exited {started.returncode}: {(started.stderr or started.stdout).strip()}")
    try:
        out = two_processes(jobs)
        out["server list"] = mps("get_server_list")
        return out
    finally:
        mps("quit")


def stream_features() -> dict:
    """What this torch build offers to prioritise one group's work: stream priorities (the range
    a stream gets clamped to) and green contexts (SM partitions), detected, and created once."""
    found: dict = {}
    hi, lo = torch.cuda.Stream(priority=-100), torch.cuda.Stream(priority=100)
    found["stream priority range (high, low)"] = [hi.priority, lo.priority]
    green = getattr(torch.cuda, "green_contexts", None)
    found["green contexts in this torch"] = bool(green is not None and getattr(green, "SUPPORTED", False))
    if found["green contexts in this torch"]:
        sms = torch.cuda.get_device_properties(0).multi_processor_count // 16 * 8  # about half, a multiple of 8
        try:
            green.GreenContext.create(num_sms=sms)
            found[f"green context of {sms} SMs"] = "created"
        except Exception as exc:  # noqa: BLE001 - a beta API: any failure is the finding
            found[f"green context of {sms} SMs"] = f"failed: {type(exc).__name__}: {str(exc)[:160]}"
    return found
