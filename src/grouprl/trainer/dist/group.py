"""The process group of a torchrun run and the few collectives the trainer needs. GPU runs use
``cuda:nccl,cpu:gloo``, so the object collectives (completions, metrics) keep a CPU backend."""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from grouprl.errors import DistributedError


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def torchrun_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def torchrun_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def init_distributed(*, rank: int | None = None, world_size: int | None = None, init_method: str | None = None,
                     device: str | None = None, timeout_s: float = 1800.0) -> DistEnv:
    """Join (or reuse) the default process group and pick this process's device; defaults from torchrun's env."""
    rank = torchrun_rank() if rank is None else rank
    world_size = torchrun_world_size() if world_size is None else world_size
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    use_cuda = torch.cuda.is_available() if device is None else device == "cuda"
    if use_cuda:
        torch.cuda.set_device(local_rank)
    dev = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if not dist.is_initialized():
        if init_method is None and "MASTER_ADDR" not in os.environ:
            raise RuntimeError("no process group to join: start the run with torchrun (or `grouprl train --nproc N`), "
                               "which sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT")
        dist.init_process_group("cuda:nccl,cpu:gloo" if use_cuda else "gloo", init_method=init_method or "env://",
                                rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))
    return DistEnv(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local_rank, device=dev)


def one_process_init_method() -> str:
    """A rendezvous address on a free local TCP port, for a group of one process."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def sum_tensor(x: torch.Tensor) -> torch.Tensor:
    """``x`` (a few numbers on the CPU) summed over processes, as a new tensor."""
    out = x.detach().clone()
    dist.all_reduce(out)
    return out


def max_float(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def gather_objects(obj: Any) -> list[Any]:
    """``obj`` of every process, in rank order (pickled: any shapes, unlike a tensor ``all_gather`` on gloo)."""
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def raise_if_any_failed(error: BaseException | None) -> None:
    """Every process passes what it caught: if any failed, all raise, so none waits in a collective forever."""
    reports = gather_objects(None if error is None else f"{type(error).__name__}: {error}")
    failed = [(r, msg) for r, msg in enumerate(reports) if msg is not None]
    if not failed:
        return
    if error is not None:
        raise error
    rank, msg = failed[0]
    raise DistributedError(f"process {rank} of {len(reports)} stopped the run: {msg}")


def broadcast_module(module: nn.Module) -> None:
    """Process 0's parameters and buffers into every process's (unsharded) ``module``, so random starts agree."""
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            dist.broadcast(t.data, src=0)
