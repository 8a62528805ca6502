"""On-policy distillation (Agarwal et al. 2024, "On-Policy Distillation of Language Models", GKD with the student's
own samples; Lu and Thinking Machines 2025): the student samples, a teacher scores every sampled token, and the
per-token reverse KL to the teacher is the signal. Its single-sample estimate at a sampled token y_t is

    KL_t = log pi_student(y_t | ...) - log pi_teacher(y_t | ...)

and the token's advantage is its negative, held constant (stop-gradient on both), so the policy-gradient loss
pushes up the tokens the teacher likes more than the student does:

    A_t = A + coef * (log pi_teacher(y_t) - log pi_student(y_t))

with A the task's advantage (per completion ``[B]`` or per token ``[B, T]``; 0 without a task reward).
"""

from __future__ import annotations

import torch


def distill_advantages(advantages: torch.Tensor, student_logp: torch.Tensor, teacher_logp: torch.Tensor,
                       mask: torch.Tensor, coef: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(``[B, T]`` advantages, metrics): ``advantages`` (``[B]`` or ``[B, T]``) plus ``coef`` times the teacher's
    minus the student's log-prob of each sampled token (``[B, T]`` each, the student's as sampled), 0 where
    ``mask [B, T]`` is 0. Metrics: ``reverse_kl`` (the mean per-token estimate over the masked tokens) and
    ``teacher_logp`` (the teacher's mean log-prob of them).

    >>> a, m = distill_advantages(torch.tensor([1.0]), torch.tensor([[-1.0, -2.0, -5.0]]),
    ...                           torch.tensor([[-0.5, -3.0, 0.0]]), torch.tensor([[1.0, 1.0, 0.0]]), 2.0)
    >>> a.tolist(), round(float(m["reverse_kl"]), 4), float(m["teacher_logp"])
    ([[2.0, -1.0, 0.0]], 0.25, -1.75)
    """
    gap = (teacher_logp - student_logp).detach()  # [B, T] log pi_T - log pi_S: minus the reverse KL estimate
    base = advantages if advantages.dim() == 2 else advantages.unsqueeze(-1)
    out = (base + coef * gap) * mask
    tokens = mask.sum().clamp(min=1)
    metrics = {"reverse_kl": -(gap * mask).sum() / tokens, "teacher_logp": (teacher_logp * mask).sum() / tokens}
    return out, metrics
