"""Policy-gradient terms beside the clipped surrogate (:data:`POLICY_LOSSES`): CISPO, SAPO, GMPO.

Every entry is ``fn(logp [B,T], old_logp [B,T], advantages [B] or [B,T], mask [B,T], **knobs) ->
(loss [B,T], metrics)``: the negated per-token objective, aggregated later, and 0-dim detached metrics;
``rho = pi_theta / pi_old``. Each term but GMPO's is linear in the advantage once its sign is fixed, so a weight
``w >= 0`` folded into the advantage multiplies the token's term by ``w``.
"""

from __future__ import annotations

import math

import torch

from grouprl.algos.aggregate import masked_mean
from grouprl.algos.losses import _MAX_LOG_RATIO, IMPORTANCE_LEVELS, POLICY_LOSSES


def _ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log rho [B,T], rho [B,T])`` per token, rho bounded by e^20 before exp (no overflow to inf)."""
    log_ratio = IMPORTANCE_LEVELS.get("token")(logp, old_logp.detach(), mask).clamp(max=_MAX_LOG_RATIO)
    return log_ratio, torch.exp(log_ratio)


def _per_token(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``[B]`` or ``[B,T]`` advantages as ``[B,T]`` in ``like``'s dtype."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)  # [B] -> [B,1]
    return advantages.to(like.dtype).expand_as(like)


def _drift(log_ratio: torch.Tensor, ratio: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"ratio_mean": masked_mean(ratio.detach(), mask),
            "approx_kl": masked_mean(log_ratio.detach().square() / 2, mask)}


@POLICY_LOSSES.register("cispo")
def cispo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
               eps_low: float | None = None, eps_high: float = 4.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO (MiniMax-M1, Chen et al. 2025, arXiv 2506.13585): clip the importance weight, not the update.

        loss_t = - sg( clip(rho_t, 1 - eps_low, 1 + eps_high) ) * A_t * log pi_theta(o_t)

    ``sg`` stops the gradient, so every token keeps the REINFORCE gradient ``-A_t * grad log pi`` scaled by its
    clipped weight: a clipped token is damped, never silenced as the clipped surrogate silences it.

    ``eps_low`` None: no lower bound. Metrics: ``clip_low`` / ``clip_high`` (share of valid tokens whose weight
    sits at that bound), ``ratio_mean``, ``approx_kl``.
    """
    if eps_high < 0 or (eps_low is not None and not 0 <= eps_low <= 1):
        raise ValueError(f"cispo needs eps_high >= 0 and eps_low in [0, 1] or None, got {eps_low}, {eps_high}")
    log_ratio, ratio = _ratio(logp, old_logp, mask)
    low = None if eps_low is None else 1.0 - eps_low
    weight = ratio.detach().clamp(min=low, max=1.0 + eps_high)
    loss = -weight * _per_token(advantages, logp) * logp
    with torch.no_grad():
        clip_low = torch.zeros_like(ratio) if low is None else (ratio < low).float()
        metrics = {"clip_low": masked_mean(clip_low, mask),
                   "clip_high": masked_mean((ratio > 1.0 + eps_high).float(), mask), **_drift(log_ratio, ratio, mask)}
    return loss, metrics


def sapo_gate(ratio: torch.Tensor, tau: torch.Tensor | float) -> torch.Tensor:
    """SAPO's soft gate ``f(rho) = sigmoid(tau * (rho - 1)) * 4 / tau`` (elementwise, ``tau > 0``).

    ``f'(rho) = 4 s (1 - s) = sech^2(tau (rho - 1) / 2)``, ``s = sigmoid(tau (rho - 1))``: 1 at rho = 1."""
    return torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)


@POLICY_LOSSES.register("sapo")
def sapo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
              tau_pos: float = 1.0, tau_neg: float = 1.05) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SAPO (Soft Adaptive Policy Optimization, Gao et al. 2025, Qwen, arXiv 2511.20347): a smooth gate on
    the ratio instead of a hard clip.

        loss_t = - f(rho_t; tau_t) * A_t,   f(rho; tau) = sigmoid(tau (rho - 1)) * 4 / tau,
        tau_t = tau_pos if A_t > 0 else tau_neg

    Its gradient is ``-sech^2(tau (rho - 1) / 2) * rho * A * grad log pi``: 1 on-policy, decaying smoothly on both
    sides of rho = 1. tau_neg > tau_pos, as negative updates spread probability over the whole vocabulary and
    destabilise sooner; A = 0 takes tau_neg. Metrics: ``gate`` (mean sech^2), ``ratio_mean``, ``approx_kl``.
    """
    if not (tau_pos > 0 and tau_neg > 0 and math.isfinite(tau_pos) and math.isfinite(tau_neg)):
        raise ValueError(f"sapo needs finite tau_pos > 0 and tau_neg > 0, got {tau_pos}, {tau_neg}")
    log_ratio, ratio = _ratio(logp, old_logp, mask)
    adv = _per_token(advantages, logp)
    tau = torch.where(adv > 0, tau_pos, tau_neg).to(ratio.dtype)  # [B,T]
    loss = -sapo_gate(ratio, tau) * adv
    with torch.no_grad():
        s = torch.sigmoid(tau * (ratio - 1.0))
        metrics = {"gate": masked_mean(4 * s * (1 - s), mask), **_drift(log_ratio, ratio, mask)}
    return loss, metrics


@POLICY_LOSSES.register("gmpo")
def gmpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
              eps_low: float = 0.4, eps_high: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GMPO (Geometric-Mean Policy Optimization, Zhao et al. 2025, arXiv 2507.20673): one ratio per
    sequence, the geometric mean of its token ratios, each clipped in log space on PPO's pessimistic side.

        c_t = sgn(A_t) * min( sgn(A_t) log rho_t, sgn(A_t) clip(log rho_t, -eps_low, eps_high) )
        R_i = exp( (1/|o_i|) sum_t c_t ),     loss_t = - A_i * R_i   on every token of row i

    the paper's ``sgn(A) * (prod_t |min(rho_t A, clip(rho_t, e^-eps_low, e^eps_high) A)|)^(1/|o|)`` in log
    space. A geometric mean is far less moved by one extreme token than an arithmetic one, so the clip widens to
    (e^-0.4, e^0.4). ``A_i`` is the row's mean advantage over its valid tokens, the sign per token; under
    seq-mean-token-mean aggregation the loss is the paper's ``-(1/G) sum_i A_i R_i``.

    ``eps_high`` None = ``eps_low``. Metrics: ``clip_low`` / ``clip_high`` (share of valid tokens whose clipped
    log-ratio is kept), ``geo_ratio_mean`` (mean R_i over rows with tokens), ``ratio_mean``, ``approx_kl``.
    """
    eps_high = eps_low if eps_high is None else eps_high
    if not (eps_low >= 0 and eps_high >= 0):
        raise ValueError(f"gmpo needs eps_low >= 0 and eps_high >= 0, got {eps_low}, {eps_high}")
    log_ratio = (logp - old_logp.detach()) * mask  # [B,T]; padding contributes 0 to the sums below
    adv = _per_token(advantages, logp) * mask
    sign = torch.sign(adv)
    kept = sign * torch.minimum(sign * log_ratio, sign * log_ratio.clamp(-eps_low, eps_high))  # [B,T]
    length = mask.sum(-1, keepdim=True).clamp(min=1)  # [B,1]
    geo = torch.exp(((kept * mask).sum(-1, keepdim=True) / length).clamp(max=_MAX_LOG_RATIO))  # [B,1]
    row_adv = adv.sum(-1, keepdim=True) / length  # [B,1]
    loss = (-row_adv * geo).expand_as(logp)  # [B,1] -> [B,T]
    with torch.no_grad():
        rows = (mask.sum(-1) > 0).to(geo.dtype)
        metrics = {"clip_low": masked_mean(((log_ratio < -eps_low) & (adv < 0)).float(), mask),
                   "clip_high": masked_mean(((log_ratio > eps_high) & (adv > 0)).float(), mask),
                   "geo_ratio_mean": masked_mean(geo.squeeze(-1).detach(), rows),
                   **_drift(log_ratio, torch.exp(log_ratio.clamp(max=_MAX_LOG_RATIO)), mask)}
    return loss, metrics
