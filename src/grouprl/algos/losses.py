"""Policy and value losses: the clipped surrogate (PPO/GRPO/GSPO), GRPO's full objective over any
registered policy-gradient term (:data:`POLICY_LOSSES`), PPO's value loss, the policy's entropy.

Per-token losses are ``[B,T]``, reduced by :func:`grouprl.algos.aggregate.aggregate`; metrics are 0-dim
detached tensors, so computing them never forces a device sync.
"""

from __future__ import annotations

import torch

from grouprl.algos.aggregate import aggregate, masked_mean
from grouprl.algos.kl import kl_per_token
from grouprl.registry import Registry

IMPORTANCE_LEVELS: Registry = Registry("importance-ratio level")
"""name -> ``fn(logp [B,T], old_logp [B,T], mask [B,T]) -> log_ratio [B,T]``."""

_MAX_LOG_RATIO = 20.0
"""Bounds exp() of the log-ratio; a ratio of e^20 is clipped by the surrogate anyway."""

POLICY_LOSSES: Registry = Registry("policy loss")
"""name -> ``fn(logp [B,T], old_logp [B,T], advantages [B] or [B,T], mask [B,T], **knobs) -> (loss [B,T],
metrics)``; see :mod:`grouprl.algos.policy_losses`."""


@IMPORTANCE_LEVELS.register("token")
def _token_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """PPO/GRPO: ``log rho_it = log pi(o_it) - log pi_old(o_it)``."""
    return logp - old_logp


@IMPORTANCE_LEVELS.register("sequence")
def _sequence_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO (Zheng et al. 2025): one length-normalised ratio per sequence,
    ``log s_i = (1/|o_i|) sum_t (log pi - log pi_old)``, broadcast to every token of the row."""
    s = ((logp - old_logp) * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)  # [B,1]
    return s.expand_as(logp)


def clipped_surrogate_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                           mask: torch.Tensor, eps_low: float = 0.2, eps_high: float | None = None,
                           dual_clip: float | None = None,
                           level: str = "token") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token loss ``[B,T]`` ``-min(rho*A, clip(rho, 1-eps_low, 1+eps_high)*A)``.

    ``logp [B,T]`` (with grad) and ``old_logp [B,T]`` (the sampling policy's) are the sampled tokens' log-probs;
    ``advantages`` is ``[B]`` (broadcast over tokens) or ``[B,T]``; ``mask [B,T]`` serves the metrics and the
    sequence-level ratio. ``eps_high=None`` is symmetric (DAPO's clip-higher sets eps_high > eps_low, e.g. 0.28,
    to keep low-probability tokens explorable). ``dual_clip`` ``c > 1`` bounds a negative-advantage token's loss
    at ``c * |A|`` (Ye et al. 2020, dual-clip PPO). ``level``: ``"token"`` (PPO/GRPO) or ``"sequence"`` (GSPO).
    Metrics: ``clip_low`` / ``clip_high`` (share of valid tokens where that clip is active), ``clip_dual``,
    ``ratio_mean``, ``approx_kl`` (mean of (log rho)^2 / 2 to the sampling policy).
    """
    eps_high = eps_low if eps_high is None else eps_high
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)  # [B] -> [B,1], broadcast over T
    advantages = advantages.to(logp.dtype)
    log_ratio = IMPORTANCE_LEVELS.get(level)(logp, old_logp.detach(), mask).clamp(max=_MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages
    surrogate = torch.minimum(unclipped, clipped)
    metrics = {}
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        lower = dual_clip * advantages  # for A < 0 the surrogate may not fall below c*A
        dual_active = (advantages < 0) & (surrogate < lower)
        surrogate = torch.where(advantages < 0, torch.maximum(surrogate, lower), surrogate)
        metrics["clip_dual"] = masked_mean(dual_active.float(), mask).detach()
    with torch.no_grad():
        metrics["clip_low"] = masked_mean(((ratio < 1.0 - eps_low) & (advantages < 0)).float(), mask)
        metrics["clip_high"] = masked_mean(((ratio > 1.0 + eps_high) & (advantages > 0)).float(), mask)
        metrics["ratio_mean"] = masked_mean(ratio, mask)
        metrics["approx_kl"] = masked_mean(log_ratio.square() / 2, mask)
    return -surrogate, metrics


POLICY_LOSSES.register("clip", clipped_surrogate_loss)


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor | None, ref_logp: torch.Tensor | None,
              advantages: torch.Tensor, mask: torch.Tensor, *, beta: float = 0.0, kl_estimator: str = "k3",
              aggregation: str = "seq-mean-token-mean", entropy: torch.Tensor | None = None,
              entropy_coef: float = 0.0, max_tokens: int | None = None, group_size: int | None = None,
              num_rows: float | None = None, num_tokens: float | None = None, policy_loss: str = "clip",
              **policy_options: float | str | None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO's objective (negated, to minimise):
    ``agg[ L_pg(rho, A) + beta * KL_k(pi || pi_ref) - c_H * H ]``, with the paper's
    ``L_pg = -min(rho*A, clip(rho)*A)`` by default (``policy_loss="clip"``).

    ``logp``, ``old_logp``, ``ref_logp``, ``mask`` and ``entropy`` are ``[B,T]``, ``advantages`` ``[B]`` or
    ``[B,T]``. ``old_logp`` None is on-policy (rho = 1 with the REINFORCE gradient); ``ref_logp`` may be None when
    ``beta == 0``; ``policy_options`` are the knobs of the ``policy_loss`` term. Returns ``(loss scalar, metrics)``:
    ``loss/policy``, ``loss/kl`` (beta-weighted), ``policy/kl`` (token mean), the term's metrics under
    ``policy/``, ``policy/approx_kl_old`` and ``policy/entropy`` when given.
    """
    if old_logp is None:
        old_logp = logp.detach()
    agg = dict(mode=aggregation, max_tokens=max_tokens, group_size=group_size, num_rows=num_rows,
               num_tokens=num_tokens)
    pg_tokens, pg_metrics = POLICY_LOSSES.get(policy_loss)(logp, old_logp, advantages, mask, **policy_options)
    per_token = pg_tokens
    metrics = {f"policy/{k}": v for k, v in pg_metrics.items()}
    metrics["policy/approx_kl_old"] = metrics.pop("policy/approx_kl")
    metrics["loss/policy"] = aggregate(pg_tokens.detach(), mask, **agg)
    if beta != 0.0:
        if ref_logp is None:
            raise ValueError("beta != 0 needs ref_logp (reference-model log-probs)")
        kl = kl_per_token(logp, ref_logp, kl_estimator)
        per_token = per_token + beta * kl
        metrics["policy/kl"] = masked_mean(kl.detach(), mask)
        metrics["loss/kl"] = beta * aggregate(kl.detach(), mask, **agg)
    elif ref_logp is not None:  # beta = 0 but a reference was given: still report the drift
        metrics["policy/kl"] = masked_mean(kl_per_token(logp.detach(), ref_logp, kl_estimator), mask)
    if entropy is not None:
        metrics["policy/entropy"] = masked_mean(entropy.detach(), mask)
        if entropy_coef:
            per_token = per_token - entropy_coef * entropy
            metrics["loss/entropy"] = -entropy_coef * aggregate(entropy.detach(), mask, **agg)
    loss = aggregate(per_token, mask, **agg)
    metrics["loss/total"] = loss.detach()
    return loss, metrics


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's value loss per token ``[B,T]``: ``0.5 * max((V - R)^2, (V_clipped - R)^2)``, with ``V_clipped =
    old_V + clamp(V - old_V, -clip, clip)`` (Schulman et al. 2017's implementation; None: plain squared error)."""
    err = (values - returns).square()
    metrics = {}
    if clip is not None:
        clipped = old_values + (values - old_values).clamp(-clip, clip)
        err_clipped = (clipped - returns).square()
        metrics["value/clip_frac"] = masked_mean((err_clipped > err).float(), mask).detach()
        err = torch.maximum(err, err_clipped)
    metrics["value/mse"] = masked_mean((values - returns).square().detach(), mask)
    return 0.5 * err, metrics


def entropy_from_logits(logits: torch.Tensor, mask: torch.Tensor | None = None,
                        chunk_rows: int = 4) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` per position: ``[B,T,V]`` -> ``[B,T]`` float32.

    ``H = logsumexp(l) - sum_v softmax(l)_v * l_v``, the sum a batched dot product, ``chunk_rows`` rows at a
    time: at most one ``[chunk_rows,T,V]`` float32 tensor beyond the logits.
    """
    out = []
    for chunk in logits.split(chunk_rows, dim=0):
        chunk = chunk.float()
        p = torch.softmax(chunk, dim=-1)
        expected = torch.matmul(p.unsqueeze(-2), chunk.unsqueeze(-1)).squeeze(-1).squeeze(-1)  # [b,T]
        out.append(torch.logsumexp(chunk, dim=-1) - expected)
    h = torch.cat(out, dim=0)
    return h if mask is None else h * mask.to(h.dtype)
