"""Running checks on the ranks of a `torch.distributed` group from a test: processes started with
`torch.multiprocessing` on a gloo group (CPU, `tcp://127.0.0.1` on a free port) or an NCCL group (one GPU per
rank), and the global tensors every rank builds alike and shards."""

from __future__ import annotations

import socket
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

F64 = torch.float64


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(world: int, checks: Callable[[int, int, torch.device], None], device_type: str = "cpu") -> None:
    mp.spawn(_worker, args=(world, free_port(), checks, device_type), nprocs=world, join=True)


def _worker(rank: int, world: int, port: int, checks: Callable, device_type: str) -> None:
    if device_type == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl" if device_type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
        world_size=world, timeout=timedelta(seconds=300),
    )  # fmt: skip
    try:
        checks(rank, world, torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu"))
        dist.barrier()  # no rank tears its connections down while a peer's last exchange is still in flight
    finally:
        dist.destroy_process_group()


def full(rows: int, cols: int, seed: int) -> torch.Tensor:
    """The same global float64 tensor on every rank."""
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed), dtype=F64)


def shard(t: torch.Tensor, sizes: tuple[int, ...], rank: int) -> torch.Tensor:
    start = sum(sizes[:rank])
    return t[start : start + sizes[rank]]
