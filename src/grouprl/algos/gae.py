"""Returns and advantages over per-step rewards: Monte Carlo, n-step (A3C), GAE(gamma, lambda), whitening.

Trajectories are right-padded rows of ``[B,T]``, ``mask[b, t] = 1`` on row b's steps; ``last_values [B]``
bootstraps a row cut off rather than finished (0 = terminated). :func:`gae` also takes rows whose steps are
not consecutive (policy tokens between environment tokens).
"""

from __future__ import annotations

import torch


def _next_values(values: torch.Tensor, mask: torch.Tensor, last_values: torch.Tensor | None) -> torch.Tensor:
    """``[B,T]``: V(s_{t+1}) inside the row, ``last_values`` after its last step, 0 on padding."""
    nxt = torch.zeros_like(values)
    nxt[:, :-1] = values[:, 1:] * mask[:, 1:]
    if last_values is not None:
        lengths = mask.sum(-1).long()  # [B]
        rows = torch.nonzero(lengths > 0).squeeze(-1)
        nxt[rows, lengths[rows] - 1] = last_values[rows].to(values.dtype)
    return nxt


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float,
                       last_values: torch.Tensor | None = None) -> torch.Tensor:
    """Monte Carlo returns ``G_t = r_t + gamma * G_{t+1}``: ``[B,T]`` -> ``[B,T]`` (0 on padding).

    >>> discounted_returns(torch.tensor([[1., 1., 1.]]), torch.ones(1, 3), 0.5).tolist()
    [[1.75, 1.5, 1.0]]
    """
    mask = mask.to(rewards.dtype)
    out = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0]) if last_values is None else last_values.to(rewards.dtype).clone()
    for t in reversed(range(rewards.shape[1])):
        # Padding steps carry the bootstrap value through unchanged until the row's last step.
        running = torch.where(mask[:, t] > 0, rewards[:, t] + gamma * running, running)
        out[:, t] = running * mask[:, t]
    return out


def nstep_returns(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, n: int,
                  last_values: torch.Tensor | None = None) -> torch.Tensor:
    """A3C's n-step returns ``R_t = sum_{k<n} gamma^k r_{t+k} + gamma^n V(s_{t+n})``: ``[B,T]``; past the
    row's end the bootstrap is ``last_values`` (or 0), so ``n >= T`` is the Monte Carlo return."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    mask = mask.to(rewards.dtype)
    b, t_len = rewards.shape
    lengths = mask.sum(-1).long()
    boot = torch.zeros(b, dtype=values.dtype, device=values.device) if last_values is None else last_values
    vals = torch.cat([values * mask, torch.zeros_like(values[:, :1])], dim=1)  # [B, T+1]: the bootstrap last
    vals[torch.arange(b), lengths] = boot.to(values.dtype)
    r = torch.cat([rewards * mask, torch.zeros(b, n, dtype=rewards.dtype, device=rewards.device)], dim=1)
    out = torch.zeros_like(rewards)
    for k in range(n):
        out += gamma**k * r[:, k:k + t_len]
    idx = (torch.arange(t_len, device=rewards.device).unsqueeze(0) + n).clamp(max=lengths.unsqueeze(-1))  # [B,T]
    # the bootstrap's discount is gamma^(steps actually taken), fewer near the row's end
    out += gamma ** (idx - torch.arange(t_len, device=rewards.device)).to(rewards.dtype) * vals.gather(1, idx)
    return out * mask


def _step_order(mask: torch.Tensor) -> torch.Tensor:
    """``[B,T]`` long: the positions of each row's steps first, in order, then the rest."""
    return torch.sort((mask <= 0).to(torch.int8), dim=-1, stable=True).indices


def compact(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``x [B,T]`` with each row's steps (``mask > 0``) moved to its front, in order; 0 after them.

    >>> compact(torch.tensor([[1., 9., 2., 3.]]), torch.tensor([[1., 0., 1., 1.]])).tolist()
    [[1.0, 2.0, 3.0, 0.0]]
    """
    steps = mask.sum(-1, keepdim=True)
    front = torch.arange(x.shape[1], device=x.device).unsqueeze(0) < steps
    return x.gather(1, _step_order(mask)) * front.to(x.dtype)


def spread(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`compact`: front-packed ``x [B,T]`` back to the positions of ``mask``.

    >>> spread(torch.tensor([[1., 2., 3., 0.]]), torch.tensor([[1., 0., 1., 1.]])).tolist()
    [[1.0, 0.0, 2.0, 3.0]]
    """
    return torch.zeros_like(x).scatter(1, _step_order(mask), x) * mask.to(x.dtype)


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float,
        last_values: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016).

    ``delta_t = r_t + gamma * V(s_{t+1}) - V(s_t)``, ``A_t = delta_t + gamma * lam * A_{t+1}``,
    returns ``= A + V``; ``rewards``, ``values``, ``mask`` ``[B,T]`` -> ``(advantages [B,T], returns [B,T])``."""
    mask = mask.to(rewards.dtype)
    if bool((mask[:, 1:] > mask[:, :-1]).any()):  # a gap inside a row: run over the steps alone
        adv, returns = gae(compact(rewards, mask), compact(values.to(rewards.dtype), mask), compact(mask, mask),
                           gamma, lam, last_values)
        return spread(adv, mask), spread(returns, mask)
    values = values.to(rewards.dtype) * mask
    deltas = (rewards + gamma * _next_values(values, mask, last_values) - values) * mask
    adv = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        running = deltas[:, t] + gamma * lam * running * (mask[:, t + 1] if t + 1 < rewards.shape[1] else 0.0)
        adv[:, t] = running * mask[:, t]
    return adv, (adv + values) * mask


def whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """Normalise ``x [B,T]`` to unit variance (and zero mean if ``shift_mean``) over valid positions."""
    mask = mask.to(x.dtype)
    n = mask.sum().clamp(min=1)
    mean = (x * mask).sum() / n
    var = ((x - mean).square() * mask).sum() / n
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask
