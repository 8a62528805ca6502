"""Which tokens carry the policy gradient: the high-entropy minority (Wang et al. 2025, "Beyond the 80/20
Rule: High-Entropy Minority Tokens Drive Effective Reinforcement Learning for LLM Reasoning", arXiv 2506.01939).

The paper trains on the top 20% of tokens by entropy, the "forks" where the policy is unsure:

    tau = quantile_{1-q}( H_t over the batch's policy tokens )      (linear interpolation)
    w_t = 1[ H_t >= tau ]

The weight multiplies the policy-gradient term only (KL, entropy bonus and denominators count every token).
The quantile is the whole minibatch's, so the micro-batch size changes only memory and speed.
"""

from __future__ import annotations

import torch


def entropy_threshold(entropies: torch.Tensor, quantile: float) -> torch.Tensor:
    """The entropy at or above which a token is among the top ``quantile`` (q in (0, 1]) of ``entropies [N]``:
    the ``1 - q`` quantile interpolated as ``torch.quantile`` does (it refuses 2^24 values); ``-inf`` if none.

    >>> round(float(entropy_threshold(torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0]), 0.2)), 4)  # 0.8 * 4 = 3.2
    3.2
    """
    if not 0 < quantile <= 1:
        raise ValueError(f"top_entropy_quantile must be in (0, 1], got {quantile}")
    values = entropies.detach().float().flatten()
    if values.numel() == 0 or quantile == 1:
        return torch.tensor(float("-inf"))
    ordered = values.sort().values
    position = (1.0 - quantile) * (values.numel() - 1)  # fractional index of the quantile
    below = int(position)
    above = min(below + 1, values.numel() - 1)
    return ordered[below] + (position - below) * (ordered[above] - ordered[below])


def top_entropy_weights(entropy: torch.Tensor, mask: torch.Tensor, threshold: torch.Tensor | float) -> torch.Tensor:
    """``[B,T]`` float 0/1: the tokens of ``mask`` whose ``entropy [B,T]`` is at least ``threshold``."""
    return ((entropy.detach().float() >= threshold) & (mask > 0)).float()
