"""Beam search returning the G best beams of each prompt as its group.

A beam's score is the sum of its tokens' ``log_softmax(logits / T)`` (T = 0 read as 1; no length penalty), so a
prompt is done once its W-th best finished score reaches its best running one; at ``max_new_tokens`` running beams
compete as truncated hypotheses.

Shapes: P prompts, W = G beams per prompt, pa prompts still searching, N = max_new_tokens, V vocabulary,
C candidates that end at a step."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grouprl.rollout.decoding import Decoded, DecodeRequest, finish
from grouprl.rollout.runner import Runner, positions_from_mask
from grouprl.types import SamplingParams

NEG_INF = float("-inf")


@dataclass
class _Hypotheses:
    """The W best finished hypotheses of every prompt, sorted by score (best first)."""

    score: torch.Tensor  # [P, W] float32, -inf where empty
    tokens: torch.Tensor  # [P, W, N] long
    logprobs: torch.Tensor  # [P, W, N] float32
    length: torch.Tensor  # [P, W] long
    truncated: torch.Tensor  # [P, W] bool

    def merge(self, active: torch.Tensor, score: torch.Tensor, tokens: torch.Tensor, logprobs: torch.Tensor,
              length: torch.Tensor, truncated: torch.Tensor) -> None:
        """Keep the W best of the old and C new candidates per active prompt ([pa, C], tokens [pa, C, N])."""
        w = self.score.shape[1]
        best, pick = torch.cat([self.score[active], score], 1).topk(w, -1)  # [pa, W]
        n = tokens.shape[-1]
        pick_n = pick.unsqueeze(-1).expand(-1, -1, n)
        self.tokens[active] = torch.cat([self.tokens[active], tokens], 1).gather(1, pick_n)
        self.logprobs[active] = torch.cat([self.logprobs[active], logprobs], 1).gather(1, pick_n)
        self.length[active] = torch.cat([self.length[active], length], 1).gather(1, pick)
        self.truncated[active] = torch.cat([self.truncated[active], truncated], 1).gather(1, pick)
        self.score[active] = best


def check_beam_request(params: SamplingParams, group_size: int, vocab: int, n_stop: int) -> None:
    """Raise ``ValueError`` for settings beam search would silently ignore, or too many beams."""
    unused = [name for name, off in (("top_k", params.top_k == 0), ("top_p", params.top_p == 1.0),
                                     ("min_p", params.min_p == 0.0),
                                     ("repetition_penalty", params.repetition_penalty == 1.0)) if not off]
    if unused:
        raise ValueError(f"mode='beam' searches the model's own log-probs; unset {', '.join(unused)}")
    if group_size > vocab - n_stop:
        raise ValueError(f"group_size {group_size} exceeds the {vocab - n_stop} tokens that do not stop")


def _stop_candidates(logp: torch.Tensor, beam_score: torch.Tensor, hist_tok: torch.Tensor, hist_lp: torch.Tensor,
                     stop_ids: torch.Tensor, step: int) -> tuple[torch.Tensor, ...]:
    """Every running beam extended by every stop token (C = W * n_stop): logp [pa, W, V], beam_score [pa, W],
    hist_* [pa, W, N] -> score [pa, C], tokens / logprobs [pa, C, N], length [pa, C]."""
    pa, w, n = hist_tok.shape
    k = stop_ids.numel()
    stop_lp = logp[:, :, stop_ids]  # [pa, W, k]
    score = (beam_score.unsqueeze(-1) + stop_lp).reshape(pa, w * k)
    tokens = hist_tok.repeat_interleave(k, 1)  # [pa, C, N]
    tokens[:, :, step] = stop_ids.repeat(w)
    logprobs = hist_lp.repeat_interleave(k, 1)
    logprobs[:, :, step] = stop_lp.reshape(pa, w * k)
    length = torch.full((pa, w * k), step + 1, dtype=torch.long, device=score.device)
    return score, tokens, logprobs, length


def beam_groups(req: DecodeRequest, pad_id: int) -> Decoded:
    """The G best beams of each prompt, prompt-major, sorted by score within each group."""
    params, w = req.params, req.group_size
    p, lp = req.prompt_ids.shape
    n = params.max_new_tokens
    temp = params.temperature or 1.0
    device = req.prompt_ids.device
    runner = Runner(req.model, capacity=lp + n, compiled=req.compiled, fmt=params.format)
    logits = runner.forward(req.prompt_ids, req.prompt_mask, positions_from_mask(req.prompt_mask))  # [P, V]
    vocab = logits.shape[-1]
    runner.repeat_rows(w)
    logp = torch.log_softmax(logits / temp, -1).repeat_interleave(w, 0)  # [P*W, V]

    active = torch.arange(p, device=device)  # [pa]
    # only beam 0 is live at the start, or the W copies of the prompt would propose one continuation W times
    beam_score = torch.full((p, w), NEG_INF, device=device)
    beam_score[:, 0] = 0.0
    hist_tok = torch.full((p, w, n), pad_id, dtype=torch.long, device=device)  # running beams, by active prompt
    hist_lp = torch.zeros(p, w, n, device=device)
    done_hyps = _Hypotheses(
        score=torch.full((p, w), NEG_INF, device=device), tokens=hist_tok.clone(), logprobs=hist_lp.clone(),
        length=torch.zeros(p, w, dtype=torch.long, device=device),
        truncated=torch.zeros(p, w, dtype=torch.bool, device=device),
    )
    attn = torch.ones(p * w, lp + n, dtype=torch.long, device=device)
    attn[:, :lp] = req.prompt_mask.repeat_interleave(w, 0)
    first_pos = req.prompt_mask.sum(-1).repeat_interleave(w)  # [P*W]
    no_trunc = torch.zeros(p, w * req.stop_ids.numel(), dtype=torch.bool, device=device)

    for step in range(n):
        pa = active.numel()
        logp = logp.view(pa, w, vocab)
        score, tokens, logprobs, length = _stop_candidates(logp, beam_score, hist_tok, hist_lp, req.stop_ids, step)
        done_hyps.merge(active, score, tokens, logprobs, length, no_trunc[:pa])

        cand = beam_score.unsqueeze(-1) + logp  # [pa, W, V]
        cand[:, :, req.stop_ids] = NEG_INF
        beam_score, flat = cand.view(pa, w * vocab).topk(w, -1)  # [pa, W]
        src, tok = flat // vocab, flat % vocab
        tok_lp = logp.view(pa, w * vocab).gather(1, flat)  # [pa, W]
        src_n = src.unsqueeze(-1).expand(-1, -1, n)
        hist_tok, hist_lp = hist_tok.gather(1, src_n), hist_lp.gather(1, src_n)
        hist_tok[:, :, step], hist_lp[:, :, step] = tok, tok_lp

        if req.matcher is not None:
            rows = torch.arange(pa * w, device=device)
            hit = req.matcher.completed(hist_tok.view(pa * w, n), rows, step, tok.view(-1)).view(pa, w)
            if hit.any():
                done_hyps.merge(active, beam_score.masked_fill(~hit, NEG_INF), hist_tok, hist_lp,
                                torch.full_like(src, step + 1), torch.zeros_like(hit))
                beam_score = beam_score.masked_fill(hit, NEG_INF)

        if step == n - 1:
            done_hyps.merge(active, beam_score, hist_tok, hist_lp, torch.full_like(src, n),
                            torch.ones_like(src, dtype=torch.bool))
            break
        searching = done_hyps.score[active, -1] < beam_score.max(-1).values  # [pa]
        if not searching.any():
            break
        keep = searching.nonzero().flatten()  # [pa']
        runner.select_rows((keep.unsqueeze(1) * w + src[keep]).flatten())
        active, beam_score = active[keep], beam_score[keep]
        hist_tok, hist_lp, tok = hist_tok[keep], hist_lp[keep], tok[keep]
        rows_kept = (keep.unsqueeze(1) * w + torch.arange(w, device=device)).flatten()
        attn, first_pos = attn[rows_kept], first_pos[rows_kept]
        logits = runner.forward(tok.view(-1, 1), attn[:, : lp + step + 1], (first_pos + step).unsqueeze(1))
        logp = torch.log_softmax(logits / temp, -1)  # [pa' * W, V]

    ended_at = torch.where(done_hyps.truncated, 0, done_hyps.length).view(p * w)
    return finish(done_hyps.tokens.view(p * w, n), done_hyps.logprobs.view(p * w, n), ended_at, n, pad_id)
