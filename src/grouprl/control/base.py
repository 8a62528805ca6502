"""The interface every classic-control algorithm implements (the trainer owns the optimizer and calls
:meth:`collect` then :meth:`update` once per iteration), and the critic-based ones' segment collection."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from grouprl.control.batch import EnvBatch
from grouprl.control.policies import Agent
from grouprl.control.rollout import SegmentCollector, Trajectories


class ControlAlgorithm:
    """One algorithm's rollout and update."""

    needs_critic = False

    def __init__(self, cfg: Any, agent: Agent, envs: EnvBatch, *, gamma: float, reward_scale: float, seed: int):
        self.cfg, self.agent, self.envs = cfg, agent, envs
        self.gamma, self.reward_scale, self.seed = gamma, reward_scale, seed

    @staticmethod
    def num_envs(cfg: Any) -> int:
        raise NotImplementedError

    def trainable(self) -> list[nn.Parameter]:
        return list(self.agent.parameters())

    def collect(self, generator: torch.Generator) -> Trajectories:
        raise NotImplementedError

    def update(self, batch: Trajectories, optimizer: torch.optim.Optimizer,
               generator: torch.Generator) -> dict[str, float]:
        raise NotImplementedError


class SegmentAlgorithm(ControlAlgorithm):
    """Collects ``steps_per_env`` steps from each of ``num_envs`` environments per iteration."""

    needs_critic = True

    def __init__(self, cfg: Any, agent: Agent, envs: EnvBatch, *, gamma: float, reward_scale: float, seed: int):
        super().__init__(cfg, agent, envs, gamma=gamma, reward_scale=reward_scale, seed=seed)
        self.collector = SegmentCollector(envs, seed)

    @staticmethod
    def num_envs(cfg: Any) -> int:
        return cfg.num_envs

    def collect(self, generator: torch.Generator) -> Trajectories:
        return self.collector.collect(self.agent.policy, self.cfg.steps_per_env, generator)


class Averager:
    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def add(self, metrics: dict[str, Any]) -> None:
        for k, v in metrics.items():
            v = float(v.detach()) if isinstance(v, torch.Tensor) else float(v)
            self.sums[k] = self.sums.get(k, 0.0) + v
            self.counts[k] = self.counts.get(k, 0) + 1

    def result(self) -> dict[str, float]:
        return {k: v / self.counts[k] for k, v in self.sums.items()}
