"""GiGPO for agents (:mod:`grouprl.algos.gigpo`): each policy turn gets its own advantage, from the episode's group
and from the group's turns that started in the same state (``info["state_key"]``, else the observation text)."""

from __future__ import annotations

import difflib
from typing import Any

import torch

from grouprl.algos import kl_per_token
from grouprl.algos.gigpo import gigpo_advantages, step_group_ids
from grouprl.trainer.collect import Collected
from grouprl.trainer.config import TrainerConfig
from grouprl.trainer.update import UpdateBatch


def token_turns(policy_mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` long: the policy turn each policy token belongs to (0, 1, ...), -1 elsewhere.

    >>> token_turns(torch.tensor([[1., 1., 0., 0., 1., 0.]])).tolist()
    [[0, 0, -1, -1, 1, -1]]
    """
    on = policy_mask > 0
    starts = on & ~torch.nn.functional.pad(on, (1, 0))[:, :-1]  # [B, T] first token of each run
    return torch.where(on, starts.long().cumsum(-1) - 1, torch.full_like(starts, -1, dtype=torch.long))


def key_ids(keys: list[list[Any]], groups: list[int], similarity: float | None) -> list[list[int]]:
    """Ids of the state keys, equal within a group for equal (or ``similarity``-close) keys; -1 for a missing key."""
    table: dict[tuple[int, str], int] = {}
    texts: dict[int, list[tuple[str, int]]] = {}  # group -> (representative text, its id)

    def key_id(key: Any, group: int) -> int:
        if key is None:
            return -1
        name = key if isinstance(key, str) else repr(key)
        found = table.get((group, name))
        if found is None and similarity is not None and isinstance(key, str):
            found = next((i for text, i in texts.get(group, [])
                          if difflib.SequenceMatcher(None, text, key).ratio() >= similarity), None)
        if found is None:
            found = len(table)
            texts.setdefault(group, []).append((name, found))
        table[(group, name)] = found
        return found

    return [[key_id(key, group) for key in row] for row, group in zip(keys, groups)]


class StepGroupBaseline:
    """GiGPO's advantages ``[B, T]``, one value per policy turn."""

    def __init__(self, config: TrainerConfig, reduce: Any):
        self.config = config

    def rows_in_loss(self, got: Collected, mask: torch.Tensor) -> torch.Tensor:
        """``[B]`` bool, all true: every turn keeps its step-group advantage."""
        return torch.ones(mask.shape[0], dtype=torch.bool, device=mask.device)

    def prepare(self, got: Collected, mask: torch.Tensor, old_logp: torch.Tensor | None, ref_logp: torch.Tensor | None,
                beta: float, step: int) -> tuple[UpdateBatch, dict[str, float], torch.Tensor]:
        c, batch, total = self.config, got.batch, got.rewards
        if c.kl_penalty_in_reward:  # r - beta * sum_t KL_t, charged to the last turn like the reward functions
            total = total - beta * (kl_per_token(old_logp, ref_logp, c.kl_estimator) * batch.completion_mask).sum(-1)
        if "step_rewards" not in batch.info:
            raise ValueError("advantage=gigpo compares the turns of multi-turn trajectories: train with an env")
        b = batch.batch_size
        groups = batch.group_ids if batch.group_ids is not None else torch.arange(b) // batch.group_size
        turns = token_turns(batch.completion_mask)  # [B, T]
        k = max(1, int(turns.max()) + 1)
        rewards, keys, step_mask = torch.zeros(b, k), torch.full((b, k), -1, dtype=torch.long), torch.zeros(b, k)
        ids = key_ids([list(s) for s in batch.info["state_keys"]], groups.tolist(), c.gigpo_similarity)
        for i, (earned, row_ids) in enumerate(zip(batch.info["step_rewards"], ids)):
            n = min(len(earned), k)
            rewards[i, :n] = torch.tensor(earned[:n], dtype=torch.float32)
            keys[i, :n] = torch.tensor(row_ids[:n], dtype=torch.long)
            step_mask[i, :n] = 1.0
            if n:  # what the reward functions added lands on the last turn
                rewards[i, n - 1] += float(total[i]) - sum(earned[:n])
        per_turn, metrics = gigpo_advantages(total, groups, rewards, keys, step_mask, gamma=c.gigpo_gamma,
                                             step_weight=c.gigpo_step_weight, scale=c.advantage_scale or "group",
                                             eps=c.advantage_eps)
        anchors = step_group_ids(groups, keys, step_mask)  # for the samples: which turns were compared
        lengths = step_mask.sum(1).long().tolist()
        batch.info["step_groups"] = [anchors[i, :n].tolist() for i, n in enumerate(lengths)]
        batch.info["turn_advantages"] = [per_turn[i, :n].tolist() for i, n in enumerate(lengths)]
        advantages = per_turn.gather(1, turns.clamp(min=0).clamp(max=k - 1)) * (turns >= 0)  # [B, T]
        constant = torch.zeros(b, dtype=torch.bool)
        data = UpdateBatch(rollout=batch, advantages=advantages, mask=mask, rewards=total, old_logp=old_logp,
                           ref_logp=None if c.kl_penalty_in_reward else ref_logp)
        return data, metrics, constant
