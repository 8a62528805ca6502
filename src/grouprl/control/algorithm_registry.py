"""The classic-control algorithms by name: ``ALGORITHMS.get("ppo")`` -> :class:`ControlPPO`."""

from __future__ import annotations

from grouprl.control.base import ControlAlgorithm
from grouprl.control.grpo import ControlGRPO
from grouprl.control.ppo import ControlPPO
from grouprl.control.trpo import ControlTRPO
from grouprl.control.vpg import ControlVPG
from grouprl.registry import Registry

ALGORITHMS: Registry[type[ControlAlgorithm]] = Registry("classic-control algorithm")
ALGORITHMS.register("grpo", ControlGRPO)
ALGORITHMS.register("ppo", ControlPPO)
ALGORITHMS.register("trpo", ControlTRPO)
ALGORITHMS.register("vpg", ControlVPG)
