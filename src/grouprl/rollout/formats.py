"""The rollout formats by name: what each needs, in one registry (:data:`FORMATS`) that every other module
looks a format up in instead of comparing its name.

- ``fp32``: the live float32 weights, as the trainer computes.
- ``bf16``: the decode loop runs on bfloat16 copies of every float32 parameter, made once per rollout, under
  bf16 autocast (:func:`grouprl.rollout.runner.run_with_copies`); fast where the CPU multiplies bf16 natively
  (AMX, AVX-512 BF16) and on GPUs.
- ``bf16-weights``: CPU only: one-token decode steps multiply bf16 copies of the weights with fp32 activations
  and sums (:mod:`grouprl.rollout.cpu.bf16_weights`), everything else fp32; eager (not compiled), the built-in
  engine's alone.
"""

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
    """What one rollout format needs."""

    copy_dtype: torch.dtype | None
    """The dtype a decode loop copies every float32 parameter to and runs under autocast in (None: the live
    weights as they are)."""
    weight_only: WeightOnly | None
    """On a CPU, the products its one-token decode steps run on per-weight copies (None: the model's own)."""
    compiles: bool
    """The compiled decode step (:mod:`grouprl.rollout.cpu.compiled`) computes it."""
    compile_reason: str
    """Why ``rollout_compile`` auto compiles it on a CPU, or leaves it eager."""
    compile_auto: bool
    """``rollout_compile`` auto compiles it on a CPU, for a model the compiled step covers."""
    vllm_dtype: str | None
    """The dtype vLLM samples it in (None: the built-in engine's alone)."""
    exact: bool
    """Beside fp32 training, it computes the trainer's own numbers (no rollout correction needed)."""
    cpu_only: bool
    """Its kernels are CPU kernels."""
    unavailable: Callable[[], str | None] = _runs_anywhere
    """Why it cannot run on this machine's CPU (its kernels, the compiler), or None."""


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
    """Why rollout format ``name`` cannot run on ``device`` here (None where it can); an unknown name raises the
    registry's error, with the valid names."""
    fmt = FORMATS.get(name)
    if fmt.cpu_only and device.type != "cpu":
        return f"{name} runs on a CPU (its kernels are CPU kernels); this run computes on {device.type}"
    problem = fmt.unavailable()
    return None if problem is None else f"{name} cannot run here: {problem}"
