"""The LM head's part of a log-prob pass, a chunk of positions at a time, never keeping ``[c, V]`` logits for backward.

A plain bias-free linear head goes through :class:`HeadScores`, which saves the hidden states only and forms the
logits' gradient in place from the softmax p (d logp_x = onehot(x) - p, d H = -p * (log p + H)); any other head
through :func:`chunk_scores` under activation checkpointing.

Shapes: n positions, c per chunk, H hidden size, V vocabulary."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint


def _at_least_float32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


def chunk_scores(head: Callable[[torch.Tensor], torch.Tensor], temperature: float, with_entropy: bool,
                 hidden: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden [c, H] (or logits [c, V] with ``head`` the identity), tokens [c] -> logp [c], entropy [c]."""
    logits = _at_least_float32(head(hidden)) / temperature  # [c, V]
    log_z = torch.logsumexp(logits, -1)  # [c]
    logp = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - log_z
    if not with_entropy:
        return logp, torch.zeros_like(logp)
    # H = -sum p log p = log Z - sum p * logits
    entropy = log_z - (torch.softmax(logits, -1) * logits).sum(-1)
    return logp, entropy


# rows per reduction: logsumexp and p * log p make a temporary the size of their input, for a chunk one more [c, V]
REDUCE_ROWS = 32


def _log_softmax(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """[c, V] log-softmax of ``hidden @ weight.T / temperature`` (at least float32), built in place."""
    logits = _at_least_float32(F.linear(hidden, weight))
    if temperature != 1.0:
        logits.div_(temperature)
    for rows in logits.split(REDUCE_ROWS):
        rows.sub_(torch.logsumexp(rows, -1, keepdim=True))
    return logits


def _entropy(logq: torch.Tensor) -> torch.Tensor:
    """logq [c, V] -> H [c] = -sum p log p."""
    return torch.cat([-(rows.exp() * rows).sum(-1) for rows in logq.split(REDUCE_ROWS)])


class HeadScores(torch.autograd.Function):
    """(hidden [n, H], weight [V, H], tokens [n], temperature, with_entropy, chunk) -> (logp [n], entropy [n]),
    the products in ``weight``'s format; backward sums the chunks' weight gradients into one ``[V, H]`` buffer."""

    @staticmethod
    def forward(ctx, hidden, weight, tokens, temperature, with_entropy, chunk):
        # saved as given and cast again in backward, so that no copy stays alive until then
        ctx.save_for_backward(hidden, weight, tokens)
        ctx.temperature, ctx.chunk = temperature, chunk
        logp = hidden.new_empty(hidden.shape[0], dtype=torch.promote_types(weight.dtype, torch.float32))
        entropy = torch.zeros_like(logp)
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, hidden.shape[0], chunk):
                part = slice(start, start + chunk)
                logq = _log_softmax(hidden[part].to(weight.dtype), weight, temperature)  # [c, V]
                logp[part] = logq.gather(-1, tokens[part].unsqueeze(-1)).squeeze(-1)
                if with_entropy:
                    entropy[part] = _entropy(logq)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, tokens = ctx.saved_tensors
        n = hidden.shape[0]
        grad_logp = grad_logp if grad_logp is not None else hidden.new_zeros(n, dtype=torch.float32)
        with_entropy = grad_entropy is not None and bool(grad_entropy.any())
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        for start in range(0, n, ctx.chunk):
            part = slice(start, start + ctx.chunk)
            h, g_logp = hidden[part].to(weight.dtype), grad_logp[part].unsqueeze(-1)  # [c, H], [c, 1]
            logq = _log_softmax(h, weight, ctx.temperature)  # [c, V]
            if with_entropy:
                entropy = _entropy(logq).unsqueeze(-1)  # [c, 1]
                p = logq.exp()
                # -p * (g_logp + g_H * (log p + H)), accumulated in logq's storage
                coeff = logq.add_(entropy).mul_(grad_entropy[part].unsqueeze(-1)).add_(g_logp)
            else:
                p, coeff = logq.exp_(), g_logp  # log q is not needed again: p takes its storage
            grad_logits = p.mul_(coeff).neg_()
            grad_logits.scatter_add_(-1, tokens[part].unsqueeze(-1), g_logp)
            if ctx.temperature != 1.0:
                grad_logits.div_(ctx.temperature)
            grad_logits = grad_logits.to(weight.dtype)
            if grad_hidden is not None:
                grad_hidden[part] = grad_logits @ weight
            if grad_weight is not None:
                grad_weight.addmm_(grad_logits.t(), h)
        return grad_hidden, grad_weight, None, None, None, None


def _fusable(head: nn.Module) -> bool:
    return type(head) is nn.Linear and head.bias is None


def _head_weight(head: nn.Linear, device: torch.device) -> torch.Tensor:
    """The head's weight in the format autocast would multiply it in (itself outside autocast)."""
    weight = head.weight
    if torch.is_autocast_enabled(device.type) and weight.is_floating_point():
        weight = weight.to(torch.get_autocast_dtype(device.type))  # differentiable: grads reach the fp32 weight
    return weight


def score_chunks(head: nn.Module, feats: torch.Tensor, tokens: torch.Tensor, temperature: float,
                 with_entropy: bool, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """feats [n, F] (hidden states, or logits with ``head`` the identity) and tokens [n] ->
    (logp [n], entropy [n], zeros without ``with_entropy``), ``chunk_size`` positions at a time."""
    if feats.shape[0] == 0:
        empty = feats.new_zeros(0, dtype=torch.float32)
        return empty, empty
    if _fusable(head):
        return HeadScores.apply(feats, _head_weight(head, feats.device), tokens, temperature, with_entropy, chunk_size)
    grad = torch.is_grad_enabled() and feats.requires_grad
    logps, ents = [], []
    for start in range(0, feats.shape[0], chunk_size):
        h, tok = feats[start : start + chunk_size], tokens[start : start + chunk_size]
        if grad:
            lp, ent = checkpoint(chunk_scores, head, temperature, with_entropy, h, tok, use_reentrant=False)
        else:
            lp, ent = chunk_scores(head, temperature, with_entropy, h, tok)
        logps.append(lp)
        ents.append(ent)
    return torch.cat(logps), torch.cat(ents)
