"""Training under autocast without a second copy of the weights alive through the backward pass.

Under bf16 autocast every fp32 weight is cast to bf16 for its product, and autograd saves that cast
for the backward pass (``grad_input = grad_output @ W``). So from a micro-batch's forward to the end
of its backward the pass holds a bf16 copy of every weight: half the fp32 model (257 MiB for
SmolLM2-135M), more than the activations of an 8-row micro-batch of a hundred tokens.

:func:`weight_casts_recomputed` keeps a reference to the fp32 weight instead of its cast and casts it
again when the backward pass needs it: the same bf16 values (a cast is exact and deterministic), so
the same gradients, with one layer's cast alive at a time. What it costs is one more cast of each
weight per micro-batch (reading the fp32 weights once more). Autocast's own cache, which would keep
every cast until the autocast region ends, is turned off for such a pass (``cache_enabled=False``):
each weight is used once per forward, except a tied LM head, which the head's pass casts once
itself.

Only casts of trainable leaf weights are recognised (their ``grad_fn`` is the cast, whose next node
accumulates into the weight); a frozen weight's cast (LoRA's base) has no such trace and is saved as
usual.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

_CAST_NODE = "ToCopyBackward0"


@dataclass(frozen=True)
class _Recast:
    """What a saved cast of ``weight`` (or a view of one: a linear saves the transpose) is kept as:
    the weight, the format to cast it to and the view's geometry."""

    weight: torch.Tensor
    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


def _cast_source(t: torch.Tensor) -> torch.Tensor | None:
    """The fp32 leaf weight whose whole cast ``t`` is, or is a view of; None otherwise."""
    cast = t if t._base is None else t._base
    node = cast.grad_fn
    if node is None or type(node).__name__ != _CAST_NODE or not cast.is_floating_point():
        return None
    nexts = node.next_functions
    if len(nexts) != 1 or nexts[0][0] is None or not hasattr(nexts[0][0], "variable"):
        return None
    weight = nexts[0][0].variable  # an AccumulateGrad node: its leaf
    if weight.dtype != torch.float32 or cast.element_size() >= weight.element_size() or weight.shape != cast.shape:
        return None
    if weight.device != cast.device or cast.storage_offset() != 0 or not cast.is_contiguous():
        return None
    return weight


def _pack(t: torch.Tensor) -> torch.Tensor | _Recast:
    weight = _cast_source(t)
    if weight is None:
        return t
    return _Recast(weight, t.dtype, tuple(t.size()), tuple(t.stride()), t.storage_offset())


def _unpack(saved: torch.Tensor | _Recast) -> torch.Tensor:
    if isinstance(saved, _Recast):
        return saved.weight.to(saved.dtype).as_strided(saved.size, saved.stride, saved.offset)
    return saved


@contextlib.contextmanager
def weight_casts_recomputed() -> Iterator[None]:
    """Within: autograd saves a reference to each trainable fp32 weight instead of its low-precision
    cast, and casts it again in the backward pass. Use it with ``torch.autocast(...,
    cache_enabled=False)`` (autocast's cache would keep every cast alive until its region ends)."""
    with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
        yield
