"""An 8-bit AdamW as a memory lever on a CPU: torchao's ``AdamW8bit`` (moments in 8 bits: a quarter of
fp32 AdamW's state) against PyTorch's fused fp32 AdamW, the optimizer grouprl uses, on ``--tensors``
matrices of SmolLM2-135M's MLP shape (1536 x 576) with random gradients: seconds of the first step
(torchao compiles its kernels then) and the median of the next ``--steps``.

    pip install torchao   (benchmark only; no torch requirement of its own)
    python benchmarks/optimizer_8bit.py [--tensors 40] [--steps 5] [--threads 2]

The last line is ``slowdown=<8-bit step over fused step> first_step_s=<X> per_135m_params_s=<Y>``
(the 8-bit step's extra seconds scaled to SmolLM2-135M's parameter count).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from machine import cpu_line  # benchmarks/machine.py: every figure says which CPU it came from
from smoke import add_smoke, shrink

SMOLLM2_PARAMS = 134.5e6


def timed_steps(optimizer: torch.optim.Optimizer, steps: int) -> tuple[float, float]:
    """(seconds of the first step, median seconds of the next ``steps``)."""
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return times[0], statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=40)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    add_smoke(parser, "2 tensors, one timed step")
    args = shrink(parser.parse_args(), tensors=2, steps=1, threads=1)
    from torchao.optim import AdamW8bit

    print(cpu_line(), flush=True)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(1536, 576)) for _ in range(args.tensors)]
    for p in params:
        p.grad = torch.randn_like(p)
    count = sum(p.numel() for p in params)
    fused_first, fused = timed_steps(torch.optim.AdamW(params, lr=1e-5, fused=True), args.steps)
    low_first, low = timed_steps(AdamW8bit(params, lr=1e-5), args.steps)
    print(f"{count / 1e6:.1f}M parameters, {args.threads} threads: fused fp32 AdamW {fused:.3f} s a step "
          f"(first {fused_first:.3f}), torchao AdamW8bit {low:.3f} s (first {low_first:.1f})")
    print(f"slowdown={low / fused:.1f} first_step_s={low_first:.1f} "
          f"per_135m_params_s={(low - fused) * SMOLLM2_PARAMS / count:.2f}")


if __name__ == "__main__":
    main()
