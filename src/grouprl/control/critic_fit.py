"""What PPO, TRPO and VPG share: advantages from a value net over trajectory rows (cut rows bootstrap from
``V(last_obs)``, terminated ones from 0), and regressing the value net on its targets."""

from __future__ import annotations

import torch

from grouprl.algos import discounted_returns, gae, nstep_returns, value_loss
from grouprl.control.policies import ValueNet
from grouprl.control.rollout import Trajectories
from grouprl.registry import Registry

CRITIC_ADVANTAGES: Registry = Registry("critic advantage estimator")
"""name -> ``fn(rewards [B,T], values [B,T], mask [B,T], last_values [B], gamma, lam, n) -> (adv, returns)``."""


@CRITIC_ADVANTAGES.register("gae")
def _gae(rewards, values, mask, last_values, gamma, lam, n):
    return gae(rewards, values, mask, gamma, lam, last_values)


@CRITIC_ADVANTAGES.register("mc")
def _monte_carlo(rewards, values, mask, last_values, gamma, lam, n):
    returns = discounted_returns(rewards, mask, gamma, last_values)
    return (returns - values) * mask, returns


@CRITIC_ADVANTAGES.register("nstep")
def _nstep(rewards, values, mask, last_values, gamma, lam, n):
    returns = nstep_returns(rewards, values, mask, gamma, n, last_values)
    return (returns - values) * mask, returns


def values_of(critic: ValueNet, batch: Trajectories) -> tuple[torch.Tensor, torch.Tensor]:
    """``(V(obs) [B,T] with 0 on padding, bootstrap values [B])``: ``V(last_obs)`` on cut rows, else 0."""
    with torch.no_grad():
        values = critic(batch.obs) * batch.mask
        last = critic(batch.last_obs) * batch.cut.float()
    return values, last


def critic_advantages(critic: ValueNet, batch: Trajectories, estimator: str, gamma: float, lam: float = 1.0,
                      n: int = 1, reward_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(advantages [B,T], returns [B,T], values [B,T])`` under ``critic`` by ``estimator``; 0 on padding."""
    values, last = values_of(critic, batch)
    adv, returns = CRITIC_ADVANTAGES.get(estimator)(batch.rewards * reward_scale, values, batch.mask, last, gamma,
                                                    lam, n)
    return adv, returns, values


def fit_critic(critic: ValueNet, optimizer: torch.optim.Optimizer, obs: torch.Tensor, returns: torch.Tensor,
               epochs: int, minibatches: int, generator: torch.Generator,
               max_grad_norm: float = 0.0) -> dict[str, float]:
    """Regress ``critic(obs [n, D])`` on ``returns [n]`` (squared error); only the critic gets gradients."""
    n = obs.shape[0]
    ones = torch.ones(n, 1)
    last = {}
    for _ in range(epochs):
        for idx in torch.randperm(n, generator=generator).chunk(minibatches):
            v = critic(obs[idx]).unsqueeze(-1)  # [m, 1]
            loss, last = value_loss(v, v.detach(), returns[idx].unsqueeze(-1), ones[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.mean().backward()
            if max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(critic.parameters(), max_grad_norm)
            optimizer.step()
    return {k: float(v) for k, v in last.items()}
