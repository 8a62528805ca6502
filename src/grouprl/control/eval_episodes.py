"""Evaluation of a classic-control policy on fixed held-out reset seeds."""

from __future__ import annotations

import torch

from grouprl.control.batch import EnvBatch
from grouprl.control.policies import Policy
from grouprl.control.rollout import run_episodes

EVAL_SEED_BASE = 1_000_000_007  # evaluation seeds: EVAL_SEED_BASE + seed * 1000 + i, a fixed set


def eval_seeds(seed: int, episodes: int) -> list[int]:
    return [EVAL_SEED_BASE + seed * 1000 + i for i in range(episodes)]


def evaluate_policy(envs: EnvBatch, policy: Policy, seeds: list[int], deterministic: bool = True,
                    sample_seed: int = 0) -> dict[str, float]:
    """One episode per seed: ``eval/mean_reward`` (undiscounted return), ``eval/return_std``, ``eval/return_min``,
    ``eval/len_mean``."""
    batch = run_episodes(envs, policy, seeds, torch.Generator().manual_seed(sample_seed), deterministic=deterministic)
    returns = torch.tensor(batch.episode_returns, dtype=torch.float64)
    return {"eval/mean_reward": float(returns.mean()), "eval/return_std": float(returns.std(unbiased=False)),
            "eval/return_min": float(returns.min()), "eval/len_mean": float(batch.mask.sum(-1).mean())}
