"""PPO's critic for language models (Ziegler et al. 2019, Ouyang et al. 2022): GAE(gamma, lambda) over the
critic's values and token rewards gives whitened advantages and returns. One gradient-norm clip spans policy and
critic, so c_v sets the value loss's share of that norm. Rows whose reward is None are left out of the loss."""

from __future__ import annotations

from typing import Any

import torch

from grouprl.algos import aggregate, gae, kl_per_token, value_loss, whiten
from grouprl.models import load_policy
from grouprl.models.activations import checkpoint_activations
from grouprl.models.value_head import ValueModel, make_critic
from grouprl.run.optim import build_optimizer
from grouprl.trainer.collect import Collected
from grouprl.trainer.config import TrainerConfig
from grouprl.trainer.policy import model_device_type
from grouprl.trainer.update import UpdateBatch
from grouprl.types import RolloutBatch


def token_rewards(rewards: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor, beta: float) -> torch.Tensor:
    """PPO-RLHF's token rewards ``[B, T]``: the outcome reward ``rewards [B]`` on each row's last valid token (0 for
    a NaN reward) and ``-beta * KL_t`` on every token (``kl [B, T]``, 0 on padding).

    >>> kl = torch.tensor([[0.2, 0.1, 0.3], [0., 0., 0.]])
    >>> r = token_rewards(torch.tensor([1., 5.]), torch.tensor([[1., 1., 1.], [1., 1., 0.]]), kl, 0.1)
    >>> [[round(x, 6) for x in row] for row in r.tolist()]
    [[-0.02, -0.01, 0.97], [0.0, 5.0, 0.0]]
    """
    last = (mask.cumsum(-1) == mask.sum(-1, keepdim=True)) & (mask > 0)  # [B, T] one-hot of the last token
    outcome = torch.where(last, torch.nan_to_num(rewards.float(), nan=0.0).unsqueeze(-1), torch.zeros_like(mask))
    return outcome - beta * kl * mask


class Critic:
    """PPO's baseline and value loss: a value head on ``backbone``'s decoder, with its own AdamW."""

    def __init__(self, config: TrainerConfig, policy: torch.nn.Module, backbone: torch.nn.Module | None = None):
        c = self.config = config
        if backbone is None and c.critic_model != "copy":
            backbone, _ = load_policy(c.critic_model)
        self.model: ValueModel = make_critic(policy, backbone)
        if c.checkpointing:
            checkpoint_activations(self.model.body)
        self.optimizer, _ = build_optimizer(self.model.parameters(), c.critic_lr or c.lr, (c.adam_beta1, c.adam_beta2),
                                            c.weight_decay, 0, 1, "constant")

    def parameters(self) -> Any:
        return self.model.parameters()

    def warming_up(self, step: int) -> bool:
        """Steps at the start that train only the critic."""
        return step < self.config.critic_warmup_steps

    def checkpoint_parts(self) -> tuple[dict[str, Any], dict[str, torch.nn.Module]]:

        return {"critic_optimizer": self.optimizer}, {"critic": self.model}

    def values(self, batch: RolloutBatch, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Critic values ``[B, T]`` (or of ``rows``, with grad); without rows, no grad, in micro-batches."""
        autocast = torch.autocast(model_device_type(self.model), dtype=torch.bfloat16, enabled=self.config.train_bf16)
        pick = lambda r: (batch.prompt_ids[r], batch.prompt_mask[r], batch.completion_ids[r], batch.completion_mask[r])  # noqa: E731
        if rows is not None:
            with autocast:
                return self.model(*pick(rows))
        self.model.eval()
        with torch.no_grad(), autocast:
            return torch.cat([self.model(*pick(chunk))
                              for chunk in torch.arange(batch.batch_size).split(self.config.micro_batch_size)])

    def rows_in_loss(self, got: Collected, mask: torch.Tensor) -> torch.Tensor:
        """``[B]`` bool, all true: GAE runs over every row."""
        return torch.ones(mask.shape[0], dtype=torch.bool, device=mask.device)

    def prepare(self, got: Collected, mask: torch.Tensor, old_logp: torch.Tensor | None,
                ref_logp: torch.Tensor | None, beta: float, step: int) -> tuple[UpdateBatch, dict[str, float], None]:
        """(the update's inputs with GAE advantages ``[B, T]``, metrics, None: no group statistics)."""
        c = self.config
        mask = mask * (~torch.isnan(got.rewards)).unsqueeze(-1).to(mask.dtype)
        values = self.values(got.batch)  # V(s_t)
        kl = (torch.zeros_like(mask) if ref_logp is None or old_logp is None
              else kl_per_token(old_logp, ref_logp, c.kl_estimator) * mask)
        per_token = token_rewards(got.rewards, mask, kl, beta if c.kl_penalty_in_reward else 0.0)
        advantages, returns = gae(per_token, values, mask, c.gamma, c.gae_lambda)
        if c.whiten_advantages:
            advantages = whiten(advantages, mask)
        tokens = mask.sum().clamp(min=1)
        metrics = {"value/mean": float((values * mask).sum() / tokens), "critic/warmup": float(self.warming_up(step))}
        if old_logp is not None and ref_logp is not None:
            metrics.update({"policy/kl": float(kl.sum() / tokens), "policy/kl_sequence": float(kl.sum(-1).mean())})
        data = UpdateBatch(rollout=got.batch, advantages=advantages, mask=mask, rewards=got.rewards, old_logp=old_logp,
                           ref_logp=None if c.kl_penalty_in_reward else ref_logp, values=values, returns=returns)
        return data, metrics, None

    def loss(self, batch: RolloutBatch, micro: torch.Tensor, part: dict[str, torch.Tensor | None], n_rows: float,
             n_tokens: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """c_v * the clipped value loss of rows ``micro``, aggregated like the policy loss."""
        c = self.config
        self.model.train()
        vl, metrics = value_loss(self.values(batch, micro), part["values"], part["returns"], part["mask"], c.vf_clip)
        term = c.vf_coef * aggregate(vl, part["mask"], c.aggregation, max_tokens=c.max_new_tokens,
                                     group_size=c.group_size, num_rows=n_rows, num_tokens=n_tokens)
        metrics["loss/value"] = term.detach()
        return term, metrics
