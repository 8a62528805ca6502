"""The sampling decode loop: G independent samples per prompt on a shared prefill. Finished rows leave the batch and
the cache at once; a step is a few tensor operations with one host sync ("did any row finish").

Shapes: P prompts, G samples each, B = P*G rows (prompt-major), Lp padded prompt length, N = max_new_tokens, b rows
still running, V vocabulary."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from grouprl.rollout.cpu.compiled import CompiledStep
from grouprl.rollout.picking import pick_tokens
from grouprl.rollout.runner import Runner, positions_from_mask
from grouprl.rollout.stops import StopStringMatcher
from grouprl.types import SamplingParams


@dataclass
class DecodeRequest:
    """Everything one decode loop needs, validated by :class:`~grouprl.rollout.sampler.Sampler`."""

    model: nn.Module
    prompt_ids: torch.Tensor
    """[P, Lp] long, left-padded."""
    prompt_mask: torch.Tensor
    """[P, Lp] long."""
    group_size: int
    params: SamplingParams
    stop_ids: torch.Tensor
    """[n_stop] long: EOS ids and ``params.stop_token_ids``."""
    matcher: StopStringMatcher | None
    uniforms: torch.Tensor | None
    """[B, N] float64: row b's uniform for its n-th token; None when greedy."""
    share_prefill: bool = True
    compact: bool = True
    """Drop finished rows from the batch (False: decode on and discard their tokens)."""
    compiled: CompiledStep | None = None


@dataclass
class Decoded:
    """Raw decode output, prompt-major."""

    tokens: torch.Tensor
    """[B, T] long, pad after each row's length."""
    logprobs: torch.Tensor
    """[B, T] float32, 0 after each row's length."""
    lengths: torch.Tensor
    """[B] long, tokens that count (up to and including the stopping token)."""
    truncated: torch.Tensor
    """[B] bool, ran out of max_new_tokens without stopping."""


def row_uniforms(row_seeds: list[int], steps: int, device: torch.device) -> torch.Tensor:
    """``[B, steps]`` float64 uniforms in [0, 1), row b's from ``row_seeds[b]`` alone, whatever the batch."""
    out = torch.empty(len(row_seeds), steps, dtype=torch.float64)
    for b, seed in enumerate(row_seeds):
        out[b] = torch.rand(steps, generator=torch.Generator().manual_seed(int(seed)), dtype=torch.float64)
    return out.to(device)


def prefill(runner: Runner, req: DecodeRequest) -> torch.Tensor:
    """Run the prompts through the model and leave a cache of B rows; returns [B, V] next-token logits."""
    g = req.group_size
    ids, mask = req.prompt_ids, req.prompt_mask
    if req.share_prefill:
        logits = runner.forward(ids, mask, positions_from_mask(mask))  # [P, V]
        runner.repeat_rows(g)
        return logits.repeat_interleave(g, 0)  # [B, V]
    ids, mask = ids.repeat_interleave(g, 0), mask.repeat_interleave(g, 0)
    return runner.forward(ids, mask, positions_from_mask(mask))  # [B, V]


def seen_tokens(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, vocab: int) -> torch.Tensor:
    """[n, V] bool: which tokens occur among each row's real prompt tokens."""
    counts = torch.zeros(prompt_ids.shape[0], vocab, device=prompt_ids.device)
    counts.scatter_add_(1, prompt_ids, prompt_mask.float())
    return counts > 0


def finish(out_tokens: torch.Tensor, out_logprobs: torch.Tensor, ended_at: torch.Tensor, steps: int,
           pad_id: int) -> Decoded:
    """Cut the [B, N] step buffers to the longest row and blank everything past each row's end."""
    lengths = torch.where(ended_at > 0, ended_at, torch.full_like(ended_at, steps))  # [B]
    width = int(lengths.max())
    past = torch.arange(width, device=lengths.device).unsqueeze(0) >= lengths.unsqueeze(1)  # [B, T]
    tokens = out_tokens[:, :width].masked_fill(past, pad_id)
    logprobs = out_logprobs[:, :width].masked_fill(past, 0.0)
    return Decoded(tokens=tokens, logprobs=logprobs, lengths=lengths, truncated=ended_at == 0)


def rows_to_keep(running: torch.Tensor, fewest: int) -> torch.Tensor:
    """Indices [b'] of the ``running`` [b] rows, topped up with finished ones to ``fewest``."""
    keep = running.nonzero().flatten()
    short = fewest - len(keep)
    if short > 0:
        keep = torch.cat([keep, (~running).nonzero().flatten()[:short]]).sort().values
    return keep


def sample_groups(req: DecodeRequest, pad_id: int) -> Decoded:
    """Draw G completions per prompt. Returns prompt-major [B, T] tokens and their sampling log-probs."""
    params = req.params
    p, lp = req.prompt_ids.shape
    g, n = req.group_size, params.max_new_tokens
    b_all = p * g
    device = req.prompt_ids.device
    runner = Runner(req.model, capacity=lp + n, compiled=req.compiled, fmt=params.format)
    logits = prefill(runner, req)  # [B, V]

    rows = torch.arange(b_all, device=device)  # original row of each running row  [b]
    attn = torch.ones(b_all, lp + n, dtype=torch.long, device=device)  # [B, Lp + N]
    attn[:, :lp] = req.prompt_mask.repeat_interleave(g, 0)
    first_pos = req.prompt_mask.sum(-1).repeat_interleave(g)  # [B] position of the first new token
    seen = None
    if params.repetition_penalty != 1.0:
        seen = seen_tokens(req.prompt_ids, req.prompt_mask, logits.shape[-1]).repeat_interleave(g, 0)

    out_tokens = torch.full((b_all, n), pad_id, dtype=torch.long, device=device)
    out_logprobs = torch.zeros(b_all, n, device=device)
    ended_at = torch.zeros(b_all, dtype=torch.long, device=device)  # 0 while running, else length
    step = 0
    for step in range(n):
        u = req.uniforms[rows, step] if req.uniforms is not None else None
        tokens, logprobs = pick_tokens(logits, params, u, seen)  # [b], [b]
        out_tokens[rows, step] = tokens
        out_logprobs[rows, step] = logprobs
        done = torch.isin(tokens, req.stop_ids)  # [b]
        if req.matcher is not None:
            done |= req.matcher.completed(out_tokens, rows, step, tokens)
        done &= ended_at[rows] == 0  # a row decoding past its end (no compaction, or padding) stopped before
        if done.any():
            ended_at[rows[done]] = step + 1
            if bool((ended_at > 0).all()) or step == n - 1:
                break
            keep = rows_to_keep(ended_at[rows] == 0, runner.fewest_rows) if req.compact else None  # [b']
            if keep is not None and len(keep) < len(rows):
                rows, tokens = rows[keep], tokens[keep]
                attn, first_pos = attn[keep], first_pos[keep]
                seen = seen[keep] if seen is not None else None
                runner.select_rows(keep)
        if step == n - 1:
            break
        if seen is not None:
            seen.scatter_(1, tokens.unsqueeze(1), True)
        logits = runner.forward(tokens.unsqueeze(1), attn[:, : lp + step + 1], (first_pos + step).unsqueeze(1))
    return finish(out_tokens, out_logprobs, ended_at, step + 1, pad_id)
