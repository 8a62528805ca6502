"""Several processes, one model: the process group, sharding (FSDP2 or DDP), and the collectives
the trainer needs.

Launch with ``torchrun`` (or ``grouprl train --nproc N``, which runs it for you): every process
reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT from its environment. CPU runs use
gloo; GPU runs use ``cuda:nccl,cpu:gloo``, so GPU tensors travel over NCCL while the object
collectives (completions, metrics) keep a CPU backend.

Each process's loss is its share of the loss of the whole batch (its own numerators over the
global denominators), so the gradient of the whole batch is the *sum* of the processes' gradients.
DDP and FSDP average them, so the trainer multiplies its loss by the number of processes. (Making
DDP sum instead, with a communication hook, would be wrong under gradient accumulation: DDP
all-reduces the accumulated gradient at every backward, and an average is the only reduction
for which re-reducing the already reduced part is harmless.)

FSDP2 keeps each decoder layer's parameters sharded and gathers them only while the layer runs,
which needs every process to run the same number of forward passes. Generation cannot promise
that (rows stop at different lengths), so :func:`gathered_weights` gathers the whole model once
for a rollout or an evaluation, and the decode loop then runs with no communication at all.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

ENGINES = ("fsdp", "ddp")
MIXED_PRECISION = ("none", "bf16")


class DistributedError(RuntimeError):
    """Another process failed; the message carries its rank and error."""


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the run."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        """The process that writes logs, reports and the gathered model."""
        return self.rank == 0


def torchrun_world_size() -> int:
    """WORLD_SIZE from the environment (1 outside torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_distributed(*, rank: int | None = None, world_size: int | None = None, init_method: str | None = None,
                     device: str | None = None, timeout_s: float = 1800.0) -> DistEnv:
    """Join (or reuse) the default process group and pick this process's device.

    Without arguments everything comes from the torchrun environment; tests pass ``rank``,
    ``world_size`` and a ``file://`` ``init_method``. ``device`` is ``"cpu"`` or ``"cuda"``
    (default: cuda when available).
    """
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
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


# ---------------------------------------------------------------------------------------------
# Collectives


def sum_floats(values: Sequence[float]) -> list[float]:
    """Element-wise sum over processes of a few numbers (float64 on the CPU backend)."""
    t = torch.tensor(list(values), dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


def max_float(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def gather_objects(obj: Any) -> list[Any]:
    """``obj`` of every process, in rank order (pickled: tensors of different shapes are fine,
    which a tensor ``all_gather`` on gloo is not)."""
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def raise_if_any_failed(error: BaseException | None) -> None:
    """Every process calls this at the same point with the exception it caught (or None). If any
    process failed, all of them raise: the failing one its own exception, the others a
    :class:`DistributedError` that names its rank and repeats its message, so no process is left
    waiting in a collective that will never come."""
    reports = gather_objects(None if error is None else f"{type(error).__name__}: {error}")
    failed = [(r, msg) for r, msg in enumerate(reports) if msg is not None]
    if not failed:
        return
    if error is not None:
        raise error
    rank, msg = failed[0]
    raise DistributedError(f"process {rank} of {len(reports)} stopped the run: {msg}")


def broadcast_module(module: nn.Module) -> None:
    """Copy process 0's parameters and buffers into every process's copy of ``module`` (plain,
    unsharded tensors), so randomly initialised parts (a tiny model, LoRA adapters) agree."""
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            dist.broadcast(t.data, src=0)


# ---------------------------------------------------------------------------------------------
# Sharding


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of a ``transformers`` model, found by the class names it lists in
    ``_no_split_modules`` (peft wrappers are looked through)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(inner, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"cannot shard {type(inner).__name__}: no decoder layers found (its _no_split_modules is "
                         f"{sorted(names) or 'empty'}); use engine=ddp")
    return layers


@dataclass
class Sharding:
    """How a run shards its models."""

    engine: str = "fsdp"
    mixed_precision: str = "none"
    cpu_offload: bool = False

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine={self.engine!r} is not one of: {', '.join(ENGINES)}")
        if self.mixed_precision not in MIXED_PRECISION:
            raise ValueError(f"mixed_precision={self.mixed_precision!r} is not one of: {', '.join(MIXED_PRECISION)}")


def _fsdp_policies(sharding: Sharding, env: DistEnv) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    kwargs: dict[str, Any] = {"mesh": init_device_mesh(env.device.type, (env.world_size,))}
    if sharding.mixed_precision == "bf16":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if sharding.cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=env.device.type == "cuda")
    return kwargs


def shard_model(model: nn.Module, sharding: Sharding, env: DistEnv) -> nn.Module:
    """``model`` ready for training across processes: FSDP2 (each decoder layer its own unit,
    then the root; the module is converted in place and returned) or DDP (a wrapper). Gradients
    are averaged over processes (see the module docstring)."""
    model.to(env.device)
    if sharding.engine == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [env.device.index] if env.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)
    from torch.distributed.fsdp import register_fsdp_forward_method

    kwargs = _fsdp_policies(sharding, env)
    for layer in decoder_layers(model):
        _shard_unit(layer, True, kwargs)
    _shard_unit(model, False, kwargs)  # the root's parameters are needed again right at backward
    if hasattr(model, "generate"):  # HF generate calls forward from inside another method
        register_fsdp_forward_method(model, "generate")
    return model


def shard_frozen(model: nn.Module, sharding: Sharding, env: DistEnv) -> nn.Module:
    """A frozen model (the reference) sharded like the policy under FSDP; a plain replica
    under DDP (it has no gradients to reduce)."""
    model.to(env.device)
    if sharding.engine == "ddp":
        return model
    kwargs = _fsdp_policies(sharding, env)
    for layer in decoder_layers(model):
        _shard_unit(layer, True, kwargs)
    _shard_unit(model, True, kwargs)
    return model


def _shard_unit(module: nn.Module, reshard_after_forward: bool, kwargs: dict[str, Any]) -> None:
    """``fully_shard`` one unit, remembering its reshard setting for :func:`gathered_weights`."""
    from torch.distributed.fsdp import fully_shard

    fully_shard(module, reshard_after_forward=reshard_after_forward, **kwargs)
    module.grouprl_reshard_after_forward = reshard_after_forward


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a DDP wrapper; FSDP2 modules are their own module."""
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model


def _fsdp_units(model: nn.Module) -> list[nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def gathered_weights(model: nn.Module) -> Iterator[None]:
    """Inside: every FSDP unit of ``model`` holds its full parameters and keeps them across
    forward passes, so any number of forwards (a decode loop) runs with no collective. A no-op
    for DDP and plain modules. Collective on entry: every process must enter together."""
    units = _fsdp_units(model)
    if not units:
        yield
        return
    for unit in units:  # same order on every process: module order
        unit.unshard()
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(getattr(unit, "grouprl_reshard_after_forward", True), recurse=False)


class WholeForward(nn.Module):
    """Hands ``model(...)`` to the wrapped module and hides its config, so the log-prob code runs
    the whole forward (the only call that fires FSDP's and DDP's hooks) instead of calling the
    decoder body and the LM head apart."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.inner = model

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner(*args, **kwargs)
