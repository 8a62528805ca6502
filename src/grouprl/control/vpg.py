"""Vanilla policy gradient (Williams 1992) with a learned baseline: critic advantages -> one step on
``-mean_t(log pi(a_t|s_t) * A_t)`` -> the critic regressed on the returns. No clipping, trust region or reuse."""

from __future__ import annotations

import torch

from grouprl.algos import grpo_loss, whiten
from grouprl.control.base import SegmentAlgorithm
from grouprl.control.critic_fit import critic_advantages, fit_critic
from grouprl.control.rollout import Trajectories
from grouprl.run.optim import clip_and_step


class ControlVPG(SegmentAlgorithm):
    """REINFORCE with a critic baseline; the advantage estimator is ``cfg.advantage``."""

    def update(self, batch: Trajectories, optimizer: torch.optim.Optimizer,
               generator: torch.Generator) -> dict[str, float]:
        c, policy = self.cfg, self.agent.policy
        adv, returns, _ = critic_advantages(self.agent.critic, batch, c.advantage, self.gamma, c.gae_lambda, c.nstep,
                                            self.reward_scale)
        if c.whiten_advantages:
            adv = whiten(adv, batch.mask)
        dist = policy.distribution(batch.obs)  # batch shape [B, T]
        loss, metrics = grpo_loss(dist.log_prob(batch.actions), None, None, adv, batch.mask,
                                  aggregation="token-mean", entropy=dist.entropy(), entropy_coef=c.entropy_coef)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = clip_and_step(list(policy.parameters()), optimizer, c.max_grad_norm)
        critic_metrics = fit_critic(self.agent.critic, optimizer, batch.flat(batch.obs), batch.flat(returns),
                                    c.value_epochs, c.value_minibatches, generator, c.max_grad_norm)
        keep = ("loss/policy", "loss/total", "policy/entropy")
        return {**{k: float(metrics[k]) for k in keep if k in metrics}, **critic_metrics, "optim/grad_norm": norm}
