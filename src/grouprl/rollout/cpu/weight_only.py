"""Rollout formats whose one-token decode steps multiply other copies of the fp32 weights, everything else
staying fp32: ``bf16-weights`` (:mod:`grouprl.rollout.cpu.bf16_weights`). A decode loop makes each
weight's copy on first use and keeps it to the loop's end (the weights change between rollouts)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from grouprl.rollout.cpu import bf16_weights

Copy = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class WeightOnly:
    """How one weight-only format multiplies: which modules it takes, the copy it makes of a weight, and the
    product on that copy (x [..., in] -> [..., out] fp32)."""

    supported: Callable[[nn.Module], bool]
    copy: Callable[[torch.Tensor], Copy]
    linear: Callable[[nn.Module, torch.Tensor, Copy], torch.Tensor]
    unavailable: Callable[[], str | None]
    """Why the format cannot run on this machine, or None."""


BF16_WEIGHTS = WeightOnly(bf16_weights.supported, bf16_weights.pack, bf16_weights.bf16_weights_linear,
                          lambda: bf16_weights.unavailable())
"""bf16-weights' products (the ``bf16-weights`` entry of :data:`grouprl.rollout.formats.FORMATS`)."""


class Copies:
    """The copies one decode loop reads for the weight-only products ``fmt`` (weights do not change within it),
    made on first use and kept until the loop ends."""

    def __init__(self, fmt: WeightOnly) -> None:
        self.format = fmt
        # id(weight) -> (weight, its copy): holding the weight keeps its id from being reused meanwhile
        self.copies: dict[int, tuple[torch.Tensor, Copy]] = {}

    def of(self, module: nn.Module) -> Copy:
        weight = module.weight
        if id(weight) not in self.copies:
            self.copies[id(weight)] = (weight, self.format.copy(weight))
        return self.copies[id(weight)][1]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for _, copy in self.copies.values() for t in copy)


def weight_only_products(linears: list[nn.Module], copies: Copies) -> contextlib.AbstractContextManager[None]:
    """Inside, the ``linears`` that ``copies``' format supports run on their copies; the others run as they are."""
    fmt = copies.format
    return rerouted([m for m in linears if fmt.supported(m)], lambda m, x: fmt.linear(m, x, copies.of(m)))


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


def model_linears(model: nn.Module) -> list[nn.Linear]:
    """The ``nn.Linear`` modules of ``model`` (peft's LoRA layers wrap theirs: the wrapped ones count)."""
    return [m for m in model.modules() if type(m) is nn.Linear]
