"""TRPO for classic control (Schulman et al. 2015): whitened GAE advantages -> surrogate ``mean(rho * A)`` and its
gradient g -> ``F x = g`` by conjugate gradient on the analytic KL -> step ``sqrt(2 delta / x^T F x) * x`` with
backtracking -> the critic fitted to the GAE returns."""

from __future__ import annotations

import torch
from torch.distributions import kl_divergence

from grouprl.algos import fisher_vector_product, flat_grad, trpo_step, whiten
from grouprl.control.base import SegmentAlgorithm
from grouprl.control.critic_fit import critic_advantages, fit_critic
from grouprl.control.rollout import Trajectories


class ControlTRPO(SegmentAlgorithm):
    """Natural-gradient policy step in a KL trust region; critic fitted with Adam."""

    def trainable(self) -> list[torch.nn.Parameter]:
        return list(self.agent.critic.parameters())  # the policy moves by natural-gradient steps

    def update(self, batch: Trajectories, optimizer: torch.optim.Optimizer,
               generator: torch.Generator) -> dict[str, float]:
        c, policy = self.cfg, self.agent.policy
        adv, returns, _ = critic_advantages(self.agent.critic, batch, "gae", self.gamma, c.gae_lambda,
                                            reward_scale=self.reward_scale)
        adv = batch.flat(whiten(adv, batch.mask))  # [n]
        obs, actions, old_logp = batch.flat(batch.obs), batch.flat(batch.actions), batch.flat(batch.logp)
        params = [p for p in policy.parameters() if p.requires_grad]
        with torch.no_grad():
            old_dist = policy.distribution(obs)

        def surrogate() -> torch.Tensor:
            return (torch.exp(policy.distribution(obs).log_prob(actions) - old_logp) * adv).mean()

        def mean_kl() -> torch.Tensor:
            return kl_divergence(old_dist, policy.distribution(obs)).mean()

        loss = surrogate()
        g = flat_grad(loss, params)

        def evaluate(step: torch.Tensor) -> tuple[float, float]:
            with torch.no_grad():
                return float(surrogate() - loss), float(mean_kl())

        _, metrics = trpo_step(params, g, fisher_vector_product(mean_kl(), params, c.damping), evaluate,
                               max_kl=c.max_kl, cg_iters=c.cg_iters, backtracks=c.backtracks)
        critic_metrics = fit_critic(self.agent.critic, optimizer, obs, batch.flat(returns), c.value_epochs,
                                    c.value_minibatches, generator)
        with torch.no_grad():
            entropy = float(policy.distribution(obs).entropy().mean())
        return {**metrics, **critic_metrics, "loss/policy": -float(loss.detach()), "policy/entropy": entropy}
