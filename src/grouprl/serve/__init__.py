"""Rollouts served by separate inference server processes (docs/servers.md): :mod:`.server` runs in the server
process (``grouprl serve``), :mod:`.client` in the trainer, :mod:`.weights` (how weights travel) in both. A run's
own servers, from its config, are :mod:`grouprl.trainer.rollout_servers`'s."""

from __future__ import annotations

import importlib
from typing import Any

# imported on first use: the command line would otherwise load the rollout engines before it says anything
_LAZY = {
    "RolloutServerError": "grouprl.serve.client.servers",
    "ServerSampler": "grouprl.serve.client.server_sampler",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'grouprl.serve' has no attribute {name!r}")


__all__ = sorted(_LAZY)
