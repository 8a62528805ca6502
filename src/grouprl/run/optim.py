"""Optimizer, learning-rate schedule and the clipped step, shared by every trainer."""

from __future__ import annotations

import math

import torch

from grouprl.errors import NonFiniteError
from grouprl.registry import Registry

# name -> fn(progress in [0, 1]) -> multiplier after warm-up
LR_SCHEDULES: Registry = Registry("learning-rate schedule")

LR_SCHEDULES.register("constant", lambda progress: 1.0)
LR_SCHEDULES.register("linear", lambda progress: max(0.0, 1.0 - progress))
LR_SCHEDULES.register("cosine", lambda progress: 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))))


def lr_multiplier(step: int, warmup_steps: int, total_steps: int, schedule: str) -> float:
    """Multiplier of the base learning rate at optimizer step ``step`` (0-based).

    >>> [round(lr_multiplier(s, 2, 6, "linear"), 3) for s in range(6)]
    [0.5, 1.0, 1.0, 0.75, 0.5, 0.25]
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps)
    return LR_SCHEDULES.get(schedule)((step - warmup_steps) / decay_steps)


def build_optimizer(params, lr: float, betas: tuple[float, float], weight_decay: float, warmup_steps: int,
                    total_steps: int, schedule: str) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trainable parameters, and a LambdaLR stepping once per optimizer step."""
    params = [p for p in params if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    # The fused kernel is much faster on a CPU; sharded parameters (DTensor) take the per-tensor loop.
    fused = all(type(p) is torch.nn.Parameter and type(p.data) is torch.Tensor and p.device.type in ("cpu", "cuda")
                for p in params)
    optimizer = torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, fused=fused)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_multiplier(s, warmup_steps, total_steps, schedule)
    )
    return optimizer, scheduler


def clip_and_step(params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer, max_grad_norm: float,
                  scheduler: torch.optim.lr_scheduler.LRScheduler | None = None) -> float:
    """Clip the gradient norm to ``max_grad_norm`` (0 = off) and step; returns the norm before clipping. A
    non-finite norm raises :class:`~grouprl.errors.NonFiniteError` before anything changes."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm > 0 else float("inf"))
    if not torch.isfinite(norm):  # one such step would turn every weight into NaN
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteError(f"the gradient norm is {float(norm)}: the update was not applied")
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return float(norm)
