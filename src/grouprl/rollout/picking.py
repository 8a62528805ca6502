"""The next token from a row of logits, in ``transformers``' order: repetition penalty, temperature, top-k, top-p,
min-p. Each row inverts its CDF with ONE uniform, so its token never depends on the rest of the batch; its log-prob
is under the distribution sampled from (greedy: ``log_softmax(logits)``)."""

from __future__ import annotations

import torch

from grouprl.types import SamplingParams


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL penalty on seen tokens: logits [b, V] float32, seen [b, V] bool -> [b, V]."""
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


BLOCK = 256  # tokens per block of the two-level draw (about the square root of a 50k-150k vocabulary)


def _last_with_mass(cdf: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``index`` [b, 1] moved back to the last entry of ``cdf`` [b, K] that adds mass (``u * total`` may round up)."""
    return torch.minimum(index, (cdf < cdf[:, -1:]).sum(-1, keepdim=True))


def _invert_cdf(weights: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(index [b] long, total weight [b] float64) drawn from unnormalised ``weights`` [b, K] with uniforms ``u`` [b],
    in two levels (a block, then the entry in it) so no float32 running sum spans the vocabulary."""
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
    """[b, K] bool: which of the descending ``sorted_weights`` [b, K] top-p and min-p keep."""
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
    """logits [b, V] float32, u [b] uniforms (unused when greedy), seen [b, V] bool (repetition penalty) ->
    (next tokens [b] long, their log-probs [b] float32)."""
    # a row's sums must run in one order whatever the head's layout, or a seeded run could draw differently
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
