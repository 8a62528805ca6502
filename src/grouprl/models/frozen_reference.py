"""The frozen reference pi_ref of the KL term: a copy of the policy, or with LoRA the base with adapters disabled."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch

from grouprl.models.loading import resolve_dtype
from grouprl.models.lora import is_peft, unwrap_ddp


def make_reference(policy: torch.nn.Module, dtype: torch.dtype | str | None = None) -> torch.nn.Module | None:
    """A frozen copy of ``policy`` in eval mode (optionally cast to ``dtype``), or None for a peft policy, whose
    reference is the base with the adapters disabled (:func:`reference_context`)."""
    if is_peft(policy):
        return None
    module, target = unwrap_ddp(policy), resolve_dtype(dtype)
    # cast tensor by tensor while copying: a whole copy first would stay with the allocator once freed
    memo: dict[int, object] = {}
    if target is not None:
        for t in (*module.parameters(), *module.buffers()):
            if t.is_floating_point():
                cast = t.detach().to(target)
                memo[id(t)] = torch.nn.Parameter(cast, requires_grad=False) if isinstance(t, torch.nn.Parameter) \
                    else cast
    reference = copy.deepcopy(module, memo)
    reference.eval()
    reference.requires_grad_(False)
    return reference


@contextlib.contextmanager
def reference_context(policy: torch.nn.Module, reference: torch.nn.Module | None = None) -> Iterator[torch.nn.Module]:
    """Yield the module that computes reference log-probs, under ``torch.no_grad``: the ``reference`` copy, or the
    peft policy with its adapters disabled (in eval mode, restored on exit)."""
    if reference is not None:
        with torch.no_grad():
            yield reference
        return
    if not is_peft(policy):
        raise ValueError("no reference model: pass reference=make_reference(policy) for a policy without LoRA")
    inner = unwrap_ddp(policy)
    was_training = inner.training
    inner.eval()
    try:
        with torch.no_grad(), inner.disable_adapter():
            yield inner
    finally:
        inner.train(was_training)
