"""Advantages without a critic: each completion's group-relative score (an estimator of
:data:`grouprl.algos.ADVANTAGES`); ``kl_in_reward`` first charges r_i - beta * sum_t KL_it to the reward."""

from __future__ import annotations

from typing import Any

import torch

from grouprl.algos import compute_advantages, constant_rows, kl_per_token
from grouprl.algos.group_advantages import ADVANTAGES, COMPLETION, STEP
from grouprl.registry import Registry
from grouprl.trainer.collect import Collected
from grouprl.trainer.config import TrainerConfig
from grouprl.trainer.steps import StepGroupBaseline
from grouprl.trainer.update import UpdateBatch


class GroupBaseline:
    """Group-relative advantages (``[B]``); ``reduce`` sums a batch std over processes."""

    def __init__(self, config: TrainerConfig, reduce: Any):
        self.config, self.reduce = config, reduce

    def rows_in_loss(self, got: Collected, mask: torch.Tensor) -> torch.Tensor:
        """``[B]`` bool: the rows :meth:`prepare` leaves in the loss (all under ``kl_in_reward``), for the passes."""
        live = mask.sum(-1) > 0
        if self.config.kl_penalty_in_reward:
            return torch.ones_like(live)
        if self.config.zero_std_groups == "drop":
            heads, of = trajectory_heads(got.batch)
            live = live & ~constant_rows(got.rewards[heads], **self.grouping(got, heads))[of].to(live.device)
        return live

    def prepare(self, got: Collected, mask: torch.Tensor, old_logp: torch.Tensor | None, ref_logp: torch.Tensor | None,
                beta: float, step: int) -> tuple[UpdateBatch, dict[str, float], torch.Tensor]:
        """(the update's inputs, metrics, ``[B]`` bool rows of all-equal groups) for loss ``mask [B, T]``."""
        c = self.config
        rewards = got.rewards
        if c.kl_penalty_in_reward:  # r_i - beta * sum_t KL_t, measured on the policy that sampled
            kl = kl_per_token(old_logp, ref_logp, c.kl_estimator) * got.batch.completion_mask  # [B, T]
            rewards = rewards - beta * kl.sum(-1)
        heads, of = trajectory_heads(got.batch)  # a trajectory split into several rows counts once in its group
        grouping = self.grouping(got, heads)
        advantages = compute_advantages(c.advantage_estimator, rewards[heads], scale=c.advantage_scale,
                                        eps=c.advantage_eps, reduce=self.reduce, **grouping)[of]  # [B]
        constant = constant_rows(rewards[heads], **grouping)[of]  # [B]
        if c.zero_std_groups == "drop":
            mask = mask * (~constant).unsqueeze(-1).to(mask.dtype)
        data = UpdateBatch(rollout=got.batch, advantages=advantages, mask=mask, rewards=rewards, old_logp=old_logp,
                           ref_logp=None if c.kl_penalty_in_reward else ref_logp)
        return data, {}, constant

    def grouping(self, got: Collected, rows: torch.Tensor | None = None) -> dict[str, Any]:
        """The batch's ``group_ids`` (of ``rows``) where it has them, else contiguous groups of ``group_size``."""
        ids = got.batch.group_ids
        ids = ids if ids is None or rows is None else ids[rows.to(ids.device)]
        return {"group_size": None if ids is not None else self.config.group_size, "group_ids": ids}


def trajectory_heads(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(``[n]`` the first row of each of the batch's n trajectories, ``[B]`` each row's trajectory among them): rows
    that share ``info["trajectory_index"]`` are samples of one trajectory; otherwise each row is one."""
    index = batch.info.get("trajectory_index")
    if index is None:
        rows = torch.arange(batch.batch_size)
        return rows, rows
    _, of = torch.unique(torch.as_tensor(index, dtype=torch.long), return_inverse=True)  # [B] numbered 0..n-1
    heads = torch.tensor([of.tolist().index(k) for k in range(int(of.max()) + 1)], dtype=torch.long)
    return heads, of


BASELINES: Registry = Registry("advantage level")  # an estimator's declared level -> the class that computes it
BASELINES.register(COMPLETION, GroupBaseline)
BASELINES.register(STEP, StepGroupBaseline)


def make_baseline(config: TrainerConfig, reduce: Any) -> Any:
    """The group baseline of ``config.advantage_estimator``, by the level its registry entry declares."""
    return BASELINES.get(ADVANTAGES.get(config.advantage_estimator).level)(config, reduce)
