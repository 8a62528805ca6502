"""The rollout formats (:data:`FORMATS`): ``fp32`` (the live weights); ``bf16`` (bf16 copies of the weights per
rollout under bf16 autocast); ``bf16-weights`` (CPU only: one-token steps multiply bf16 weight copies with fp32
activations, :mod:`grouprl.rollout.cpu.bf16_weights`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from grouprl.registry import Registry
from grouprl.rollout.cpu.weight_only import BF16_WEIGHTS, WeightOnly


def _runs_anywhere() -> str | None:
    return None


@dataclass(frozen=True)
class RolloutFormat:
    copy_dtype: torch.dtype | None
    """The dtype a decode loop copies every fp32 parameter to and autocasts in (None: the live weights)."""
    weight_only: WeightOnly | None
    """On a CPU, the products its one-token steps run on weight copies (None: the model's own)."""
    compiles: bool
    compile_reason: str
    compile_auto: bool
    """``rollout_compile`` auto compiles it on a CPU, for a model the compiled step covers."""
    vllm_dtype: str | None
    """The dtype vLLM samples it in (None: the built-in engine's alone)."""
    exact: bool
    """Beside fp32 training it computes the trainer's own numbers."""
    cpu_only: bool
    unavailable: Callable[[], str | None] = _runs_anywhere


FORMATS: Registry[RolloutFormat] = Registry("rollout format")
FORMATS.register("fp32", RolloutFormat(
    None, None, compiles=True, compile_auto=False, vllm_dtype="float32", exact=True, cpu_only=False,
    compile_reason="fp32 rollouts: the matrix products outweigh what compiling fuses"))
FORMATS.register("bf16", RolloutFormat(
    torch.bfloat16, None, compiles=True, compile_auto=True, vllm_dtype="bfloat16", exact=False, cpu_only=False,
    compile_reason="bf16 rollouts on a CPU: compiling fuses the small operators around the products"))
FORMATS.register("bf16-weights", RolloutFormat(
    None, BF16_WEIGHTS, compiles=False, compile_auto=False, vllm_dtype=None, exact=False, cpu_only=True,
    compile_reason="bf16-weights rollouts run their decode steps eagerly", unavailable=BF16_WEIGHTS.unavailable))


def format_problem(name: str, device: torch.device) -> str | None:
    """Why rollout format ``name`` cannot run on ``device`` here (None where it can)."""
    fmt = FORMATS.get(name)
    if fmt.cpu_only and device.type != "cpu":
        return f"{name} runs on a CPU (its kernels are CPU kernels); this run computes on {device.type}"
    problem = fmt.unavailable()
    return None if problem is None else f"{name} cannot run here: {problem}"
