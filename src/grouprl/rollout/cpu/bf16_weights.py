"""The ``bf16-weights`` format, for CPUs without bf16 units: a few-row decode step waits on reading the weights, so
its products read bf16 copies widened to fp32 in registers, fp32 inputs and sums (:file:`few_rows.cpp`); only the
weights are rounded. One-token steps only; shapes the kernel does not take stay fp32."""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn

from grouprl.rollout.cpu.native import KernelUnavailable, load

PANEL = 16  # output columns of one panel of the packed weight


def _library() -> ModuleType:
    return load("few_rows")


def unavailable() -> str | None:
    """Why the bf16-weights kernels cannot run here, or None."""
    try:
        _library()
    except KernelUnavailable as e:
        return str(e)
    return None


def takes(out_features: int, in_features: int) -> bool:
    """Whether the kernel takes this shape: whole panels of outputs, an even input width (two inputs a step)."""
    return out_features % PANEL == 0 and in_features % 2 == 0


def supported(module: nn.Module) -> bool:
    """Whether ``module``'s products can run on a bf16 copy of its weight."""
    weight = getattr(module, "weight", None)
    return isinstance(weight, torch.Tensor) and weight.dtype == torch.float32 and weight.device.type == "cpu" and \
        weight.dim() == 2 and takes(*weight.shape)


def pack(weight: torch.Tensor) -> tuple[torch.Tensor]:
    """``weight`` [out, in] fp32 as ``(panels,)``, [out / 16, in, 16] int16 bf16 bits (panel p: outputs 16p..16p+15)."""
    n, k = weight.shape
    if weight.dtype != torch.float32 or not takes(n, k):
        raise ValueError(f"pack takes an fp32 [out, in] weight with out a multiple of {PANEL} and in even, got "
                         f"{weight.dtype} {tuple(weight.shape)}")
    panels = torch.empty(n // PANEL, k, PANEL, dtype=torch.bfloat16)
    panels.copy_(weight.detach().reshape(n // PANEL, PANEL, k).transpose(1, 2))  # rounds and transposes in one pass
    return (panels.view(torch.int16),)


def product(x: torch.Tensor, panels: torch.Tensor) -> torch.Tensor:
    """``x`` [rows, in] fp32 times the packed weight's transpose: [rows, out] fp32."""
    k = panels.shape[1]
    if x.dim() != 2 or x.shape[1] != k or k % 2 or panels.dtype != torch.int16 or not panels.is_contiguous() or \
            panels.dim() != 3 or panels.shape[2] != PANEL:
        raise ValueError(f"product takes x [rows, in] and contiguous int16 panels [out / {PANEL}, in, {PANEL}] "
                         f"(in even), got x {tuple(x.shape)}, panels {panels.dtype} {tuple(panels.shape)}")
    return _library().bf16_product(x.float().contiguous(), panels)


def bf16_weights_linear(module: nn.Module, x: torch.Tensor, copy: tuple[torch.Tensor]) -> torch.Tensor:
    """``module(x)`` on the packed bf16 copy of its weight: x [..., in] -> [..., out] fp32."""
    y = product(x.reshape(-1, x.shape[-1]), copy[0])
    if getattr(module, "bias", None) is not None:
        y = y + module.bias
    return y.reshape(*x.shape[:-1], y.shape[-1])
