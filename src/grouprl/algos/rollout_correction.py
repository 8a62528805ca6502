"""Truncated importance sampling (TIS) for the rollout-engine / trainer mismatch.

A fast rollout engine (vLLM: bf16 kernels, fused sampling) does not compute exactly the
probabilities the trainer computes for the same weights, so the tokens it samples come from
``pi_rollout``, not from the ``pi_old`` the policy-gradient estimator assumes. Re-weighting each
token's policy-gradient term by ``pi_old / pi_rollout`` removes that bias; capping the weight at C
bounds its variance (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy
RL training"; verl's ``rollout_is`` and TRL's ``vllm_importance_sampling_cap`` do the same):

    token      w_it = min( pi_old(o_it) / pi_rollout(o_it), C )
    sequence   w_i  = min( prod_t pi_old(o_it) / pi_rollout(o_it), C )      (same w_i on every token)

The weight multiplies only the policy-gradient term, never the KL penalty. Because w >= 0 it
can be folded into the advantage (``A_it = w_it * A_i``): ``-w * min(rho*A, clip(rho)*A)`` equals
``-min(rho*(w*A), clip(rho)*(w*A))``, dual clip included.

The mismatch itself is logged as KL(pi_rollout || pi_old), estimated on the sampled tokens with
k1 (``log pi_rollout - log pi_old``, unbiased, noisy) and k3 (``r - 1 - log r`` with
``r = pi_old / pi_rollout``, unbiased and >= 0).
"""

from __future__ import annotations

import math

import torch

from grouprl.algos.aggregate import masked_mean
from grouprl.registry import Registry

ROLLOUT_IS_LEVELS: Registry = Registry("rollout importance-sampling level")
"""name -> ``fn(log_ratio [B,T], mask [B,T]) -> log_weight [B,T]`` (before the cap)."""


@ROLLOUT_IS_LEVELS.register("token")
def _token_log_weight(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each token its own ratio."""
    return log_ratio


@ROLLOUT_IS_LEVELS.register("sequence")
def _sequence_log_weight(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The product of the row's token ratios (a sum of logs), broadcast to every token of the row."""
    return (log_ratio * mask).sum(-1, keepdim=True).expand_as(log_ratio)  # [B,1] -> [B,T]


def rollout_mismatch(train_logp: torch.Tensor, rollout_logp: torch.Tensor,
                     mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """KL(pi_rollout || pi_train) estimated on the sampled tokens, as 0-dim tensors.

    Args:
        train_logp: ``[B,T]`` log-probs of the sampled tokens under the trainer's copy of the
            policy that sampled them (pi_old).
        rollout_logp: ``[B,T]`` the same tokens' log-probs as the rollout engine reported them.
        mask: ``[B,T]`` 0/1.

    Returns:
        ``rollout/mismatch_kl`` (k3, token mean) and ``rollout/mismatch_k1`` (token mean).
    """
    log_ratio = (train_logp - rollout_logp).float()  # log r, r = pi_train / pi_rollout
    k3 = torch.expm1(log_ratio) - log_ratio  # r - 1 - log r, exact near r = 1
    return {"rollout/mismatch_kl": masked_mean(k3, mask).detach(),
            "rollout/mismatch_k1": masked_mean(-log_ratio, mask).detach()}


def truncated_is_weights(train_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, *,
                         level: str = "token", cap: float = 2.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Capped importance weights ``min(pi_train / pi_rollout, cap)`` at ``level`` (token or sequence).

    Args:
        train_logp: ``[B,T]`` trainer log-probs of the sampled tokens (pi_old; no grad needed).
        rollout_logp: ``[B,T]`` the rollout engine's log-probs of the same tokens.
        mask: ``[B,T]`` 0/1; weights are 0 where it is 0.
        level: a name in :data:`ROLLOUT_IS_LEVELS`.
        cap: C > 0, the largest weight.

    Returns:
        ``(weights [B,T] float32, metrics)``: ``rollout/is_weight_mean`` (token mean of the capped
        weights), ``rollout/is_capped_frac`` (share of tokens whose weight hit the cap) and the
        :func:`rollout_mismatch` estimates.

    >>> w, m = truncated_is_weights(torch.tensor([[0.0, -1.0]]), torch.tensor([[-1.0, -1.0]]),
    ...                             torch.ones(1, 2), cap=2.0)
    >>> [round(x, 4) for x in w[0].tolist()], round(float(m["rollout/is_capped_frac"]), 2)
    ([2.0, 1.0], 0.5)
    """
    if cap <= 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    if train_logp.shape != rollout_logp.shape or train_logp.shape != mask.shape:
        raise ValueError(f"train_logp {tuple(train_logp.shape)}, rollout_logp {tuple(rollout_logp.shape)} and "
                         f"mask {tuple(mask.shape)} must have one shape [B,T]")
    mask = mask.to(torch.float32)
    log_ratio = (train_logp.detach() - rollout_logp.detach()).float() * mask  # [B,T]
    log_weight = ROLLOUT_IS_LEVELS.get(level)(log_ratio, mask)
    # min(exp(x), C) == exp(min(x, log C)): the cap is applied before exp, so no overflow to inf.
    weights = torch.exp(log_weight.clamp(max=math.log(cap))) * mask
    metrics = {"rollout/is_weight_mean": masked_mean(weights, mask),
               "rollout/is_capped_frac": masked_mean((log_weight >= math.log(cap)).float(), mask),
               **rollout_mismatch(train_logp, rollout_logp, mask)}
    return weights, metrics
