"""Outcome-reward advantages computed within groups of completions of the same prompt.

Rewards arrive as one float per row, ``[B]`` with ``B = P * G`` prompt-major, so group statistics
are ``rewards.view(P, G)``. A NaN reward means "no reward function applied to this row" (a
function returned ``None``): it is left out of its group's statistics and gets advantage 0.

Every estimator is two steps: subtract a baseline within the group, then divide by a scale
(:data:`SCALES`). All arithmetic runs in float32 whatever the input dtype, and the result is
float32.
"""

from __future__ import annotations

import torch

from grouprl.registry import Registry

ADVANTAGES: Registry = Registry("advantage estimator")
"""name -> ``fn(rewards [B], group_size, scale, eps) -> advantages [B]``."""

SCALES: Registry = Registry("advantage scale")
"""name -> ``fn(centred [P,G], valid [P,G]) -> divisor`` broadcastable to ``[P,G]``."""


def _grouped(rewards: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``rewards [B]`` -> ``(r [P,G] float32 with NaN zeroed, valid [P,G] bool)``."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if group_size < 2:
        raise ValueError(
            f"group_size must be >= 2, got {group_size}: a group-relative advantage compares several "
            "completions of the same prompt, and a group of one always gets advantage 0"
        )
    if rewards.numel() % group_size:
        raise ValueError(
            f"batch of {rewards.numel()} rewards does not split into whole groups of {group_size}; "
            "make the number of rows a multiple of the group size"
        )
    r = rewards.float().view(-1, group_size)  # [B] -> [P, G]
    valid = ~torch.isnan(r)
    return torch.where(valid, r, torch.zeros_like(r)), valid


def _constant_groups(r: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``[P]`` bool: groups whose valid rewards are all equal (or that have fewer than two).

    Tested exactly (max == min) rather than through ``std == 0``: the float mean of equal values
    is not always equal to them (0.1 * 3 / 3 != 0.1), which would leave a ~1e-17 residue that a
    division by a ~1e-17 std blows up to +-1.
    """
    hi = torch.where(valid, r, torch.full_like(r, -torch.inf)).amax(-1)
    lo = torch.where(valid, r, torch.full_like(r, torch.inf)).amin(-1)
    return (hi == lo) | (valid.sum(-1) < 2)


@SCALES.register("group")
def _scale_group(centred: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Population std (ddof 0) of each group's valid rewards: ``[P, 1]``."""
    n = valid.sum(-1, keepdim=True).clamp(min=1)
    return (centred.square().sum(-1, keepdim=True) / n).sqrt()


@SCALES.register("batch")
def _scale_batch(centred: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Population std of every valid reward in the batch around its group mean: a scalar.

    Centring stays per group; only the divisor is shared (as in Dr. GRPO's discussion and
    verl's batch-std option), so prompts with low-variance groups are not inflated.
    """
    n = valid.sum().clamp(min=1)
    return (centred.square().sum() / n).sqrt()


@SCALES.register("none")
def _scale_none(centred: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """No division: the advantage is the centred reward (Dr. GRPO)."""
    return torch.ones((), dtype=centred.dtype, device=centred.device)


def _finish(centred: torch.Tensor, valid: torch.Tensor, constant: torch.Tensor, scale: str,
            eps: float) -> torch.Tensor:
    """Zero the constant groups and NaN rows, divide by the scale; ``[P,G]`` -> ``[B]``."""
    centred = torch.where(valid & ~constant.unsqueeze(-1), centred, torch.zeros_like(centred))
    divisor = SCALES.get(scale)(centred, valid) + eps
    safe = torch.where(divisor > 0, divisor, torch.ones_like(divisor))
    adv = torch.where(divisor > 0, centred / safe, torch.zeros_like(centred))
    return adv.reshape(-1)  # [P, G] -> [B]


@ADVANTAGES.register("grpo")
def group_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group",
                     eps: float = 0.0) -> torch.Tensor:
    """GRPO's outcome advantage ``A_i = (r_i - mean(r_group)) / std(r_group)``.

    Args:
        rewards: ``[B]``, prompt-major, NaN where no reward applied.
        group_size: G (>= 2).
        scale: ``"group"`` (population std of the group, DeepSeekMath), ``"batch"`` (std of the
            whole batch) or ``"none"`` (only centre, Dr. GRPO).
        eps: added to the divisor. 0 by default: all-equal groups are handled exactly, so eps is
            only for users who want to damp near-constant groups (TRL uses 1e-4).

    Returns:
        ``[B]`` float32. A group whose valid rewards are all equal gets exactly 0; NaN rows get 0.

    >>> group_advantages(torch.tensor([1., 0., 0., 1., 1., 1.]), 3).tolist()  # doctest: +ELLIPSIS
    [1.41421..., -0.70710..., -0.70710..., 0.0, 0.0, 0.0]
    """
    r, valid = _grouped(rewards, group_size)
    n = valid.sum(-1, keepdim=True).clamp(min=1)
    mean = r.sum(-1, keepdim=True) / n  # [P, 1]
    return _finish(r - mean, valid, _constant_groups(r, valid), scale, eps)


@ADVANTAGES.register("reinforce")
def reinforce_advantages(rewards: torch.Tensor, group_size: int, scale: str = "none",
                         eps: float = 0.0) -> torch.Tensor:
    """REINFORCE with the group mean as baseline: ``A_i = r_i - mean(r_group)``.

    The same centring as GRPO without the std division by default; it is GRPO with
    ``scale="none"``, named for the baseline comparison.
    """
    return group_advantages(rewards, group_size, scale=scale, eps=eps)


@ADVANTAGES.register("rloo")
def rloo_advantages(rewards: torch.Tensor, group_size: int, scale: str = "none",
                    eps: float = 0.0) -> torch.Tensor:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024).

    ``A_i = r_i - mean_{j != i} r_j = n/(n-1) * (r_i - mean(r_group))`` over the n valid rows of
    the group, so the baseline of each sample is independent of that sample (unbiased).

    >>> rloo_advantages(torch.tensor([1., 0., 0., 0.]), 4).tolist()  # doctest: +ELLIPSIS
    [1.0, -0.33333..., -0.33333..., -0.33333...]
    """
    r, valid = _grouped(rewards, group_size)
    n = valid.sum(-1, keepdim=True)
    total = r.sum(-1, keepdim=True)
    baseline = (total - r) / (n - 1).clamp(min=1)  # mean of the other valid rows
    return _finish(r - baseline, valid, _constant_groups(r, valid), scale, eps)


def constant_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[B]`` -> ``[P]`` bool: groups that carry no learning signal (all valid rewards equal, or
    fewer than two valid), whose advantages are 0 under every estimator.

    >>> constant_groups(torch.tensor([1., 1., 0., 1.]), 2).tolist()
    [True, False]
    """
    r, valid = _grouped(rewards, group_size)
    return _constant_groups(r, valid)


def compute_advantages(name: str, rewards: torch.Tensor, group_size: int, scale: str | None = None,
                       eps: float = 0.0) -> torch.Tensor:
    """Look up estimator ``name`` in :data:`ADVANTAGES` and apply it: ``[B]`` -> ``[B]``.

    ``scale=None`` keeps the estimator's own default: group std for grpo, none for rloo and
    reinforce (dividing those by the group std would turn them back into GRPO up to a constant).
    """
    fn = ADVANTAGES.get(name)
    return fn(rewards, group_size, eps=eps) if scale is None else fn(rewards, group_size, scale=scale, eps=eps)
