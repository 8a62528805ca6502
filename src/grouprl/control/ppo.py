"""PPO for classic control (Schulman et al. 2017): T steps from N environments -> GAE -> whiten -> mu passes of
minibatches minimising ``clip loss + c_v * value loss - c_H * entropy``."""

from __future__ import annotations

import torch

from grouprl.algos import clipped_surrogate_loss, value_loss, whiten
from grouprl.control.base import Averager, SegmentAlgorithm
from grouprl.control.critic_fit import critic_advantages
from grouprl.control.rollout import Trajectories
from grouprl.run.optim import clip_and_step


class ControlPPO(SegmentAlgorithm):
    """PPO with GAE, clipped surrogate, (optionally clipped) value loss and entropy bonus."""

    def update(self, batch: Trajectories, optimizer: torch.optim.Optimizer,
               generator: torch.Generator) -> dict[str, float]:
        c, critic = self.cfg, self.agent.critic
        adv, returns, values = critic_advantages(critic, batch, "gae", self.gamma, c.gae_lambda,
                                                 reward_scale=self.reward_scale)
        if c.whiten_advantages:
            adv = whiten(adv, batch.mask)
        obs, actions, old_logp = batch.flat(batch.obs), batch.flat(batch.actions), batch.flat(batch.logp)
        adv, returns, values = batch.flat(adv), batch.flat(returns), batch.flat(values)  # [n]
        params, avg = self.trainable(), Averager()
        for _ in range(c.mu):
            for idx in torch.randperm(len(obs), generator=generator).split(c.minibatch_size):
                dist = self.agent.policy.distribution(obs[idx])
                logp, entropy = dist.log_prob(actions[idx]), dist.entropy()  # [m]
                ones = torch.ones_like(logp).unsqueeze(-1)  # [m, 1]: each step is a row of one token
                pg, m = clipped_surrogate_loss(logp.unsqueeze(-1), old_logp[idx].unsqueeze(-1),
                                               adv[idx].unsqueeze(-1), ones, c.eps_low)
                vl, vm = value_loss(critic(obs[idx]).unsqueeze(-1), values[idx].unsqueeze(-1),
                                    returns[idx].unsqueeze(-1), ones, c.vf_clip)
                loss = pg.mean() + c.vf_coef * vl.mean() - c.entropy_coef * entropy.mean()
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                norm = clip_and_step(params, optimizer, c.max_grad_norm)
                avg.add({"loss/policy": pg.mean(), "loss/value": vl.mean(), "loss/total": loss.detach(),
                         "policy/entropy": entropy.mean().detach(), "optim/grad_norm": norm,
                         **{f"policy/{k}": v for k, v in m.items()}, **vm})
            if c.target_kl is not None and float(m["approx_kl"]) > c.target_kl:
                break
        out = avg.result()
        out["policy/approx_kl_old"] = out.pop("policy/approx_kl")
        return out
