"""Importance correction of the rollout-engine / trainer mismatch: truncated (TIS) or masked (IcePop, sequence
masking). A fast rollout engine samples from ``pi_rollout``, not exactly the trainer's ``pi_old``. Re-weighting each
token's policy-gradient term by ``pi_old / pi_rollout`` removes that bias; capping the weight at C bounds its
variance (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training"):

    token          w_it = min( r_it, C )                   r_it = pi_old(o_it) / pi_rollout(o_it)
    sequence       w_i  = min( prod_t r_it, C )            (same w_i on every token)

Masking drops what is too far off (a capped weight still trains on a token the trainer would hardly sample):

    icepop         w_it = r_it * 1[ low <= r_it <= high ]                          (IcePop, default [0.5, 5])
    sequence-mask  w_i  = 1[ low <= (prod_t r_it)^(1/|o_i|) <= high ]              (default [0.999, 1.001])

IcePop is inclusionAI's (2025, the Ring-1T report); sequence-mask is verl's geometric rejection sampling.
The weight multiplies only the policy-gradient term (a masked token still counts in the denominators); as
w >= 0 it folds into the advantage, ``A_it = w_it * A_i``."""

from __future__ import annotations

import math

import torch

from grouprl.algos.aggregate import masked_mean
from grouprl.registry import Registry

ROLLOUT_IS_LEVELS: Registry = Registry("rollout importance-sampling level")
"""name -> ``fn(log_ratio [B,T], mask [B,T], **knobs) -> (weights [B,T] float32, metrics)``, 0 off the mask;
knobs ``cap`` (token, sequence) or ``low`` / ``high`` (icepop, sequence-mask)."""


def _log(x: float) -> float:
    """log x, with log 0 = -inf and log inf = inf (an open band)."""
    return math.log(x) if x > 0 else -math.inf


def _truncate(log_weight: torch.Tensor, mask: torch.Tensor, cap: float) -> tuple[torch.Tensor, dict]:
    if cap <= 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    # min(exp(x), C) == exp(min(x, log C)): the cap is applied before exp, so no overflow to inf.
    weights = torch.exp(log_weight.clamp(max=_log(cap))) * mask
    return weights, {"rollout/is_capped_frac": masked_mean((log_weight >= _log(cap)).float(), mask)}


def _band(low: float, high: float) -> tuple[float, float]:
    if not 0 <= low <= high:
        raise ValueError(f"the band needs 0 <= low <= high, got low={low}, high={high}")
    return _log(low), _log(high)


@ROLLOUT_IS_LEVELS.register("token")
def _token_truncated(log_ratio: torch.Tensor, mask: torch.Tensor, *, cap: float = 2.0):
    """Each token its own ratio, capped at ``cap``."""
    return _truncate(log_ratio, mask, cap)


@ROLLOUT_IS_LEVELS.register("sequence")
def _sequence_truncated(log_ratio: torch.Tensor, mask: torch.Tensor, *, cap: float = 2.0):
    """The product of the row's token ratios (a sum of logs) on every token of the row, capped at ``cap``."""
    return _truncate((log_ratio * mask).sum(-1, keepdim=True).expand_as(log_ratio), mask, cap)  # [B,1] -> [B,T]


@ROLLOUT_IS_LEVELS.register("icepop")
def _icepop(log_ratio: torch.Tensor, mask: torch.Tensor, *, low: float = 0.5, high: float = 5.0):
    """Each token its own ratio inside [low, high], 0 outside."""
    lo, hi = _band(low, high)
    inside = (log_ratio >= lo) & (log_ratio <= hi)
    weights = torch.exp(log_ratio.clamp(max=hi)) * inside * mask  # the clamp only keeps exp() finite
    return weights, {"rollout/is_masked_frac": masked_mean((~inside).float(), mask)}


@ROLLOUT_IS_LEVELS.register("sequence-mask")
def _sequence_mask(log_ratio: torch.Tensor, mask: torch.Tensor, *, low: float = 0.999, high: float = 1.001):
    """1 on every token of a row whose geometric-mean ratio is inside [low, high], 0 on the other rows."""
    lo, hi = _band(low, high)
    mean_log = (log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)  # [B,1]
    inside = ((mean_log >= lo) & (mean_log <= hi)).expand_as(log_ratio)  # [B,1] -> [B,T]
    return inside.float() * mask, {"rollout/is_masked_frac": masked_mean((~inside).float(), mask)}


def rollout_mismatch(train_logp: torch.Tensor, rollout_logp: torch.Tensor,
                     mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """KL(pi_rollout || pi_train) on the sampled tokens, token means by k3 (``rollout/mismatch_kl``) and k1, from
    the trainer's ``train_logp [B,T]`` (pi_old), the engine's ``rollout_logp [B,T]`` and ``mask [B,T]``."""
    log_ratio = (train_logp - rollout_logp).float()  # log r, r = pi_train / pi_rollout
    k3 = torch.expm1(log_ratio) - log_ratio  # r - 1 - log r, exact near r = 1
    return {"rollout/mismatch_kl": masked_mean(k3, mask).detach(),
            "rollout/mismatch_k1": masked_mean(-log_ratio, mask).detach()}


def rollout_is_weights(train_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, *,
                       level: str = "token", **knobs: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``(weights [B,T] float32, 0 off the mask, metrics)`` of ``level`` (:data:`ROLLOUT_IS_LEVELS`) for the
    trainer's (pi_old) and the engine's log-probs ``[B,T]``. Metrics: ``rollout/is_weight_mean``,
    ``rollout/is_capped_frac`` or ``rollout/is_masked_frac``, and :func:`rollout_mismatch`'s.

    >>> w, m = rollout_is_weights(torch.tensor([[0.0, -1.0, -3.0]]), torch.tensor([[-1.0, -1.0, -1.0]]),
    ...                           torch.ones(1, 3), level="icepop", low=0.5, high=5.0)
    >>> [round(x, 4) for x in w[0].tolist()]  # ratios e, 1, e^-2 = 0.135 (below 0.5: masked)
    [2.7183, 1.0, 0.0]
    """
    if train_logp.shape != rollout_logp.shape or train_logp.shape != mask.shape:
        raise ValueError(f"train_logp {tuple(train_logp.shape)}, rollout_logp {tuple(rollout_logp.shape)} and "
                         f"mask {tuple(mask.shape)} must have one shape [B,T]")
    mask = mask.to(torch.float32)
    log_ratio = (train_logp.detach() - rollout_logp.detach()).float() * mask  # [B,T]
    weights, metrics = ROLLOUT_IS_LEVELS.get(level)(log_ratio, mask, **knobs)
    return weights, {"rollout/is_weight_mean": masked_mean(weights, mask), **metrics,
                     **rollout_mismatch(train_logp, rollout_logp, mask)}


def truncated_is_weights(train_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, *,
                         level: str = "token", cap: float = 2.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Capped importance weights ``min(pi_train / pi_rollout, cap)`` at ``level`` (token or sequence):
    :func:`rollout_is_weights` with its one knob.

    >>> w, m = truncated_is_weights(torch.tensor([[0.0, -1.0]]), torch.tensor([[-1.0, -1.0]]),
    ...                             torch.ones(1, 2), cap=2.0)
    >>> [round(x, 4) for x in w[0].tolist()], round(float(m["rollout/is_capped_frac"]), 2)
    ([2.0, 1.0], 0.5)
    """
    return rollout_is_weights(train_logp, rollout_logp, mask, level=level, cap=cap)
