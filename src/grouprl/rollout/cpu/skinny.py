"""Decode steps: which of three layouts of each matrix product is fastest, found by timing the products
inside the decode steps themselves.

A decode step multiplies b running rows by every weight of the model, and in a rollout whose rows stop at
EOS most steps have only 2-16 rows left. For such products the CPU BLAS's choice of kernel can be poor,
and which layout is better depends on the CPU, the weight's shape and the row count. The layouts:

- ``x @ W.T``, what ``nn.Linear`` does;
- ``(W @ x.T).T``: the same sums in another order, which the BLAS runs with another kernel;
- oneDNN's linear (``torch.ops.mkldnn._linear_pointwise``) on a copy of the weight reordered into
  oneDNN's blocked layout, made on its first use in a rollout (a decode loop) and kept to the loop's
  end: the weight's size in memory meanwhile, and a reorder per weight per rollout, paid only for the
  weights whose products are on trial in it or have chosen it, while the copies fit in half the memory
  the system had available at the loop's start. Where the CPU cannot reorder the format (bf16 without
  AVX-512 BW or AVX-NE-CONVERT), the layout is left out.

On a 2-core AMD EPYC Zen 4 (AVX-512 BF16; one thread, SmolLM2-135M's weights streamed from memory,
``python benchmarks/products.py --threads 1``, log in ``benchmarks/results/products/``), in fp32 at 2
rows ``x @ W.T`` against the 49k x 576 LM head took 23.7 ms, ``(W @ x.T).T`` 6.1 and oneDNN's 8.9; at
16 rows 25.2, 29.5 and 11.3; a whole 16-row step's products 96, 108 and 59 ms, and in bf16 55, 53 and
35 ms. With its kernels limited to AVX2 the 16-row step took 97, 109 and 82 ms, and at 2 rows the
transposed layout was the fastest for most shapes. What is fast flips with the CPU, the BLAS, the
shape and the row count, so nothing is assumed: for each output size, input size, format and row count
up to :data:`MAX_ROWS` rounded up to a power of two (a learner per row count would spend a rollout of
64 rows on trials), the calls go round the layouts and are timed (the first call of each not
counted, as it may pay for first use; the reorder is made before the clock starts) until each has
:data:`SAMPLES` timings; then the fastest is used for good. A decode step calls each shape once per
layer, so most shapes are decided within a step or two; the LM head, called once per step, within a
dozen steps at that row count.

float32 decoding outside autocast and bf16 decoding (bf16 copies of the weights under bf16 autocast,
:func:`grouprl.rollout.runner.run_with_bf16_weights`) are rerouted; a step whose weights are fp32 under
autocast runs as it is. The layouts compute the same sums in different orders: results agree to the
format's rounding.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

MAX_ROWS = 64
"""Products of more rows (prefills) always use ``x @ W.T``."""
SAMPLES = 3
"""Timed calls of each layout before one is chosen for a shape and row count."""
PLAIN, TRANSPOSED, PACKED = 0, 1, 2
LAYOUT_NAMES = ("x @ W.T", "(W @ x.T).T", "oneDNN packed")


PACK_SHARE = 0.5
"""The reordered copies of one decode loop take at most this share of the memory the system had available
when the loop began; weights past it run in the other layouts."""


def available_memory() -> int | None:
    """Bytes the system can still hand out without swapping (Linux's MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class PackedWeights:
    """oneDNN-reordered copies of the weights one decode loop reads (weights do not change within it),
    made on first use while they fit in ``budget`` bytes (None: :data:`PACK_SHARE` of the memory available
    now, unbounded where that is unknown); ``None`` for a format this CPU cannot reorder or a weight past
    the budget."""

    def __init__(self, budget: int | None = None) -> None:
        # id(weight) -> (weight, its copy): holding the weight keeps its id from being reused meanwhile
        self.copies: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.unsupported: set[torch.dtype] = set()
        if budget is None:
            available = available_memory()
            budget = None if available is None else int(available * PACK_SHARE)
        self.budget, self.used = budget, 0

    def supports(self, weight: torch.Tensor) -> bool:
        return weight.dtype not in self.unsupported

    def of(self, module: nn.Linear) -> torch.Tensor | None:
        """``module``'s weight reordered (made now if this loop has not yet), or None where it cannot be."""
        weight = module.weight
        if id(weight) not in self.copies:
            size = weight.numel() * weight.element_size()
            if not self.supports(weight) or (self.budget is not None and self.used + size > self.budget):
                return None
            try:
                copy = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
            except (RuntimeError, AttributeError, NotImplementedError, TypeError):  # no oneDNN, or not this format
                self.unsupported.add(weight.dtype)
                return None
            self.copies[id(weight)] = (weight, copy)
            self.used += size
        return self.copies[id(weight)][1]


def plain_linear(module: nn.Linear, x: torch.Tensor, packs: PackedWeights) -> torch.Tensor:
    return torch.nn.functional.linear(x, module.weight, module.bias)


def transposed_linear(module: nn.Linear, x: torch.Tensor, packs: PackedWeights) -> torch.Tensor:
    """``module(x)`` computed as ``(W @ x.T).T``: x [..., in] -> [..., out]."""
    flat = x.reshape(-1, x.shape[-1])  # [rows, in]
    y = torch.mm(module.weight, flat.t()).t()  # [rows, out], a transposed view
    if module.bias is not None:
        y = y + module.bias
    return y.reshape(*x.shape[:-1], y.shape[-1])


def packed_linear(module: nn.Linear, x: torch.Tensor, packs: PackedWeights) -> torch.Tensor:
    """``module(x)`` through oneDNN on the weight's reordered copy: x [..., in] -> [..., out], in the
    weight's format (the op has no autocast rule, so the input is cast here as autocast would)."""
    weight = packs.of(module)
    if weight is None:
        return plain_linear(module, x, packs)
    bias = None if module.bias is None else module.bias.to(module.weight.dtype)
    return torch.ops.mkldnn._linear_pointwise(x.to(module.weight.dtype), weight, bias, "none", [], "")


LAYOUTS = (plain_linear, transposed_linear, packed_linear)


@dataclass
class Timings:
    """Calls and seconds of each layout for one (output size, input size, rows up to, format)."""

    calls: list[int] = field(default_factory=lambda: [0] * len(LAYOUTS))
    seconds: list[float] = field(default_factory=lambda: [0.0] * len(LAYOUTS))
    left_out: set[int] = field(default_factory=set)
    """Layouts this CPU cannot run for the shape's format."""

    def candidates(self) -> list[int]:
        return [i for i in range(len(self.calls)) if i not in self.left_out]

    @property
    def decided(self) -> bool:
        return min(self.calls[i] for i in self.candidates()) > SAMPLES  # the first call of each is not timed

    def layout(self) -> int:
        if self.decided:
            return min(self.candidates(), key=lambda i: self.seconds[i] / (self.calls[i] - 1))
        return min(self.candidates(), key=lambda i: self.calls[i])


class SkinnyProducts:
    """Per (output size, input size, rows rounded up to a power of two, format), the fastest layout of a
    decode step's product, learnt from the decode steps' own calls. One instance serves many rollouts of
    one model (the sampler keeps it), so a shape and row count is measured once per run.

    Args:
        clock: seconds, for the call timings (tests pass a fake one).
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.table: dict[tuple[int, int, int, torch.dtype], Timings] = {}
        # the decided entries' layouts: a decode step makes a few hundred calls, each looked up here alone
        self._fixed: dict[tuple[int, int, int, torch.dtype], Callable] = {}

    def chosen(self) -> dict[tuple[int, int, int, torch.dtype], str]:
        """(output size, input size, rows up to, weight format) -> the layout chosen, for the decided ones."""
        return {k: LAYOUT_NAMES[t.layout()] for k, t in sorted(self.table.items(), key=str) if t.decided}

    def linear(self, module: nn.Linear, x: torch.Tensor, packs: PackedWeights) -> torch.Tensor:
        """``module(x)`` in the layout chosen for its shape and row count (or on trial)."""
        weight = module.weight
        rows = x.numel() // x.shape[-1]
        key = (module.out_features, module.in_features, 1 << (rows - 1).bit_length(), weight.dtype)
        fixed = self._fixed.get(key)
        if fixed is not None:
            return fixed(module, x, packs)
        timings = self.table.setdefault(key, Timings())
        layout = timings.layout()
        if timings.decided:
            self._fixed[key] = LAYOUTS[layout]
            return LAYOUTS[layout](module, x, packs)
        if layout == PACKED and packs.of(module) is None:  # the reorder is paid before the clock starts
            if packs.supports(weight):  # no room for the copy in this loop: plain, and not timed
                return plain_linear(module, x, packs)
            timings.left_out.add(PACKED)
            layout = timings.layout()
        start = self.clock()
        y = LAYOUTS[layout](module, x, packs)
        if timings.calls[layout]:
            timings.seconds[layout] += self.clock() - start
        timings.calls[layout] += 1
        return y

    @contextlib.contextmanager
    def step(self, linears: list[nn.Linear], rows: int, packs: PackedWeights) -> Iterator[None]:
        """Run one decode step of ``rows`` rows inside; ``linears`` are the model's matrix products and
        ``packs`` the decode loop's reordered weights."""
        weight = linears[0].weight if linears else None
        if rows > MAX_ROWS or weight is None or weight.device.type != "cpu" or not _rerouted(weight):
            yield
            return
        with rerouted(linears, lambda m, x: self.linear(m, x, packs)):
            yield


@contextlib.contextmanager
def rerouted(linears: list[nn.Module], product: Callable[[nn.Module, torch.Tensor], torch.Tensor]) -> Iterator[None]:
    """Inside, each of ``linears`` computes ``product(module, x)`` when called (an instance attribute shadows the
    class's forward); their own forwards are back afterwards, whatever happened inside."""
    for m in linears:
        m.forward = lambda x, m=m: product(m, x)
    try:
        yield
    finally:
        for m in linears:
            m.__dict__.pop("forward", None)


def _rerouted(weight: torch.Tensor) -> bool:
    """fp32 weights outside autocast, or bf16 weights under bf16 autocast (what autocast would compute)."""
    if torch.is_autocast_enabled("cpu"):
        return weight.dtype == torch.bfloat16 == torch.get_autocast_dtype("cpu")
    return weight.dtype == torch.float32


def model_linears(model: nn.Module) -> list[nn.Linear]:
    """The ``nn.Linear`` modules of ``model`` (peft's LoRA layers wrap theirs: the wrapped ones count)."""
    return [m for m in model.modules() if type(m) is nn.Linear]
