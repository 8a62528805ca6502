"""Rollout formats whose one-token steps multiply other copies of the fp32 weights (``bf16-weights``), everything
else fp32. A decode loop copies each weight on first use and keeps it to the loop's end."""

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
    """How one weight-only format multiplies: the modules it takes, a weight's copy, the product on it."""

    supported: Callable[[nn.Module], bool]
    copy: Callable[[torch.Tensor], Copy]
    linear: Callable[[nn.Module, torch.Tensor, Copy], torch.Tensor]
    unavailable: Callable[[], str | None]


BF16_WEIGHTS = WeightOnly(bf16_weights.supported, bf16_weights.pack, bf16_weights.bf16_weights_linear,
                          lambda: bf16_weights.unavailable())


class Copies:
    """The weight copies one decode loop reads, made on first use."""

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
    """Inside, each of ``linears`` computes ``product(module, x)`` (an instance attribute shadows the forward)."""
    for m in linears:
        m.forward = lambda x, m=m: product(m, x)
    try:
        yield
    finally:
        for m in linears:
            m.__dict__.pop("forward", None)


def model_linears(model: nn.Module) -> list[nn.Linear]:
    """The plain ``nn.Linear`` modules of ``model`` (inside peft's LoRA layers too)."""
    return [m for m in model.modules() if type(m) is nn.Linear]
