"""Rollouts served by separate inference server processes (docs/servers.md).

- :mod:`grouprl.serve.server` and :mod:`grouprl.serve.routes`: ``grouprl serve``, vLLM's HTTP server
  with grouprl's weight and version routes on the same app; :mod:`grouprl.serve.guard` around it (the token,
  request limits), :mod:`grouprl.serve.pushes` (what a push is checked for before it loads: where from, which
  version, what files), :mod:`grouprl.serve.parent` (a server a run started ends with the run);
- :mod:`grouprl.serve.client`: :class:`ServerSampler`, the trainer's rollout engine over one or more
  servers (same interface as the in-process engines);
- :mod:`grouprl.serve.completions`: a server's answers, as the trainer reads them;
- :mod:`grouprl.serve.pool`: the HTTP connections, timeouts and fault handling, over the servers of
  :mod:`grouprl.serve.roster`; :mod:`grouprl.serve.returns`: a dropped server coming back;
- :mod:`grouprl.serve.transport`: how weights travel: safetensors folders, one per policy version, or a
  broadcast (:mod:`grouprl.serve.collective`, :mod:`grouprl.serve.gloo`; a server's side in
  :mod:`grouprl.serve.lease`);
- :mod:`grouprl.serve.local`: N servers started on this machine for one run, pinned to cores;
- :mod:`grouprl.serve.from_config`: a run's servers from its config (``rollout_servers``);
- :mod:`grouprl.serve.ranks`: servers shared by the processes of a torchrun trainer (process 0 pushes).

Nothing here imports ``vllm`` except the server itself.
"""

from __future__ import annotations

import importlib
from typing import Any

# Imported on first use: the config's checks read serve.transport's registry, and the command line would
# otherwise load the rollout engines (transformers, torch's compiler) before it says anything.
_LAZY = {
    "RolloutServerError": "grouprl.serve.roster",
    "ServerSampler": "grouprl.serve.client",
    "server_problems": "grouprl.serve.from_config",
    "server_sampler": "grouprl.serve.from_config",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'grouprl.serve' has no attribute {name!r}")


__all__ = sorted(_LAZY)
