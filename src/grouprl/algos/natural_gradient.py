"""TRPO's natural gradient (Schulman et al. 2015): solve ``F x = g`` by conjugate gradient on Fisher-vector
products (F = Hessian of the mean KL to the rollout policy at theta_old, by double backprop), scale to the
trust-region edge ``beta = sqrt(2 delta / x^T F x)``, backtrack until the surrogate improves within ``delta``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def conjugate_gradient(fvp: Callable[[torch.Tensor], torch.Tensor], b: torch.Tensor, iters: int = 10,
                       tol: float = 1e-10) -> torch.Tensor:
    """Solve ``A x = b [N]`` for symmetric positive-definite ``A`` given only ``fvp: v [N] -> A v [N]``, in at
    most ``iters`` iterations, stopping once the squared residual norm is under ``tol``."""
    x = torch.zeros_like(b)
    r = b.clone()
    p = b.clone()
    rr = r.dot(r)
    for _ in range(iters):
        if rr <= tol:
            break
        ap = fvp(p)
        alpha = rr / p.dot(ap)
        x += alpha * p
        r -= alpha * ap
        rr_new = r.dot(r)
        p = r + (rr_new / rr) * p
        rr = rr_new
    return x


def flat_grad(output: torch.Tensor, params: Sequence[torch.Tensor], **kwargs) -> torch.Tensor:
    """Gradient of scalar ``output`` w.r.t. ``params`` as one flat ``[N]`` vector (zeros for unused)."""
    grads = torch.autograd.grad(output, params, allow_unused=True, **kwargs)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params)])


def fisher_vector_product(kl: torch.Tensor, params: Sequence[torch.Tensor],
                          damping: float = 0.1) -> Callable[[torch.Tensor], torch.Tensor]:
    """``v -> (F + damping I) v`` where F is the Hessian of the scalar mean ``kl`` w.r.t. ``params``.

    ``kl`` is built with the rollout policy detached, so at theta_old its Hessian is the Fisher matrix; damping
    keeps CG stable."""
    grad_kl = flat_grad(kl, params, create_graph=True)

    def fvp(v: torch.Tensor) -> torch.Tensor:
        return flat_grad(grad_kl.dot(v.detach()), params, retain_graph=True) + damping * v

    return fvp


def natural_step_size(direction: torch.Tensor, f_direction: torch.Tensor, max_kl: float) -> torch.Tensor:
    """Scale of the step to the trust-region edge, ``sqrt(2 delta / x^T F x)``: the quadratic model of the KL
    after the step ``beta * x`` is ``beta^2 x^T F x / 2 = delta``."""
    shs = direction.dot(f_direction).clamp(min=1e-12)
    return torch.sqrt(2.0 * max_kl / shs)


def backtracking_line_search(evaluate: Callable[[torch.Tensor], tuple[float, float]], full_step: torch.Tensor,
                             expected_improve: float, max_kl: float, max_backtracks: int = 10,
                             shrink: float = 0.5,
                             accept_ratio: float = 0.1) -> tuple[torch.Tensor, dict[str, float]]:
    """Try ``full_step [N] * shrink^k`` for k = 0.. until ``evaluate(step) -> (surrogate improvement, KL)`` shows
    ``KL <= max_kl`` (delta) and a positive improvement of at least ``accept_ratio`` times the first-order
    prediction (``expected_improve = g . full_step``). ``(step, metrics)``; the step is zeros if none was accepted.
    """
    frac = 1.0
    for k in range(max_backtracks):
        step = full_step * frac
        improve, kl = evaluate(step)
        predicted = expected_improve * frac
        if kl <= max_kl and improve > 0 and improve >= accept_ratio * predicted:
            return step, {"trpo/accepted": 1.0, "trpo/backtracks": float(k), "trpo/kl": kl,
                          "trpo/improvement": improve, "trpo/step_frac": frac}
        frac *= shrink
    return torch.zeros_like(full_step), {"trpo/accepted": 0.0, "trpo/backtracks": float(max_backtracks),
                                         "trpo/kl": 0.0, "trpo/improvement": 0.0, "trpo/step_frac": 0.0}


def get_flat_params(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """``[N]`` copy of the parameters."""
    return torch.cat([p.detach().reshape(-1) for p in params])


def set_flat_params(params: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    """Write a flat ``[N]`` vector back into ``params`` in place."""
    offset = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            p.copy_(flat[offset:offset + n].view_as(p))
            offset += n


def trpo_step(params: Sequence[torch.Tensor], grad: torch.Tensor, fvp: Callable[[torch.Tensor], torch.Tensor],
              evaluate: Callable[[torch.Tensor], tuple[float, float]], *, max_kl: float, cg_iters: int,
              backtracks: int, accept_ratio: float = 0.1,
              solved: Callable[[], None] | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """One TRPO update of ``params`` in place (the module docstring's steps). ``grad [N]`` is the surrogate's
    gradient at theta_old in ``params``' flat order; ``fvp: v -> (F + damping I) v``;
    ``evaluate(step) -> (surrogate improvement, KL)`` at theta_old + step; ``solved()`` runs once the direction is
    known (to free what the Fisher-vector products held). Returns ``(step [N], metrics)``, zeros if none accepted.
    """
    direction = conjugate_gradient(fvp, grad, cg_iters)
    full_step = natural_step_size(direction, fvp(direction), max_kl) * direction
    if solved is not None:
        solved()
    theta_old = get_flat_params(params)

    def trial(step: torch.Tensor) -> tuple[float, float]:
        set_flat_params(params, theta_old + step)
        return evaluate(step)

    step, metrics = backtracking_line_search(trial, full_step, float(grad.dot(full_step)), max_kl, backtracks,
                                             accept_ratio=accept_ratio)
    set_flat_params(params, theta_old + step)
    metrics.update({"trpo/grad_norm": float(grad.norm()), "trpo/step_norm": float(step.norm())})
    return step, metrics
