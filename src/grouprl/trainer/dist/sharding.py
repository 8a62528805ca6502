"""Sharding a model over processes (FSDP2 or DDP). DDP and FSDP average gradients, so the trainer scales its loss
by the number of processes (a summing hook would be wrong under gradient accumulation). FSDP2 needs equal forward
counts, which generation cannot promise, so :func:`gathered_weights` gathers the whole model once for a rollout."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from grouprl.trainer.dist.group import DistEnv

ENGINES = ("fsdp", "ddp")
MIXED_PRECISION = ("none", "bf16")


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of a ``transformers`` model: the classes of its ``_no_split_modules`` (through peft)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(inner, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"cannot shard {type(inner).__name__}: no decoder layers found (its _no_split_modules is "
                         f"{sorted(names) or 'empty'}); use engine=ddp")
    return layers


@dataclass(frozen=True)
class Sharding:
    """How a run shards its models (the ``engine``, ``mixed_precision`` and ``cpu_offload`` keys)."""

    engine: str = "fsdp"
    mixed_precision: str = "none"
    cpu_offload: bool = False

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine={self.engine!r} is not one of: {', '.join(ENGINES)}")
        if self.mixed_precision not in MIXED_PRECISION:
            raise ValueError(f"mixed_precision={self.mixed_precision!r} is not one of: {', '.join(MIXED_PRECISION)}")

    def fsdp_kwargs(self, env: DistEnv) -> dict[str, Any]:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

        kwargs: dict[str, Any] = {"mesh": init_device_mesh(env.device.type, (env.world_size,))}
        if self.mixed_precision == "bf16":
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if self.cpu_offload:
            kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=env.device.type == "cuda")
        return kwargs

    def trainable(self, model: nn.Module, env: DistEnv) -> nn.Module:
        """``model`` ready for training: FSDP2 (converted in place) or DDP (a wrapper)."""
        model.to(env.device)
        if self.engine == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            ids = [env.device.index] if env.device.type == "cuda" else None
            return DistributedDataParallel(model, device_ids=ids)
        from torch.distributed.fsdp import register_fsdp_forward_method

        self.fully_shard(model, env, root_reshards=False)  # the root's parameters are needed again right at backward
        if hasattr(model, "generate"):  # HF generate calls forward from inside another method
            register_fsdp_forward_method(model, "generate")
        return model

    def frozen(self, model: nn.Module, env: DistEnv) -> nn.Module:
        """A frozen model (the reference) sharded like the policy under FSDP; a plain replica under DDP."""
        model.to(env.device)
        return model if self.engine == "ddp" else self.fully_shard(model, env, root_reshards=True)

    def fully_shard(self, model: nn.Module, env: DistEnv, root_reshards: bool) -> nn.Module:
        """FSDP2 units in place, each decoder layer then the root, noting each one's reshard for gathered_weights."""
        from torch.distributed.fsdp import fully_shard

        kwargs = self.fsdp_kwargs(env)
        for unit, reshard in [*((layer, True) for layer in decoder_layers(model)), (model, root_reshards)]:
            fully_shard(unit, reshard_after_forward=reshard, **kwargs)
            unit.grouprl_reshard_after_forward = reshard
        return model


@contextlib.contextmanager
def gathered_weights(model: nn.Module) -> Iterator[None]:
    """Inside, FSDP units keep their full parameters, so a decode loop runs with no collective (entry is one)."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
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
    """Hides the model's config, so the log-prob code runs the whole forward, which fires FSDP's and DDP's hooks."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.module = model

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)
