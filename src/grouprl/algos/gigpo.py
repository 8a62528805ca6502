"""GiGPO (Group-in-Group Policy Optimization, Feng et al. 2025, arXiv 2505.10978): GRPO's
episode-level advantage plus a step-level one computed among the steps that start from the same state.

Shapes: E trajectories (episodes), K steps (turns) at most per trajectory; ``step_mask [E, K]`` marks real steps.

    A_episode(i) = (R_i - mean_{j in group(i)} R_j) / scale        one value per trajectory
    R_t          = r_t + gamma * R_{t+1}                           each step's discounted return
    A_step(i, t) = (R_t - mean_{anchor(i, t)} R) / scale            among the steps of one reset's
                                                                   trajectories whose state key is equal
    A(i, t)      = A_episode(i) + step_weight * A_step(i, t)

A step alone in its anchor group or without a key (``-1``) gets ``A_step = 0``; anchor groups never span
resets. ``scale``: ``"group"`` divides by the population std (the paper's), ``"none"`` only centres."""

from __future__ import annotations

import torch

from grouprl.algos.gae import discounted_returns
from grouprl.algos.group_advantages import compute_advantages


def step_group_ids(episode_groups: torch.Tensor, step_keys: torch.Tensor, step_mask: torch.Tensor) -> torch.Tensor:
    """``[E, K]`` long ids of the anchor groups: equal for steps of one episode group with one key;
    every step with key ``-1`` (or off the mask: -1 there too) its own group.

    >>> step_group_ids(torch.tensor([0, 0]), torch.tensor([[5, 6], [5, -1]]), torch.ones(2, 2)).tolist()
    [[0, 1], [0, 2]]
    """
    e, k = step_keys.shape
    pairs = torch.stack([episode_groups.long().unsqueeze(1).expand(e, k), step_keys.long()], -1).reshape(-1, 2)
    keyed = (step_keys.reshape(-1) >= 0) & (step_mask.reshape(-1) > 0)
    ids = torch.full((e * k,), -1, dtype=torch.long)
    seen: dict[tuple[int, int], int] = {}
    for n in range(e * k):  # numbered in order of first appearance, like the other groupings
        if keyed[n]:
            ids[n] = seen.setdefault((int(pairs[n, 0]), int(pairs[n, 1])), len(seen))
    singles = ~keyed & (step_mask.reshape(-1) > 0)
    ids[singles] = len(seen) + torch.arange(int(singles.sum()))
    return ids.view(e, k)


def gigpo_advantages(episode_returns: torch.Tensor, episode_groups: torch.Tensor, step_rewards: torch.Tensor,
                     step_keys: torch.Tensor, step_mask: torch.Tensor, *, gamma: float = 0.95,
                     step_weight: float = 1.0, scale: str = "group",
                     eps: float = 0.0) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-step advantages ``[E, K]`` (0 off the mask) and the anchor groups' statistics.

    ``episode_returns [E]``, ``episode_groups [E]`` (the reset each started from), ``step_rewards [E, K]``,
    ``step_keys [E, K]`` (state ids, -1 = no key), ``step_mask [E, K]``; ``gamma`` discounts the step returns,
    ``step_weight`` is w. Metrics: ``gigpo/step_groups`` (anchor groups of two or more),
    ``gigpo/step_group_size_mean``, ``gigpo/singleton_frac``."""
    mask = step_mask.float()
    a_episode = compute_advantages("grpo", episode_returns.float(), scale=scale, eps=eps,
                                   group_ids=episode_groups)  # [E]
    returns = discounted_returns(step_rewards.float(), mask, gamma)  # [E, K]
    ids = step_group_ids(episode_groups, step_keys, mask)  # [E, K]
    real = mask.reshape(-1) > 0
    flat_ids, flat_returns = ids.reshape(-1)[real], returns.reshape(-1)[real]  # [N]
    a_step = torch.zeros(mask.numel())
    if len(flat_ids):
        a_step[real] = compute_advantages("grpo", flat_returns, scale=scale, eps=eps, group_ids=flat_ids)
    advantages = (a_episode.unsqueeze(1) + step_weight * a_step.view_as(mask)) * mask
    sizes = torch.bincount(flat_ids) if len(flat_ids) else torch.zeros(0, dtype=torch.long)
    shared = sizes[sizes >= 2]
    metrics = {"gigpo/step_groups": float(len(shared)),
               "gigpo/step_group_size_mean": float(shared.float().mean()) if len(shared) else 0.0,
               "gigpo/singleton_frac": float((sizes == 1).sum()) / max(len(flat_ids), 1)}
    return advantages, metrics


def rounded_state_keys(obs: torch.Tensor, mask: torch.Tensor, decimals: int) -> torch.Tensor:
    """``[E, K]`` long state ids of continuous observations ``obs [E, K, D]``: equal where every coordinate
    rounds alike at ``decimals`` places (-1 off the ``[E, K]`` mask), so nearby states share an anchor group.

    >>> obs = torch.tensor([[[0.12, 1.0], [0.31, 1.0]], [[0.14, 1.0], [0.9, 0.0]]])
    >>> rounded_state_keys(obs, torch.tensor([[1., 1.], [1., 0.]]), 1).tolist()
    [[0, 1], [0, -1]]
    """
    e, k, d = obs.shape
    real = mask.reshape(-1) > 0
    ids = torch.full((e * k,), -1, dtype=torch.long)
    if real.any():
        # float64 before scaling: float32 * 10**decimals can round a boundary value the other way
        grid = torch.round(obs.reshape(-1, d)[real].double() * 10.0**decimals).long()  # [N, D]
        _, inverse = torch.unique(grid, dim=0, return_inverse=True)
        first = {}
        ids[real] = torch.tensor([first.setdefault(int(i), len(first)) for i in inverse], dtype=torch.long)
    return ids.view(e, k)

