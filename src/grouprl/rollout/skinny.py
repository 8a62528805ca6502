"""Decode steps of a few rows: which layout of each matrix product is faster, found by timing the products
inside the decode steps themselves.

A decode step multiplies b running rows by every weight of the model, and in a rollout whose rows stop at
EOS most steps have only 2-8 rows left. For such skinny products the CPU BLAS's choice of kernel can be
poor in float32, and which layout is better depends on the weight's shape and the row count: on a
2-core AMD EPYC Zen 4 limited to AVX2 (one thread, SmolLM2-135M's weights streamed from memory,
``benchmarks/products.py``), at 2 rows ``x @ W.T`` against a 1536 x 576 projection took 0.47 ms and
``(W @ x.T).T`` 0.18 ms, against the 49k x 576 LM head 21.6 ms and 5.7 ms, while at 4 rows against a
576 x 1536 one the plain layout was faster (0.34 ms against 0.49). In bf16, and from 16 rows on, the
plain layout won everywhere measured. What is fast flips with the CPU, the BLAS, the shape and the row
count, so nothing is assumed: for each (output size, input size, rows) up to :data:`MAX_ROWS` rows, the
calls alternate between the layouts and are timed (the first call of each layout not counted, as it may
pay for first use) until each has :data:`SAMPLES` timings; then the faster is used for good. A decode
step calls each shape once per layer, so most shapes are decided within a step or two; the LM head,
called once per step, within a few steps of that row count.

Only float32 decoding outside autocast is considered (bf16 decoding substitutes bf16 weights under
autocast). The two layouts compute the same sums in a different order: results agree to float32 rounding.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

MAX_ROWS = 8
"""Products of more rows always use ``x @ W.T`` (measured: the other layout did not win there)."""
SAMPLES = 3
"""Timed calls of each layout before one is chosen for a shape and row count."""
PLAIN, TRANSPOSED = 0, 1
LAYOUT_NAMES = ("x @ W.T", "(W @ x.T).T")


def plain_linear(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(x, module.weight, module.bias)


def transposed_linear(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` computed as ``(W @ x.T).T``: x [..., in] -> [..., out]."""
    flat = x.reshape(-1, x.shape[-1])  # [rows, in]
    y = torch.mm(module.weight, flat.t()).t()  # [rows, out], a transposed view
    if module.bias is not None:
        y = y + module.bias
    return y.reshape(*x.shape[:-1], y.shape[-1])


LAYOUTS = (plain_linear, transposed_linear)


@dataclass
class Timings:
    """Calls and seconds of each layout for one (output size, input size, rows)."""

    calls: list[int] = field(default_factory=lambda: [0, 0])
    seconds: list[float] = field(default_factory=lambda: [0.0, 0.0])

    @property
    def decided(self) -> bool:
        return min(self.calls) > SAMPLES  # the first call of each is not timed

    def layout(self) -> int:
        if self.decided:
            plain, transposed = (s / (c - 1) for s, c in zip(self.seconds, self.calls))
            return TRANSPOSED if transposed < plain else PLAIN
        return PLAIN if self.calls[PLAIN] <= self.calls[TRANSPOSED] else TRANSPOSED


class SkinnyProducts:
    """Per (output size, input size, rows), the faster layout of a few-row product, learnt from the decode
    steps' own calls. One instance serves many rollouts of one model (the sampler keeps it), so a shape
    and row count is measured once per run.

    Args:
        clock: seconds, for the call timings (tests pass a fake one).
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.table: dict[tuple[int, int, int], Timings] = {}

    def chosen(self) -> dict[tuple[int, int, int], str]:
        """(output size, input size, rows) -> the layout chosen, for the decided ones."""
        return {k: LAYOUT_NAMES[t.layout()] for k, t in sorted(self.table.items()) if t.decided}

    def linear(self, module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """``module(x)`` in the layout chosen for its shape and row count (or on trial)."""
        timings = self.table.setdefault((module.out_features, module.in_features, x.numel() // x.shape[-1]),
                                        Timings())
        layout = timings.layout()
        if timings.decided:
            return LAYOUTS[layout](module, x)
        start = self.clock()
        y = LAYOUTS[layout](module, x)
        if timings.calls[layout]:
            timings.seconds[layout] += self.clock() - start
        timings.calls[layout] += 1
        return y

    @contextlib.contextmanager
    def step(self, linears: list[nn.Linear], rows: int) -> Iterator[None]:
        """Run one decode step of ``rows`` rows inside; ``linears`` are the model's matrix products."""
        weight = linears[0].weight if linears else None
        if (rows > MAX_ROWS or weight is None or weight.dtype != torch.float32
                or torch.is_autocast_enabled(weight.device.type)):
            yield
            return
        for m in linears:  # an instance attribute shadows the class's forward
            m.forward = lambda x, m=m: self.linear(m, x)
        try:
            yield
        finally:
            for m in linears:
                m.__dict__.pop("forward", None)


def model_linears(model: nn.Module) -> list[nn.Linear]:
    """The ``nn.Linear`` modules of ``model`` (peft's LoRA layers wrap theirs: the wrapped ones count)."""
    return [m for m in model.modules() if type(m) is nn.Linear]
