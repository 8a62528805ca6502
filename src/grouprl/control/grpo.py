"""GRPO for classic control: a prompt is a reset seed, its group G episodes from it; every step of episode i gets
``(R_i - mean(R_group)) / std(R_group)`` (gigpo adds a step-level term). No critic."""

from __future__ import annotations

import copy

import torch

from grouprl.algos import compute_advantages, constant_groups, grpo_loss
from grouprl.algos.gigpo import gigpo_advantages, rounded_state_keys
from grouprl.algos.group_advantages import ADVANTAGES, STEP
from grouprl.control.base import Averager, ControlAlgorithm
from grouprl.control.batch import EnvBatch
from grouprl.control.policies import Agent
from grouprl.control.rollout import Trajectories, run_episodes
from grouprl.run.optim import clip_and_step
from grouprl.types import group_rows


class ControlGRPO(ControlAlgorithm):
    """Groups of episodes from shared reset seeds; group-relative return advantages."""

    def __init__(self, cfg, agent: Agent, envs: EnvBatch, *, gamma: float, reward_scale: float, seed: int):
        super().__init__(cfg, agent, envs, gamma=gamma, reward_scale=reward_scale, seed=seed)
        self.reference = copy.deepcopy(agent.policy).requires_grad_(False) if cfg.beta > 0 else None

    @staticmethod
    def num_envs(cfg) -> int:
        return cfg.prompts_per_step * cfg.group_size

    def collect(self, generator: torch.Generator) -> Trajectories:
        c = self.cfg
        seeds = torch.randint(0, 2**31 - 1, (c.prompts_per_step,), generator=generator)
        seeds = seeds.repeat_interleave(c.group_size).tolist()  # prompt-major: G copies of each seed
        return run_episodes(self.envs, self.agent.policy, seeds, generator, group_size=c.group_size)

    def update(self, batch: Trajectories, optimizer: torch.optim.Optimizer,
               generator: torch.Generator) -> dict[str, float]:
        c, g, policy = self.cfg, self.cfg.group_size, self.agent.policy
        returns = batch.row_returns()  # [B]
        step_metrics: dict[str, float] = {}
        if ADVANTAGES.get(c.advantage).level == STEP:  # [B, T]: each step its own advantage (GiGPO)
            keys = rounded_state_keys(batch.obs, batch.mask, c.state_key_decimals)
            adv, step_metrics = gigpo_advantages(returns, torch.arange(batch.num_rows) // g, batch.rewards, keys,
                                                 batch.mask, gamma=c.gigpo_gamma, step_weight=c.gigpo_step_weight,
                                                 scale=c.advantage_scale)
        else:
            adv = compute_advantages(c.advantage, returns, g, c.advantage_scale)  # [B], broadcast over steps
        params, avg = self.trainable(), Averager()
        for _ in range(c.mu):
            for groups in torch.randperm(batch.num_rows // g, generator=generator).split(c.minibatch_size // g):
                rows = group_rows(groups, g)
                dist = policy.distribution(batch.obs[rows])  # batch shape [b, T]
                logp = dist.log_prob(batch.actions[rows])
                ref_logp = None
                if self.reference is not None:
                    with torch.no_grad():
                        ref_logp = self.reference.distribution(batch.obs[rows]).log_prob(batch.actions[rows])
                loss, m = grpo_loss(logp, batch.logp[rows], ref_logp, adv[rows], batch.mask[rows], eps_low=c.eps_low,
                                    beta=c.beta, aggregation=c.aggregation, entropy=dist.entropy(),
                                    entropy_coef=c.entropy_coef, group_size=g)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                avg.add({**m, "optim/grad_norm": clip_and_step(params, optimizer, c.max_grad_norm)})
        out = {**avg.result(), **step_metrics}
        out["rollout/zero_std_frac"] = float(constant_groups(returns, g).float().mean())
        return out
