"""What a collective push sends: the plain model's tensors in the servers' format, staged as a copy or read as the
broadcast reaches each; LoRA merged into the base (vLLM's weight transfer loads base weights only)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from grouprl.rollout.vllm_weights import base_weight_name


def lora_delta(module: Any, adapter: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``scale * B A`` of a peft LoRA layer's ``adapter`` from ``a`` [r, in] and ``b`` [out, r], as peft's
    ``get_delta_weight`` computes it."""
    from peft.utils.other import transpose

    half = a.device.type == "cpu" and a.dtype in (torch.float16, torch.bfloat16)
    product = b.float() @ a.float() if half else b @ a
    return (transpose(product, module.fan_in_fan_out) * module.scaling[adapter]).to(a.dtype)


def merged_lora_tensors(model: nn.Module, state: dict[str, torch.Tensor] | None = None
                        ) -> Iterator[tuple[str, torch.Tensor]]:
    """A peft model's weights with its active adapters merged in, under the plain names, one at a time; ``state``: its
    whole state dict (None: read from it)."""
    from peft.tuners.lora import LoraLayer

    state = model.state_dict() if state is None else state
    adapters: dict[str, list[tuple[str, Any, str]]] = {}
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            for adapter in module.active_adapters:
                if adapter in module.lora_A:
                    adapters.setdefault(f"{name}.base_layer.weight", []).append((name, module, adapter))
    for key, t in state.items():
        plain = base_weight_name(key)
        if plain is None:
            continue
        delta = None
        for name, module, adapter in adapters.get(key, ()):
            d = lora_delta(module, adapter, state[f"{name}.lora_A.{adapter}.weight"],
                           state[f"{name}.lora_B.{adapter}.weight"]).detach()
            delta = d if delta is None else delta + d
        yield plain, (t + delta.to(t.dtype) if delta is not None else t)


def tensors_to_send(model: nn.Module, dtype: torch.dtype,
                    state: dict[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]] | None = None
                    ) -> Iterator[tuple[str, torch.Tensor]]:
    """``model``'s weights as the servers load them, one at a time: plain names (LoRA merged), floating ones in
    ``dtype``, contiguous. ``state``: its state dict, or (without LoRA) its (name, tensor) pairs; None: read it."""
    state = model.state_dict() if state is None else state
    if hasattr(model, "peft_config"):
        named = merged_lora_tensors(model, dict(state))  # each base weight merged with its adapters
    else:
        named = state.items() if isinstance(state, dict) else state
    for name, t in named:
        t = t.detach()
        t = t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t
        yield name, t.contiguous()


def staged_copy(model: nn.Module, dtype: torch.dtype,
                state: dict[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]] | None = None
                ) -> list[tuple[str, torch.Tensor]]:
    """:func:`tensors_to_send`, each its own copy (the model may change before they are sent)."""
    held = set()
    for t in itertools.chain(model.parameters(), model.buffers()):
        local = t.to_local() if hasattr(t, "to_local") else t  # an FSDP shard: its process's part
        held.add(local.untyped_storage().data_ptr())
    return [(n, t.clone() if t.untyped_storage().data_ptr() in held else t)
            for n, t in tensors_to_send(model, dtype, state)]


class StagedWeights(list):
    """A push's (name, tensor) pairs copied when the weights were written (:func:`staged_copy`)."""

    def metadata(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        return [(n, t.dtype, tuple(t.shape)) for n, t in self]


class LiveWeights:
    """A push's tensors read from the model as they are sent: the model does not change before (synchronous)."""

    def __init__(self, model: nn.Module, dtype: torch.dtype):
        self.model, self.dtype = model, dtype

    def metadata(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        plain = base_weight_name if hasattr(self.model, "peft_config") else lambda name: name
        return [(plain(n), self.dtype if t.is_floating_point() else t.dtype, tuple(t.shape))
                for n, t in self.model.state_dict().items() if plain(n) is not None]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return tensors_to_send(self.model, self.dtype)


class StreamedWeights:
    """A push's tensors read once from a :class:`~.transport.Reading` as they are sent (FSDP gathers included)."""

    def __init__(self, read: Any, dtype: torch.dtype):
        self.read, self.dtype = read, dtype

    def metadata(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        return [(e.name, e.dtype, e.shape) for e in self.read.entries]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, t in self.read.tensors:
            yield name, (t.to(self.dtype) if t.is_floating_point() and t.dtype != self.dtype else t).contiguous()
            del t  # not held while the next one is gathered
