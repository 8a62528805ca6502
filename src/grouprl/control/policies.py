"""Small MLP policies and critics for classic control: observations ``[N, D]`` -> a categorical (``Discrete``) or
diagonal Gaussian with a state-independent log-std (``Box``); orthogonal init, output gains 0.01 and 1."""

from __future__ import annotations

import math
from collections.abc import Sequence

import gymnasium as gym
import torch
from torch import nn
from torch.distributions import Categorical, Distribution, Independent, Normal
from torch.nn import functional as F

from grouprl.registry import Registry

ACTIVATIONS: Registry = Registry("activation")
ACTIVATIONS.register("tanh", torch.tanh)
ACTIVATIONS.register("relu", torch.relu)

POLICIES: Registry = Registry("policy head")  # action-space class name -> policy class


class MLP(nn.Module):
    """Linear layers ``[..., sizes[0]] -> ... -> [..., sizes[-1]]`` through ``F.linear`` (less call overhead)."""

    def __init__(self, sizes: Sequence[int], activation: str, out_gain: float):
        super().__init__()
        self.act = ACTIVATIONS.get(activation)
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        for i, linear in enumerate(self.layers):
            nn.init.orthogonal_(linear.weight, out_gain if i == len(self.layers) - 1 else math.sqrt(2))
            nn.init.zeros_(linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = len(self.layers) - 1
        for i, linear in enumerate(self.layers):
            x = F.linear(x, linear.weight, linear.bias)
            if i < last:
                x = self.act(x)
        return x


class Policy(nn.Module):
    """Observations ``[N, D]`` -> action distribution with batch shape ``[N]``."""

    def distribution(self, obs: torch.Tensor) -> Distribution:
        raise NotImplementedError

    def sample(self, obs: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``(actions, log-probs [N])`` drawn with ``generator``."""
        raise NotImplementedError

    def mode(self, obs: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


@POLICIES.register("Discrete")
class CategoricalPolicy(Policy):
    """Softmax over ``space.n`` actions; actions are ``[N]`` long."""

    def __init__(self, obs_dim: int, space: gym.spaces.Discrete, hidden: Sequence[int], activation: str = "tanh"):
        super().__init__()
        self.net = MLP([obs_dim, *hidden, int(space.n)], activation, out_gain=0.01)

    def distribution(self, obs: torch.Tensor) -> Categorical:
        return Categorical(logits=self.net(obs), validate_args=False)

    def sample(self, obs: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        # Direct ops rather than a Distribution object: this runs once per environment step.
        logp_all = torch.log_softmax(self.net(obs), dim=-1)  # [N, n_actions]
        actions = torch.multinomial(logp_all.exp(), 1, generator=generator)  # [N, 1]
        return actions.squeeze(-1), logp_all.gather(-1, actions).squeeze(-1)

    def mode(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs).argmax(-1)


@POLICIES.register("Box")
class GaussianPolicy(Policy):
    """``N(mu(s), diag(exp(log_std)^2))``; actions ``[N, A]`` float32, clipped by the environment, not here."""

    def __init__(self, obs_dim: int, space: gym.spaces.Box, hidden: Sequence[int], activation: str = "tanh",
                 init_log_std: float = 0.0):
        super().__init__()
        dim = int(space.shape[0])
        self.net = MLP([obs_dim, *hidden, dim], activation, out_gain=0.01)
        self.log_std = nn.Parameter(torch.full((dim,), float(init_log_std)))

    def distribution(self, obs: torch.Tensor) -> Independent:
        mean = self.net(obs)
        return Independent(Normal(mean, self.log_std.exp().expand_as(mean), validate_args=False), 1,
                           validate_args=False)

    def sample(self, obs: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        dist = self.distribution(obs)
        mean, std = dist.base_dist.loc, dist.base_dist.scale
        actions = mean + std * torch.randn(mean.shape, generator=generator)
        return actions, dist.log_prob(actions)

    def mode(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)


class ValueNet(nn.Module):
    """A critic: observations ``[..., D]`` -> state values ``[...]``."""

    def __init__(self, obs_dim: int, hidden: Sequence[int], activation: str = "tanh"):
        super().__init__()
        self.net = MLP([obs_dim, *hidden, 1], activation, out_gain=1.0)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs).squeeze(-1)


class Agent(nn.Module):
    """A policy and its value net (critic-based algorithms) as one module, for one checkpoint file."""

    def __init__(self, policy: Policy, critic: ValueNet | None = None):
        super().__init__()
        self.policy = policy
        self.critic = critic


def make_policy(obs_dim: int, action_space: gym.Space, hidden: Sequence[int], activation: str = "tanh") -> Policy:
    return POLICIES.get(type(action_space).__name__)(obs_dim, action_space, tuple(hidden), activation)
