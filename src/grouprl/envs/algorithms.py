"""The classic-control algorithms by name: ``ALGORITHMS.get("ppo")`` -> :class:`ControlPPO`."""

from __future__ import annotations

from grouprl.envs.base import ControlAlgorithm
from grouprl.envs.grpo import ControlGRPO
from grouprl.envs.ppo import ControlPPO
from grouprl.envs.trpo import ControlTRPO
from grouprl.envs.vpg import ControlVPG
from grouprl.registry import Registry

ALGORITHMS: Registry[type[ControlAlgorithm]] = Registry("classic-control algorithm")
ALGORITHMS.register("grpo", ControlGRPO)
ALGORITHMS.register("ppo", ControlPPO)
ALGORITHMS.register("trpo", ControlTRPO)
ALGORITHMS.register("vpg", ControlVPG)
