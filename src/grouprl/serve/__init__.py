"""Rollouts served by separate inference server processes (docs/servers.md).

- :mod:`grouprl.serve.server` and :mod:`grouprl.serve.routes`: ``grouprl serve``, vLLM's HTTP server
  with grouprl's weight and version routes on the same app;
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

from grouprl.serve.client import ServerSampler
from grouprl.serve.from_config import server_problems, server_sampler
from grouprl.serve.roster import RolloutServerError

__all__ = ["RolloutServerError", "ServerSampler", "server_problems", "server_sampler"]
