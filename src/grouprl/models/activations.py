"""Fewer activations kept for the backward pass of a Llama-family decoder, with the same numbers: an RMSNorm keeps
its input alone and SwiGLU ``gate`` and ``up``, recomputing the rest in backward with the same kernels. Only
module classes whose forward is known are changed (:data:`NORMS`, :data:`MLPS`)."""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

NORMS = frozenset({"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"})
"""RMSNorm classes computed as ``weight * (x * rsqrt(mean(x^2) + eps))`` with no state of their own."""
MLPS = frozenset({"LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP"})
"""Gated MLP classes computed as ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``."""


def _keeps_graph(x: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and x.requires_grad


def _norm_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """hidden [..., H] -> normalised [..., H]: the class's own forward, its intermediates recomputed in backward."""
    plain = type(self).forward
    if not _keeps_graph(x):
        return plain(self, x)
    return checkpoint(plain, self, x, use_reentrant=False)


def _gated(act: nn.Module, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return act(gate) * up


def _mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """hidden [..., H] -> [..., H] through [..., I]: ``act(gate)`` recomputed in backward."""
    gate, up = self.gate_proj(x), self.up_proj(x)
    if not _keeps_graph(gate):
        return self.down_proj(self.act_fn(gate) * up)
    return self.down_proj(checkpoint(_gated, self.act_fn, gate, up, use_reentrant=False))


LEAN_FORWARDS: dict[frozenset[str], Any] = {NORMS: _norm_forward, MLPS: _mlp_forward}


def keep_fewer_activations(model: nn.Module) -> int:
    """Give the known norm and MLP modules of ``model`` their lean forward, in place (idempotent); how many."""
    changed = 0
    for module in model.modules():
        name = type(module).__name__
        for names, forward in LEAN_FORWARDS.items():
            if name in names and getattr(module.forward, "__func__", None) is not forward:
                module.forward = types.MethodType(forward, module)
                changed += 1
    return changed


def checkpoint_activations(model: nn.Module) -> None:
    """Checkpoint each decoder layer of ``model`` in place, by whichever name the installed transformers has."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()
