"""What an update rule trains on, and the clipped-surrogate rule (GRPO, RLOO, REINFORCE, PPO): ``mu`` passes of
shuffled minibatches of whole groups, one optimizer step each; micro-batches share the minibatch's denominators,
so their size changes memory, never the update."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from grouprl.algos import entropy_threshold, grpo_loss, top_entropy_weights
from grouprl.run.optim import build_optimizer, clip_and_step
from grouprl.run.seed_streams import SHUFFLE_STREAM, generator
from grouprl.trainer.config import TrainerConfig
from grouprl.trainer.loss_variants import policy_options, rollout_correction
from grouprl.trainer.metrics import MetricAverager
from grouprl.trainer.policy import PolicyPasses, micro_batches
from grouprl.types import RolloutBatch


@dataclass
class UpdateBatch:
    """One rollout with everything the update needs; B rows (whole groups), T tokens. ``old_logp`` is None
    on-policy, ``ref_logp`` without a KL in the loss, ``rollout_logp`` unless the update weighs from its own pass."""

    rollout: RolloutBatch
    advantages: torch.Tensor  # [B] per completion, or [B, T] per token
    mask: torch.Tensor  # [B, T] float 0/1: tokens that carry loss
    rewards: torch.Tensor | None = None  # [B], net of the KL under kl_in_reward
    old_logp: torch.Tensor | None = None  # [B, T] pi_old
    ref_logp: torch.Tensor | None = None  # [B, T] pi_ref
    values: torch.Tensor | None = None  # [B, T] the critic's at rollout time: the clipped value loss's anchor
    returns: torch.Tensor | None = None  # [B, T] the critic's targets
    rollout_logp: torch.Tensor | None = None  # [B, T]

    def rows(self, rows: torch.Tensor) -> dict[str, torch.Tensor | None]:
        picked = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("rollout", "rewards")}
        return {name: None if x is None else x[rows] for name, x in picked.items()}


class ClippedSurrogateUpdate:
    """mu passes of minibatch AdamW steps on ``policy_loss`` with the KL term (and a critic's value loss)."""

    def __init__(self, config: TrainerConfig, passes: PolicyPasses, processes: Any, critic: Any = None):
        self.config, self.passes, self.processes, self.critic = config, passes, processes, critic
        c = config
        steps_per_step = c.mu * (c.rollout_rows // c.minibatch_rows)
        self.optimizer, self.scheduler = build_optimizer(passes.policy.parameters(), c.lr, (c.adam_beta1, c.adam_beta2),
                                                         c.weight_decay, c.warmup_steps, c.total_steps * steps_per_step,
                                                         c.lr_schedule)

    def checkpoint_parts(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer, "scheduler": self.scheduler}

    def update(self, data: UpdateBatch, step: int, beta: float) -> dict[str, float]:
        c, g = self.config, self.config.group_size
        avg = MetricAverager()
        policy = self.passes.policy
        policy.train()
        groups_per_minibatch = c.minibatch_rows // g // self.processes.world_size
        for epoch in range(c.mu):
            order = torch.randperm(data.rollout.num_groups, generator=generator(c.seed, step, SHUFFLE_STREAM + epoch))
            for mb in order.split(groups_per_minibatch):
                rows = data.rollout.rows_of_groups(mb)
                mask = data.mask[rows]
                n_rows, n_tokens = self.processes.sum(torch.tensor([float((mask.sum(-1) > 0).sum()),
                                                                    float(mask.sum())], dtype=torch.float64)).tolist()
                self.optimizer.zero_grad(set_to_none=True)
                if n_tokens == 0:  # every row masked out: a step would only apply momentum
                    avg.add({"optim/skipped": 1.0}, 1.0)
                    continue
                # Rows with nothing in the loss add exact zeros: no pass for them (a critic still learns from them).
                live = None if self.critic is not None else data.mask.sum(-1) > 0
                passes = micro_batches(rows, live, c.micro_batch_size, self.processes.world_size > 1)
                selected = self.high_entropy_tokens(data, passes, avg) if c.top_entropy_quantile < 1 else None
                for micro in passes:
                    loss, m = self.micro_loss(data, micro, step, beta, n_rows, n_tokens, selected)
                    loss.backward()
                    avg.add(m, float(data.mask[micro].sum()))
                avg.add({"optim/grad_norm": self.optimizer_step(step)}, 1.0)
                avg.optimizer_steps += 1
        # Freed, not held under the next rollout's KV cache.
        self.optimizer.zero_grad(set_to_none=True)
        policy.eval()
        out = avg.result()
        out["optim/lr"] = self.scheduler.get_last_lr()[0]
        return out

    def high_entropy_tokens(self, data: UpdateBatch, passes: list[torch.Tensor], avg: MetricAverager) -> torch.Tensor:
        """``[B, T]`` 0/1: the loss tokens of ``passes`` in the top ``top_entropy_quantile`` of the entropy."""
        entropy = torch.zeros_like(data.mask)
        with torch.no_grad():
            for micro in passes:
                entropy[micro] = self.passes.logprobs(self.passes.policy, data.rollout, micro,
                                                      with_entropy=True)[1].to(entropy.dtype)
        rows = torch.cat(passes)
        mine = entropy[rows][data.mask[rows] > 0].cpu()
        threshold = entropy_threshold(torch.cat(self.processes.gather(mine)), self.config.top_entropy_quantile)
        selected = top_entropy_weights(entropy, data.mask, threshold.to(entropy.device))
        kept = float(selected[rows].sum()) / max(float(data.mask[rows].sum()), 1.0)
        avg.add({"policy/entropy_threshold": float(threshold), "policy/entropy_selected_frac": kept}, 1.0)
        return selected

    def micro_loss(self, data: UpdateBatch, micro: torch.Tensor, step: int, beta: float, n_rows: float,
                   n_tokens: float, selected: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss of rows ``micro`` over the minibatch's ``n_rows`` and ``n_tokens``, as this process's share."""
        c = self.config
        part = data.rows(micro)
        total, metrics = torch.zeros(()), {}
        if self.critic is not None:
            total, metrics = self.critic.loss(data.rollout, micro, part, n_rows, n_tokens)
        if self.critic is None or not self.critic.warming_up(step):  # while the critic warms up, no policy pass
            logp, entropy = self.passes.logprobs(self.passes.policy, data.rollout, micro, with_entropy=True)
            advantages, is_metrics = part["advantages"], {}
            if part["rollout_logp"] is not None:  # on-policy: this pass, detached, is pi_old
                weights, is_metrics = rollout_correction(c, logp.detach(), part["rollout_logp"], part["mask"])
                advantages = weighted(advantages, weights)
            if selected is not None:
                advantages = weighted(advantages, selected[micro])
            loss, policy_metrics = grpo_loss(
                logp, part["old_logp"], part["ref_logp"], advantages, part["mask"], beta=beta,
                kl_estimator=c.kl_estimator, aggregation=c.aggregation, entropy=entropy, entropy_coef=c.entropy_coef,
                max_tokens=c.max_new_tokens, group_size=c.group_size, num_rows=n_rows, num_tokens=n_tokens,
                policy_loss=c.policy_loss, **policy_options(c))
            total = total + loss
            metrics = {**policy_metrics, **is_metrics, **metrics, "loss/total": total.detach()}
        return total * self.processes.loss_scale(), metrics

    def optimizer_step(self, step: int) -> float:
        """Clip the joint norm of policy and critic, step both (the policy not in warm-up); the norm before clip."""
        c = self.config
        params = [p for p in self.passes.policy.parameters() if p.requires_grad]
        if self.critic is None:
            return clip_and_step(params, self.optimizer, c.max_grad_norm, self.scheduler)
        params += [p for p in self.critic.parameters() if p.requires_grad]
        if self.critic.warming_up(step):
            norm = clip_and_step(params, self.critic.optimizer, c.max_grad_norm)
        else:
            norm = clip_and_step(params, self.optimizer, c.max_grad_norm, self.scheduler)
            self.critic.optimizer.step()
        self.critic.optimizer.zero_grad(set_to_none=True)
        return norm


def weighted(advantages: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``[B]`` or ``[B, T]`` advantages times ``weights [B, T]`` (>= 0): ``[B, T]``. Every policy loss is linear in a
    non-negative factor on the advantage, so this weighs each token's policy-gradient term and nothing else."""
    return (advantages if advantages.dim() == 2 else advantages.unsqueeze(-1)) * weights
