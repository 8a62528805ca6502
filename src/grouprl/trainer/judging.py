"""A group judge in the step (:mod:`grouprl.rewards.judges`): every group handed to it in one call, its scores made
the reward (or added with ``judge_weight``), what the reward functions said kept as ``reward/independent``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from grouprl.rewards.judges import JudgeGroup, run_judge
from grouprl.types import RolloutBatch


def rank_correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman's rho of ``a [G]`` and ``b [G]`` (ties share their mean rank); NaN when either is constant.

    >>> round(rank_correlation(torch.tensor([0.1, 0.5, 0.9]), torch.tensor([0., 1., 1.])), 4)  # sqrt(3) / 2
    0.866
    """
    def ranks(x: torch.Tensor) -> torch.Tensor:
        below = (x.unsqueeze(0) < x.unsqueeze(1)).sum(1).double()
        equal = (x.unsqueeze(0) == x.unsqueeze(1)).sum(1).double()
        return below + (equal + 1) / 2

    ra, rb = ranks(a.double()), ranks(b.double())
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denominator = (ra.pow(2).sum() * rb.pow(2).sum()).sqrt()
    return float((ra * rb).sum() / denominator) if denominator > 0 else float("nan")


def apply_judge(judge: Any, weight: float | None, batch: RolloutBatch, independent: torch.Tensor | None,
                per_fn: dict[str, torch.Tensor], columns: dict[str, Sequence[Any]],
                shown: Sequence[str] | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, float]]:
    """Judge every group of ``batch``: (rewards ``[B]``, ``per_fn`` with ``judge`` and ``independent``, metrics).
    The reward is the judge's score (``weight`` None) or ``independent`` + weight * judge; a dropped group's rows
    get NaN. ``shown``: what the judge reads of each row (default the completions)."""
    index = batch.group_index()
    members = [(index == g).nonzero().flatten().tolist() for g in range(int(index.max()) + 1)]
    shown = batch.completions if shown is None else shown
    groups = [JudgeGroup(prompt=batch.prompts[rows[0]], completions=[shown[i] for i in rows],
                         columns={k: v[rows[0]] for k, v in columns.items()}) for rows in members]
    scores = torch.full((batch.batch_size,), float("nan"))
    for rows, result in zip(members, run_judge(judge, groups)):
        if result is not None:
            scores[rows] = torch.tensor(result, dtype=torch.float32)
    dropped = sum(bool(torch.isnan(scores[rows]).all()) for rows in members)
    metrics = {"judge/dropped_groups": float(dropped), "judge/score_mean": float(scores.nanmean())}
    per_fn = {**per_fn, "judge": scores}
    if independent is None:
        return scores, per_fn, metrics
    per_fn["independent"] = independent
    rhos = [rank_correlation(scores[rows], independent[rows]) for rows in members
            if not torch.isnan(scores[rows]).any() and not torch.isnan(independent[rows]).any()]
    rhos = [r for r in rhos if r == r]
    if rhos:
        metrics["judge/agreement"] = sum(rhos) / len(rhos)
    total = scores if weight is None else torch.nan_to_num(independent, nan=0.0) + weight * scores
    return total, per_fn, metrics
