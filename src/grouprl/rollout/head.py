"""The LM head's part of a log-prob pass: logits of a chunk of positions, the log-prob of the
given token and the entropy there, never keeping a chunk's ``[c, V]`` logits for backward.

For a plain bias-free linear head outside autocast, :class:`HeadScores` has its backward written
out: it saves only the chunk's hidden states, recomputes the logits once, and forms the logits'
gradient in place from the softmax p (log-probs of tokens x and entropies H = -sum p log p):

    d logp_x / d logits = onehot(x) - p
    d H      / d logits = -p * (log p + H)

so the chunk costs one exp and a few in-place passes over ``[c, V]`` instead of autograd's
saved softmax, log-softmax and their backward kernels. Under autocast the products run in the
autocast format, as autocast would run them (the weight cast once per pass, the log-softmax in
float32): on SmolLM2's head in bf16, 656 positions, forward and backward take 1.28 s against 1.81 s
through autograd with checkpointing (one thread, AMD EPYC Zen 4, ``python benchmarks/head.py``).
Any other head (a peft-wrapped one, one with a bias) goes through :func:`chunk_scores` under
activation checkpointing, with the same results.

Shapes: n positions, c per chunk, H hidden size, V vocabulary.
"""

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


def _log_softmax(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """[c, V] log-softmax of ``hidden @ weight.T / temperature`` (at least float32), built in place."""
    logits = _at_least_float32(F.linear(hidden, weight))
    if temperature != 1.0:
        logits.div_(temperature)
    return logits.sub_(torch.logsumexp(logits, -1, keepdim=True))


class HeadScores(torch.autograd.Function):
    """(hidden [c, H], weight [V, H], tokens [c], temperature, with_entropy) -> (logp [c], entropy [c]).

    The products run in ``weight``'s format (``hidden`` is cast to it; its gradient comes back in
    its own), whatever autocast says: the caller casts the weight once for all chunks."""

    @staticmethod
    def forward(ctx, hidden, weight, tokens, temperature, with_entropy):
        # Saved as given (a view of the pass's features) and cast again in backward, so that no copy
        # per chunk stays alive until then.
        ctx.save_for_backward(hidden, weight, tokens)
        with torch.autocast(hidden.device.type, enabled=False):
            logq = _log_softmax(hidden.to(weight.dtype), weight, temperature)  # [c, V]
        logp = logq.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        entropy = -(logq.exp() * logq).sum(-1) if with_entropy else torch.zeros_like(logp)
        ctx.temperature = temperature
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, tokens = ctx.saved_tensors
        given_dtype, hidden = hidden.dtype, hidden.to(weight.dtype)
        logq = _log_softmax(hidden, weight, ctx.temperature)  # [c, V]
        p = logq.exp()
        if grad_logp is None:
            grad_logp = torch.zeros_like(tokens, dtype=logq.dtype)
        if grad_entropy is not None and bool(grad_entropy.any()):
            entropy = -(p * logq).sum(-1, keepdim=True)  # [c, 1]
            # -p * (g_logp + g_H * (log p + H)), accumulated in logq's storage
            coeff = logq.add_(entropy).mul_(grad_entropy.unsqueeze(-1)).add_(grad_logp.unsqueeze(-1))
        else:
            coeff = grad_logp.unsqueeze(-1)
        grad_logits = p.mul_(coeff).neg_()
        grad_logits.scatter_add_(-1, tokens.unsqueeze(-1), grad_logp.unsqueeze(-1))
        if ctx.temperature != 1.0:
            grad_logits.div_(ctx.temperature)
        grad_logits = grad_logits.to(hidden.dtype)
        grad_hidden = (grad_logits @ weight).to(given_dtype) if ctx.needs_input_grad[0] else None
        grad_weight = grad_logits.t() @ hidden if ctx.needs_input_grad[1] else None
        return grad_hidden, grad_weight, None, None, None


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
    grad = torch.is_grad_enabled() and feats.requires_grad
    weight = _head_weight(head, feats.device) if _fusable(head) else None
    logps, ents = [], []
    for start in range(0, feats.shape[0], chunk_size):
        h, tok = feats[start : start + chunk_size], tokens[start : start + chunk_size]
        if weight is not None:
            lp, ent = HeadScores.apply(h, weight, tok, temperature, with_entropy)
        elif grad:
            lp, ent = checkpoint(chunk_scores, head, temperature, with_entropy, h, tok, use_reentrant=False)
        else:
            lp, ent = chunk_scores(head, temperature, with_entropy, h, tok)
        logps.append(lp)
        ents.append(ent)
    if not logps:
        empty = feats.new_zeros(0, dtype=torch.float32)
        return empty, empty
    return torch.cat(logps), torch.cat(ents)
