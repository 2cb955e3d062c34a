"""Tensor parallelism: a tiny model's logits with TP=2 (two gloo processes) equal TP=1 within 1e-4."""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from swiftspec.config import LoadConfig
from swiftspec.parallel.state import ParallelState
from swiftspec.runner.model_runner import ModelRunner
from swiftspec.weights.loader import load_model

FP32 = LoadConfig(dtype="float32", max_seq_len=64)
PROMPT = [3, 14, 15, 92, 65, 35, 89, 79]


def logits_of(model_dir: str, parallel: ParallelState) -> torch.Tensor:
    loaded = load_model(model_dir, FP32, parallel)
    runner = ModelRunner(loaded.model, 64, max_nodes=1)
    first = runner.extend(PROMPT[:-1])
    return torch.cat([first, runner.extend(PROMPT[-1:])])  # [2, V]: a prefill and a decode step


def _rank(rank: int, model_dir: str, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    torch.set_num_threads(1)
    logits = logits_of(model_dir, ParallelState(tp_rank=rank, tp_size=2, group=dist.group.WORLD))
    if rank == 0:
        torch.save(logits, out)
    dist.barrier()  # both results are in before either rank leaves
    # Skip interpreter teardown: gloo's background threads can abort a process that exits through
    # it ("terminate called without an active exception"), which is a teardown race, not a result.
    os._exit(0)


def test_tp2_logits_equal_tp1(tiny_qwen_dir, tiny_llama_dir, tmp_path) -> None:
    for model_dir in (tiny_qwen_dir, tiny_llama_dir):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            init = f"tcp://127.0.0.1:{s.getsockname()[1]}"
        out = str(tmp_path / "tp2.pt")
        mp.start_processes(_rank, args=(str(model_dir), init, out), nprocs=2, start_method="spawn")
        tp2 = torch.load(out)
        tp1 = logits_of(str(model_dir), ParallelState())
        assert (tp2 - tp1).abs().max() <= 1e-4
