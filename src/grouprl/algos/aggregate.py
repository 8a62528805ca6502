"""Loss aggregation: how per-token values ``[B,T]`` become one scalar.

With ``m`` the completion mask, ``|o_i| = sum_t m_it`` and ``P = B / G``:

    seq-mean-token-mean       (1/B) sum_i (1/|o_i|) sum_t v_it         DeepSeekMath / GRPO paper
    token-mean                (1/sum_i |o_i|) sum_i sum_t v_it          DAPO: every token weighs the same
    seq-mean-token-sum-norm   (1/B) sum_i (1/L) sum_t v_it              Dr. GRPO, L = max_tokens constant
    group-sum                 (1/P) sum_p sum_{i in p} (1/|o_i|) sum_t v_it
    group-sqrt                (1/P) sum_p (1/sqrt(G)) sum_{i in p} (1/|o_i|) sum_t v_it

The per-sequence mean penalises a long wrong answer less per token than a short one (Dr. GRPO's length
bias); token-mean and the constant norm remove it. Both ``group-*`` modes are seq-mean-token-mean times a
constant (G, sqrt(G): how the noise of a sum of G zero-mean advantages grows). Micro-batches pass the
minibatch's ``num_rows`` / ``num_tokens``, so their losses sum exactly to the minibatch's.
"""

from __future__ import annotations

import math

import torch

from grouprl.registry import Registry

AGGREGATIONS: Registry = Registry("loss aggregation")
"""name -> ``fn(values [B,T], mask [B,T], denominators) -> scalar``."""


def _row_means(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B,T]`` -> ``[B]``: each row's mean over its valid tokens (0 for an empty row)."""
    return (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)


@AGGREGATIONS.register("seq-mean-token-mean")
def _seq_mean_token_mean(values, mask, *, num_rows, num_tokens, max_tokens, group_size):
    return _row_means(values, mask).sum() / num_rows


@AGGREGATIONS.register("token-mean")
def _token_mean(values, mask, *, num_rows, num_tokens, max_tokens, group_size):
    return (values * mask).sum() / max(num_tokens, 1.0)


@AGGREGATIONS.register("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(values, mask, *, num_rows, num_tokens, max_tokens, group_size):
    if not max_tokens:
        raise ValueError("aggregation 'seq-mean-token-sum-norm' needs max_tokens (the constant divisor)")
    return (values * mask).sum() / (num_rows * max_tokens)


def _num_groups(num_rows: float, group_size: int | None, mode: str) -> tuple[float, int]:
    if not group_size:
        raise ValueError(f"aggregation {mode!r} needs group_size")
    return num_rows / group_size, group_size


@AGGREGATIONS.register("group-sum")
def _group_sum(values, mask, *, num_rows, num_tokens, max_tokens, group_size):
    groups, _ = _num_groups(num_rows, group_size, "group-sum")
    return _row_means(values, mask).sum() / groups


@AGGREGATIONS.register("group-sqrt")
def _group_sqrt(values, mask, *, num_rows, num_tokens, max_tokens, group_size):
    groups, g = _num_groups(num_rows, group_size, "group-sqrt")
    return _row_means(values, mask).sum() / (groups * math.sqrt(g))


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str, max_tokens: int | None = None,
              group_size: int | None = None, num_rows: float | None = None,
              num_tokens: float | None = None) -> torch.Tensor:
    """Reduce per-token ``values [B,T]`` under ``mask [B,T]`` to a scalar with aggregation ``mode``
    (:data:`AGGREGATIONS`); ``max_tokens`` is seq-mean-token-sum-norm's L, ``group_size`` the ``group-*`` modes'
    G; ``num_rows`` / ``num_tokens`` default to this piece's.

    >>> v = torch.tensor([[1., 2., 3.], [4., 0., 0.]]); m = torch.tensor([[1., 1., 1.], [1., 0., 0.]])
    >>> aggregate(v, m, "seq-mean-token-mean").item(), aggregate(v, m, "token-mean").item()
    (3.0, 2.5)
    """
    if values.shape != mask.shape:
        raise ValueError(f"values {tuple(values.shape)} and mask {tuple(mask.shape)} differ in shape")
    fn = AGGREGATIONS.get(mode)
    mask = mask.to(values.dtype)
    rows = float(values.shape[0]) if num_rows is None else float(num_rows)
    tokens = float(mask.sum().item()) if num_tokens is None else float(num_tokens)
    return fn(values, mask, num_rows=rows, num_tokens=tokens, max_tokens=max_tokens, group_size=group_size)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over positions where ``mask`` is 1 (0 if none): for metrics."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)
