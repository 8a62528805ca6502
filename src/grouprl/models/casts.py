"""Training under autocast without keeping casts the backward pass can have again for free.

Under bf16 autocast autograd saves the bf16 cast of every weight, and of an activation once per product that
reads it (q, k, v). :func:`lean_casts` saves the trainable fp32 weight and casts it again in backward, and one of
several alike casts: a cast is exact, so the gradients are the same.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

_CAST_NODE = "ToCopyBackward0"


@dataclass(frozen=True)
class _Recast:
    """A saved cast of ``weight`` (or a view of one: a linear saves the transpose), kept as the weight."""

    weight: torch.Tensor
    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class _Same:
    """A saved cast equal to one saved before in the pass: that one is kept, once."""
    tensor: torch.Tensor


def _cast_of(t: torch.Tensor) -> tuple[torch.Tensor, Any] | None:
    """(the whole cast ``t`` is or views, (the node of what was cast, its output index)), or None."""
    cast = t if t._base is None else t._base
    node = cast.grad_fn
    if node is None or type(node).__name__ != _CAST_NODE or not cast.is_floating_point():
        return None
    nexts = node.next_functions
    if len(nexts) != 1 or nexts[0][0] is None:
        return None
    return cast, nexts[0]


def _weight_of(cast: torch.Tensor, source: Any) -> torch.Tensor | None:
    """The fp32 leaf weight ``cast`` is a whole narrower cast of (``source`` as :func:`_cast_of` gives it), or None."""
    weight = getattr(source[0], "variable", None)  # an AccumulateGrad node holds its leaf
    if weight is None or weight.dtype != torch.float32 or cast.element_size() >= weight.element_size():
        return None
    if weight.shape != cast.shape or weight.device != cast.device or cast.storage_offset() != 0:
        return None
    return weight if cast.is_contiguous() else None


def _cast_source(t: torch.Tensor) -> torch.Tensor | None:
    """The fp32 leaf weight whose whole cast ``t`` is, or is a view of; None otherwise."""
    found = _cast_of(t)
    return None if found is None else _weight_of(*found)


class _Packer:
    def __init__(self) -> None:
        self.first: dict[tuple, torch.Tensor] = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor | _Recast | _Same:
        found = _cast_of(t)
        if found is None:
            return t
        geometry = (t.dtype, tuple(t.size()), tuple(t.stride()), t.storage_offset())
        weight = _weight_of(*found)
        if weight is not None:
            return _Recast(weight, *geometry)
        # the same output of the same node, cast and viewed alike, holds the same values (an in-place change in
        # between would have given the source a new node)
        key = (*found[1], geometry)
        if key in self.first:
            return _Same(self.first[key])
        self.first[key] = t
        return t

    @staticmethod
    def unpack(saved: torch.Tensor | _Recast | _Same) -> torch.Tensor:
        if isinstance(saved, _Recast):
            return saved.weight.to(saved.dtype).as_strided(saved.size, saved.stride, saved.offset)
        if isinstance(saved, _Same):
            return saved.tensor
        return saved


@contextlib.contextmanager
def lean_casts() -> Iterator[None]:
    """Within, autograd saves each trainable fp32 weight rather than its cast, and one of several alike casts.
    Use it with ``torch.autocast(..., cache_enabled=False)``: autocast's cache would keep every cast alive."""
    packer = _Packer()
    try:
        with torch.autograd.graph.saved_tensors_hooks(packer.pack, packer.unpack):
            yield
    finally:
        packer.first.clear()  # the graph keeps what it saved; the region's index goes
