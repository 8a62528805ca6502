"""Choosing the next token from a row of logits: penalty, temperature, filters, draw.

The order follows ``transformers``: repetition penalty on the raw logits, then temperature, then
top-k, top-p and min-p (each on the distribution left by the previous one).

Each row draws with ONE uniform number by inverting its cumulative distribution. That makes a
row's token depend only on its own logits and its own uniform, not on which other rows are still
in the batch: dropping finished rows (compaction) or prefilling prompts once per group cannot
change what a seeded run samples.

``sampling_logprobs`` are the log-probabilities under the distribution actually sampled from:
``log_softmax(penalised_logits / T)`` restricted to the tokens the filters keep and renormalised
over them. Without a penalty or filters this equals :func:`grouprl.rollout.logprobs.token_logprobs`
at the same temperature. Greedy rows (T = 0) report ``log_softmax(logits)`` at T = 1.
"""

from __future__ import annotations

import torch

from grouprl.types import SamplingParams


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL penalty: seen tokens' positive logits divided by ``penalty``, negative ones multiplied.

    logits [b, V] float32, seen [b, V] bool -> [b, V].
    """
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


BLOCK = 256
"""Tokens per block of the two-level draw (about the square root of a 50k-150k vocabulary)."""


def _last_with_mass(cdf: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``index`` [b, 1] moved back to the last entry of ``cdf`` [b, K] that adds mass.

    ``u * total`` can round up to the total; a draw must never step past the last entry with mass.
    """
    return torch.minimum(index, (cdf < cdf[:, -1:]).sum(-1, keepdim=True))


def _invert_cdf(weights: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Index drawn from each row of unnormalised ``weights`` [b, K] float32 with uniforms ``u`` [b].

    Returns (index [b] long, the row's total weight [b] float64).

    Two levels, so that no float32 running sum spans the vocabulary (that skews the draw): the block of
    :data:`BLOCK` entries is drawn from the blocks' float32 sums, then the entry from the block's own
    running sum on the uniform's position within the block, rescaled to the block's float64 total."""
    b, k = weights.shape
    whole = k // BLOCK * BLOCK
    sums = weights[:, :whole].view(b, -1, BLOCK).sum(-1)  # [b, nb]
    if whole < k:
        sums = torch.cat([sums, weights[:, whole:].sum(-1, keepdim=True)], -1)  # the ragged last block
    cdf = sums.double().cumsum(-1)  # [b, nb]
    total = cdf[:, -1:]  # [b, 1]
    target = u.double().unsqueeze(-1) * total
    block = _last_with_mass(cdf, torch.searchsorted(cdf, target, right=True))  # [b, 1]
    block_sum = sums.gather(-1, block).double()
    share = (target - (cdf.gather(-1, block) - block_sum)) / block_sum  # [b, 1], in [0, 1] up to rounding
    index = block * BLOCK + torch.arange(BLOCK, device=weights.device)  # [b, BLOCK]
    inside = weights.gather(-1, index.clamp(max=k - 1)).masked_fill(index >= k, 0.0).double().cumsum(-1)
    entry = _last_with_mass(inside, torch.searchsorted(inside, share * inside[:, -1:], right=True))  # [b, 1]
    return (block * BLOCK + entry).squeeze(-1), total.squeeze(-1)


def _keep_sorted(sorted_weights: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Which of the descending unnormalised probabilities ``sorted_weights`` [b, K] the top-p / min-p
    filters keep -> [b, K] bool."""
    keep = torch.ones_like(sorted_weights, dtype=torch.bool)
    if params.top_p < 1.0:
        mass = sorted_weights / sorted_weights.sum(-1, keepdim=True)
        before = mass.cumsum(-1) - mass  # probability of strictly better-ranked tokens
        keep &= before < params.top_p
    if params.min_p > 0.0:
        keep &= sorted_weights >= params.min_p * sorted_weights[:, :1]
    keep[:, 0] = True
    return keep


def pick_tokens(logits: torch.Tensor, params: SamplingParams, u: torch.Tensor | None,
                seen: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Next token of every row and its log-prob under the distribution it was drawn from.

    logits [b, V] float32; u [b] uniforms in [0, 1), ideally float64 (ignored when greedy); seen [b, V] bool (tokens
    already in the prompt or completion, used by the repetition penalty) -> (tokens [b] long,
    logprobs [b] float32).
    """
    # The head's learnt layout can hand over column-major logits; a row's sums must run in one order
    # whatever the layout, or a seeded run would draw differently once the layout is relearnt.
    logits = logits.contiguous()
    if seen is not None and params.repetition_penalty != 1.0:
        logits = apply_repetition_penalty(logits, seen, params.repetition_penalty)
    if params.temperature == 0.0:
        tokens = logits.argmax(-1)
        return tokens, _at(logits, tokens) - torch.logsumexp(logits, -1)

    scaled = logits / params.temperature if params.temperature != 1.0 else logits
    top = scaled.amax(-1)  # [b]
    weights = (scaled - top.unsqueeze(-1)).exp_()  # [b, V] unnormalised probabilities, the largest 1
    if params.top_k <= 0 and params.top_p >= 1.0 and params.min_p <= 0.0:
        tokens, mass = _invert_cdf(weights, u)
    else:
        if 0 < params.top_k < weights.shape[-1]:
            sorted_weights, order = weights.topk(params.top_k, -1)  # [b, k], descending
        else:
            sorted_weights, order = weights.sort(-1, descending=True)  # [b, V]
        rank, mass = _invert_cdf(sorted_weights * _keep_sorted(sorted_weights, params), u)  # [b]
        tokens = order.gather(-1, rank.unsqueeze(-1)).squeeze(-1)
    # log of the token's weight over the kept mass: log_softmax at the token, renormalised over what the filters keep
    return tokens, _at(scaled, tokens) - top - mass.float().log()


def _at(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """rows [b, V], index [b] -> rows[i, index[i]]  [b]."""
    return rows.gather(-1, index.unsqueeze(-1)).squeeze(-1)
