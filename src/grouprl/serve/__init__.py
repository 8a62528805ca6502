"""Rollouts served by separate inference server processes (docs/servers.md), in three parts by where they run:

- :mod:`grouprl.serve.server`: the server process, ``grouprl serve`` (vLLM's HTTP app with grouprl's routes);
- :mod:`grouprl.serve.client`: the trainer's side (the rollout engine over servers, connections, weight hand-over);
- :mod:`grouprl.serve.weights`: how weights travel between the two (folders of safetensors files, or a broadcast).

Nothing here imports ``vllm`` except the server itself.
"""

from __future__ import annotations

import importlib
from typing import Any

# Imported on first use: the config's checks read serve.transport's registry, and the command line would
# otherwise load the rollout engines (transformers, torch's compiler) before it says anything.
_LAZY = {
    "RolloutServerError": "grouprl.serve.client.servers",
    "ServerSampler": "grouprl.serve.client.server_sampler",
    "server_problems": "grouprl.serve.client.from_config",
    "server_sampler": "grouprl.serve.client.from_config",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'grouprl.serve' has no attribute {name!r}")


__all__ = sorted(_LAZY)
