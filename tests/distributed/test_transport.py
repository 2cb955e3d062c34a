"""DistTransport over gloo: ready() turns true once a message has arrived (gloo's own completion flag
does not until the receive is waited on), and messages keep their order."""

from __future__ import annotations

import datetime
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from swiftspec.distributed.protocol import DistTransport, Shutdown, Verified


def _peer(rank: int, init_method: str) -> None:
    dist.init_process_group("gloo", init_method=init_method, rank=1, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    link = DistTransport(0)
    link.send(Verified(tokens=torch.tensor([4, 5]), nodes=torch.tensor([0, 2]), stop=False))
    assert isinstance(link.recv(), Shutdown)
    dist.destroy_process_group()


def test_ready_after_arrival_then_recv() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        init_method = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    ctx = mp.start_processes(_peer, args=(init_method,), nprocs=1, join=False, start_method="spawn")
    dist.init_process_group("gloo", init_method=init_method, rank=0, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    try:
        link = DistTransport(1)
        deadline = time.monotonic() + 30
        while not link.ready():
            assert time.monotonic() < deadline, "ready() never turned true"
            time.sleep(0.01)
        msg = link.recv()
        assert isinstance(msg, Verified) and msg.tokens.tolist() == [4, 5] and msg.nodes.tolist() == [0, 2]
        link.send(Shutdown())
        link.flush()
        ctx.join(timeout=30)
    finally:
        dist.destroy_process_group()
