"""What an update rule trains on, and the clipped-surrogate rule (GRPO, RLOO, REINFORCE, PPO).

The rule takes ``mu`` passes over the rollout in shuffled minibatches of whole groups; each
minibatch is one optimizer step, accumulated over micro-batches whose losses share the minibatch's
denominators, so the micro-batch size changes memory and speed, never the update. With a critic
(PPO) the value loss joins each micro-batch's loss and the critic's optimizer steps beside the
policy's, under one gradient-norm clip over both.

The policy-gradient term is ``policy_loss``'s (clip, cispo, sapo, gmpo: :mod:`grouprl.algos.policy_losses`).
Per-token weights on that term are folded into the advantages: the rollout correction's (formed here from
the update's own pass when it is on-policy) and, with ``top_entropy_quantile`` < 1, the high-entropy
selection, whose quantile is taken over the whole minibatch by one no-gradient pass before its micro-batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from grouprl.algos import entropy_threshold, grpo_loss, top_entropy_weights
from grouprl.run.optim import build_optimizer, clip_and_step
from grouprl.run.seed_streams import SHUFFLE_STREAM, generator
from grouprl.trainer.loss_variants import policy_options, rollout_correction
from grouprl.trainer.metrics import MetricAverager
from grouprl.trainer.policy import PolicyPasses, micro_batches
from grouprl.types import RolloutBatch

if TYPE_CHECKING:
    from grouprl.trainer.config import TrainerConfig


@dataclass
class UpdateBatch:
    """One rollout with everything the update needs; B rows (prompt-major, whole groups), T tokens."""

    rollout: RolloutBatch
    """The sampled completions."""
    advantages: torch.Tensor
    """[B] per completion (group baselines) or [B, T] per token (a critic's GAE, or weighted by the
    rollout importance correction)."""
    mask: torch.Tensor
    """[B, T] float 0/1: tokens that carry loss (completion tokens, minus masked rows)."""
    rewards: torch.Tensor | None = None
    """[B] the rewards the advantages were computed from (with ``kl_in_reward``, net of the KL)."""
    old_logp: torch.Tensor | None = None
    """[B, T] log-probs under the policy before the update; None when the update is on-policy."""
    ref_logp: torch.Tensor | None = None
    """[B, T] reference log-probs for the loss's KL term; None when the KL is not in the loss."""
    values: torch.Tensor | None = None
    """[B, T] the critic's values at rollout time (the clipped value loss's anchor)."""
    returns: torch.Tensor | None = None
    """[B, T] the critic's regression targets."""
    rollout_logp: torch.Tensor | None = None
    """[B, T] the rollout engine's log-probs of the sampled tokens, when the update forms the rollout
    importance weights from its own pass (on-policy: that pass is pi_old); None otherwise."""

    def rows(self, rows: torch.Tensor) -> dict[str, torch.Tensor | None]:
        """The per-row tensors of ``rows`` (a micro-batch), by name."""
        pick = lambda x: None if x is None else x[rows]  # noqa: E731
        return {"advantages": pick(self.advantages), "mask": self.mask[rows], "old_logp": pick(self.old_logp),
                "ref_logp": pick(self.ref_logp), "values": pick(self.values), "returns": pick(self.returns),
                "rollout_logp": pick(self.rollout_logp)}


class ClippedSurrogateUpdate:
    """mu passes of minibatch AdamW steps on GRPO's clipped surrogate with the KL term (and the
    critic's value loss when there is a critic); see the module docstring.

    Args:
        config: the trainer config.
        passes: the policy's log-prob passes.
        processes: the process group (denominators summed, loss scaled, per-process minibatches).
        critic: PPO's critic, or None.
    """

    def __init__(self, config: TrainerConfig, passes: PolicyPasses, processes: Any, critic: Any = None):
        self.config, self.passes, self.processes, self.critic = config, passes, processes, critic
        c = config
        steps_per_step = c.mu * (c.rollout_rows // c.minibatch_rows)
        self.optimizer, self.scheduler = build_optimizer(passes.policy.parameters(), c.lr, (c.adam_beta1, c.adam_beta2),
                                                         c.weight_decay, c.warmup_steps, c.total_steps * steps_per_step,
                                                         c.lr_schedule)

    def checkpoint_parts(self) -> dict[str, Any]:
        """What a checkpoint must hold to resume this rule exactly."""
        return {"optimizer": self.optimizer, "scheduler": self.scheduler}

    def update(self, data: UpdateBatch, step: int, beta: float) -> dict[str, float]:
        """Train on ``data``; ``beta`` weighs the loss's KL term. Returns the update's metrics."""
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
                # Rows with nothing in the loss (dropped all-equal groups) would add exact zeros: no pass for them
                # (a critic still learns from them).
                live = None if self.critic is not None else data.mask.sum(-1) > 0
                passes = micro_batches(rows, live, c.micro_batch_size, self.processes.world_size > 1)
                selected = self.high_entropy_tokens(data, passes, avg) if c.top_entropy_quantile < 1 else None
                for micro in passes:
                    loss, m = self.micro_loss(data, micro, step, beta, n_rows, n_tokens, selected)
                    loss.backward()
                    avg.add(m, float(data.mask[micro].sum()))
                avg.add({"optim/grad_norm": self.optimizer_step(step)}, 1.0)
                avg.optimizer_steps += 1
        # Spent: held to the next update they would sit under the rollout's engine and KV cache.
        self.optimizer.zero_grad(set_to_none=True)
        policy.eval()
        out = avg.result()
        out["optim/lr"] = self.scheduler.get_last_lr()[0]
        return out

    def high_entropy_tokens(self, data: UpdateBatch, passes: list[torch.Tensor], avg: MetricAverager) -> torch.Tensor:
        """``[B, T]`` float 0/1 over the rows of ``passes`` (a minibatch's micro-batches; 0 elsewhere): the loss
        tokens in the top ``top_entropy_quantile`` of the policy's entropy over the minibatch's loss tokens in
        every process (:mod:`grouprl.algos.token_selection`), from one pass without gradient."""
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
        """The loss of rows ``micro`` of a minibatch of ``n_rows`` rows and ``n_tokens`` tokens (the
        shared denominators), scaled to this process's share of the batch gradient; ``selected`` (``[B, T]``
        0/1, or None for every token) weighs each token's policy-gradient term."""
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
        """Clip the joint gradient norm of policy (and critic), step the policy (not while the critic
        warms up: its schedule starts with its first step) and the critic; the norm before clipping."""
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
    """``[B]`` or ``[B, T]`` advantages times per-token ``weights [B, T]`` (>= 0): ``[B, T]``. Every policy loss
    is linear in a non-negative factor on the advantage (grouprl.algos.policy_losses), so this weighs each
    token's policy-gradient term and nothing else."""
    return (advantages if advantages.dim() == 2 else advantages.unsqueeze(-1)) * weights
