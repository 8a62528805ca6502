"""Outcome-reward advantages within groups of completions (or trajectories) sharing a prompt, a reset or any key.

Rewards are ``[B]``, grouped in equal contiguous groups of G or by ``group_ids [B]``. A NaN reward (no reward
function applied) is left out of its group's statistics and gets advantage 0. Every estimator subtracts a
baseline within the group, then divides by a scale (:data:`SCALES`), in float32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from grouprl.algos.groups import Groups, make_groups
from grouprl.registry import Registry

COMPLETION, STEP = "completion", "step"
"""The levels an estimator gives advantages at: one per completion (or whole trajectory), ``[B]``, or one
per policy turn (step) of a trajectory, ``[B, K]``."""


@dataclass(frozen=True)
class Estimator:
    """One advantage estimator, as :data:`ADVANTAGES` holds it."""

    level: str
    """:data:`COMPLETION` or :data:`STEP`: what the estimator needs (rewards per row, or each turn's reward
    and state) and what its advantages are indexed by; the trainer picks its baseline by it."""
    fn: Callable[..., torch.Tensor] | None = None
    """Completion level: ``fn(rewards [B], groups, scale, eps, reduce) -> advantages [B]``. None at the
    step level, whose inputs are the turns' (:func:`grouprl.algos.gigpo.gigpo_advantages`)."""
    scale: str = "group"
    """The scale (:data:`SCALES`) when none is given: dividing reinforce or rloo by the group std would
    turn them back into GRPO up to a constant."""
    scales: tuple[str, ...] | None = None
    """The scales it accepts; None = every one of :data:`SCALES`."""


ADVANTAGES: Registry[Estimator] = Registry("advantage estimator")
SCALES: Registry = Registry("advantage scale")
"""name -> ``fn(centred [B], valid [B], groups, reduce) -> divisor`` broadcastable to ``[B]``; ``reduce`` sums
over every process that shares the batch (the identity in one process)."""

Reduce = Callable[[torch.Tensor], torch.Tensor]


def _local(x: torch.Tensor) -> torch.Tensor:
    return x


def _valid(rewards: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``rewards [B]`` -> ``(r [B] float32 with NaN zeroed, valid [B] bool)``."""
    r = rewards.float()
    valid = ~torch.isnan(r)
    return torch.where(valid, r, torch.zeros_like(r)), valid


def _constant(r: torch.Tensor, valid: torch.Tensor, groups: Groups) -> torch.Tensor:
    """``[B]`` bool: rows of groups whose valid rewards are all equal (or that have fewer than two). Tested as
    max == min, not std == 0: the float mean of equal values can differ from them, and the residue divided by
    a tiny std becomes +-1."""
    hi = groups.amax(torch.where(valid, r, torch.full_like(r, -torch.inf)))
    lo = groups.amin(torch.where(valid, r, torch.full_like(r, torch.inf)))
    return (hi == lo) | (groups.total(valid.float()) < 2)


@SCALES.register("group")
def _scale_group(centred: torch.Tensor, valid: torch.Tensor, groups: Groups, reduce: Reduce) -> torch.Tensor:
    """Population std (ddof 0) of each group's valid rows: ``[B]``."""
    n = groups.total(valid.float()).clamp(min=1)
    return (groups.total(centred.square()) / n).sqrt()


@SCALES.register("group-sample")
def _scale_group_sample(centred: torch.Tensor, valid: torch.Tensor, groups: Groups, reduce: Reduce) -> torch.Tensor:
    """Sample std (ddof 1) of each group's valid rows, as ``torch.std`` gives it (TRL's and verl's GRPO):
    ``[B]``; sqrt(n / (n - 1)) times the population std, so advantages are ~0.94x the paper's at G=8."""
    n = groups.total(valid.float())
    return (groups.total(centred.square()) / (n - 1).clamp(min=1)).sqrt()


@SCALES.register("batch")
def _scale_batch(centred: torch.Tensor, valid: torch.Tensor, groups: Groups, reduce: Reduce) -> torch.Tensor:
    """Population std of every valid reward in the batch around its group mean: a scalar. Only the divisor
    is shared (Dr. GRPO's discussion, verl's batch std), so low-variance groups are not inflated; float64 sums
    make the split over processes change nothing but rounding."""
    sums = reduce(torch.stack([centred.double().square().sum(), valid.sum().double()]))
    return (sums[0] / sums[1].clamp(min=1)).sqrt().to(centred.dtype)


@SCALES.register("none")
def _scale_none(centred: torch.Tensor, valid: torch.Tensor, groups: Groups, reduce: Reduce) -> torch.Tensor:
    """No division: the advantage is the centred reward (Dr. GRPO)."""
    return torch.ones((), dtype=centred.dtype, device=centred.device)


def _finish(centred: torch.Tensor, valid: torch.Tensor, constant: torch.Tensor, groups: Groups, scale: str,
            eps: float, reduce: Reduce) -> torch.Tensor:
    """Zero the constant groups and NaN rows, divide by the scale: ``[B]``."""
    centred = torch.where(valid & ~constant, centred, torch.zeros_like(centred))
    divisor = SCALES.get(scale)(centred, valid, groups, reduce) + eps
    safe = torch.where(divisor > 0, divisor, torch.ones_like(divisor))
    return torch.where(divisor > 0, centred / safe, torch.zeros_like(centred))


def _grpo(rewards: torch.Tensor, groups: Groups, scale: str, eps: float, reduce: Reduce) -> torch.Tensor:
    r, valid = _valid(rewards)
    mean = groups.total(r) / groups.total(valid.float()).clamp(min=1)
    return _finish(r - mean, valid, _constant(r, valid, groups), groups, scale, eps, reduce)


def _rloo(rewards: torch.Tensor, groups: Groups, scale: str, eps: float, reduce: Reduce) -> torch.Tensor:
    r, valid = _valid(rewards)
    n = groups.total(valid.float())
    baseline = (groups.total(r) - r) / (n - 1).clamp(min=1)  # mean of the other valid rows
    return _finish(r - baseline, valid, _constant(r, valid, groups), groups, scale, eps, reduce)


def _rank(rewards: torch.Tensor, groups: Groups, scale: str, eps: float, reduce: Reduce) -> torch.Tensor:
    r, valid = _valid(rewards)
    # The centred average rank (ties share their mean rank) is (#smaller - #larger) / 2.
    centred = groups.below_minus_above(r, valid.float()) / 2
    return _finish(centred, valid, _constant(r, valid, groups), groups, scale, eps, reduce)


ADVANTAGES.register("grpo", Estimator(COMPLETION, _grpo))
ADVANTAGES.register("reinforce", Estimator(COMPLETION, _grpo, scale="none"))  # the group-mean baseline, undivided
ADVANTAGES.register("rloo", Estimator(COMPLETION, _rloo, scale="none"))
ADVANTAGES.register("rank", Estimator(COMPLETION, _rank))
ADVANTAGES.register("gigpo", Estimator(STEP, scales=("group", "none")))  # grouprl.algos.gigpo, arXiv 2505.10978


def completion_estimators() -> list[str]:
    """Names of the estimators :func:`compute_advantages` computes (one advantage per row)."""
    return [name for name in ADVANTAGES if ADVANTAGES.get(name).level == COMPLETION]


def compute_advantages(name: str, rewards: torch.Tensor, group_size: int | None = None, scale: str | None = None,
                       eps: float = 0.0, reduce: Reduce = _local,
                       group_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Advantages ``[B]`` float32 of ``rewards [B]`` (NaN: no reward) by estimator ``name`` (:data:`ADVANTAGES`),
    grouped by ``group_size`` (equal contiguous groups) or ``group_ids [B]``. ``scale`` None is the estimator's
    own. ``eps`` (added to the divisor) only damps near-constant groups (TRL uses 1e-4): all-equal groups get
    exactly 0 anyway. ``reduce`` sums over the processes that share a batch scale.
    """
    estimator = ADVANTAGES.get(name)
    if estimator.fn is None:
        raise ValueError(f"advantage estimator {name!r} gives one advantage per {estimator.level}, from each turn's "
                         f"reward and state (grouprl.algos.gigpo), not from rewards [B]; estimators of rewards [B]: "
                         f"{', '.join(completion_estimators())}")
    groups = make_groups(rewards, group_size, group_ids)
    return estimator.fn(rewards, groups, estimator.scale if scale is None else scale, eps, reduce)


def group_advantages(rewards: torch.Tensor, group_size: int | None = None, scale: str = "group", eps: float = 0.0,
                     reduce: Reduce = _local, group_ids: torch.Tensor | None = None) -> torch.Tensor:
    """GRPO's outcome advantage ``A_i = (r_i - mean(r_group)) / std(r_group)``; see :func:`compute_advantages`.

    >>> group_advantages(torch.tensor([1., 0., 0., 1., 1., 1.]), 3).tolist()  # doctest: +ELLIPSIS
    [1.41421..., -0.70710..., -0.70710..., 0.0, 0.0, 0.0]
    """
    return compute_advantages("grpo", rewards, group_size, scale, eps, reduce, group_ids)


def reinforce_advantages(rewards: torch.Tensor, group_size: int | None = None, scale: str = "none",
                         eps: float = 0.0, group_ids: torch.Tensor | None = None) -> torch.Tensor:
    """REINFORCE with the group mean as baseline: ``A_i = r_i - mean(r_group)`` (GRPO with
    ``scale="none"``, named for the baseline comparison)."""
    return compute_advantages("reinforce", rewards, group_size, scale, eps, group_ids=group_ids)


def rloo_advantages(rewards: torch.Tensor, group_size: int | None = None, scale: str = "none",
                    eps: float = 0.0, group_ids: torch.Tensor | None = None) -> torch.Tensor:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024): ``A_i = r_i - mean_{j != i} r_j =
    n/(n-1) * (r_i - mean(r_group))`` over the n valid rows; a baseline independent of the sample is unbiased.

    >>> rloo_advantages(torch.tensor([1., 0., 0., 0.]), 4).tolist()  # doctest: +ELLIPSIS
    [1.0, -0.33333..., -0.33333..., -0.33333...]
    """
    return compute_advantages("rloo", rewards, group_size, scale, eps, group_ids=group_ids)


def rank_advantages(rewards: torch.Tensor, group_size: int | None = None, scale: str = "group",
                    eps: float = 0.0, group_ids: torch.Tensor | None = None) -> torch.Tensor:
    """The centred rank of each reward within its group (ties share their average rank), divided by
    the scale: only the order of the rewards counts, not their distances.

    >>> rank_advantages(torch.tensor([3., 10., 10., 0.]), 4, scale="none").tolist()  # ranks 2, 3.5, 3.5, 1
    [-0.5, 1.0, 1.0, -1.5]
    """
    return compute_advantages("rank", rewards, group_size, scale, eps, group_ids=group_ids)


def constant_groups(rewards: torch.Tensor, group_size: int | None = None,
                    group_ids: torch.Tensor | None = None) -> torch.Tensor:
    """``[B]`` -> ``[P]`` bool: groups that carry no learning signal (all valid rewards equal, or
    fewer than two valid), whose advantages are 0 under every estimator.

    >>> constant_groups(torch.tensor([1., 1., 0., 1.]), 2).tolist()
    [True, False]
    """
    groups = make_groups(rewards, group_size, group_ids)
    r, valid = _valid(rewards)
    return groups.per_group(_constant(r, valid, groups))


def constant_rows(rewards: torch.Tensor, group_size: int | None = None,
                  group_ids: torch.Tensor | None = None) -> torch.Tensor:
    """``[B]`` bool: the rows of the groups :func:`constant_groups` finds."""
    groups = make_groups(rewards, group_size, group_ids)
    r, valid = _valid(rewards)
    return _constant(r, valid, groups)
