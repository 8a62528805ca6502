import pytest
import torch

from grouprl.algos import (
    backtracking_line_search,
    conjugate_gradient,
    fisher_vector_product,
    flat_grad,
    get_flat_params,
    natural_step_size,
    set_flat_params,
)


def test_conjugate_gradient_solves_spd_system():
    torch.manual_seed(0)
    q = torch.randn(20, 20, dtype=torch.float64)
    a = q @ q.T + 0.5 * torch.eye(20, dtype=torch.float64)
    b = torch.randn(20, dtype=torch.float64)
    x = conjugate_gradient(lambda v: a @ v, b, iters=60, tol=1e-20)
    torch.testing.assert_close(x, torch.linalg.solve(a, b), atol=1e-6, rtol=0)


def test_fisher_vector_product_matches_explicit_hessian():
    torch.manual_seed(0)
    theta = torch.randn(5, requires_grad=True)
    old = torch.softmax(theta.detach(), 0)
    kl = (old * (old.log() - torch.log_softmax(theta, 0))).sum()
    fvp = fisher_vector_product(kl, [theta], damping=0.0)
    v = torch.randn(5)
    # Fisher of a categorical in logit space: diag(p) - p p^T
    fisher = torch.diag(old) - torch.outer(old, old)
    torch.testing.assert_close(fvp(v), fisher @ v, atol=1e-6, rtol=0)


def _policy_problem(seed=0):
    """A tabular softmax policy over 4 states x 3 actions with logged actions and advantages."""
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(4, 3, generator=g).requires_grad_()
    old_logp_all = torch.log_softmax(theta.detach(), -1)
    states = torch.randint(0, 4, (256,), generator=g)
    actions = torch.multinomial(old_logp_all.exp()[states], 1, generator=g).squeeze(-1)
    adv = torch.randn(256, generator=g) + (actions == 0).float()  # action 0 is better
    old_logp = old_logp_all[states, actions]

    def surrogate():
        logp = torch.log_softmax(theta, -1)[states, actions]
        return (torch.exp(logp - old_logp) * adv).mean()

    def mean_kl():
        logp_all = torch.log_softmax(theta, -1)
        return (old_logp_all.exp() * (old_logp_all - logp_all)).sum(-1).mean()

    return theta, surrogate, mean_kl


def test_trpo_step_respects_kl_and_improves_surrogate():
    theta, surrogate, mean_kl = _policy_problem()
    params = [theta]
    max_kl = 0.01
    base = surrogate()
    g = flat_grad(base, params)
    fvp = fisher_vector_product(mean_kl(), params, damping=0.01)
    x = conjugate_gradient(fvp, g, iters=10)
    beta = natural_step_size(x, fvp(x), max_kl)
    full_step = beta * x
    # the quadratic model puts the full step on the trust-region edge
    assert 0.5 * full_step.dot(fvp(full_step)).item() == pytest.approx(max_kl, rel=1e-4)
    theta0 = get_flat_params(params)

    def evaluate(step):
        set_flat_params(params, theta0 + step)
        with torch.no_grad():
            result = (surrogate() - base).item(), mean_kl().item()
        set_flat_params(params, theta0)
        return result

    step, metrics = backtracking_line_search(evaluate, full_step, g.dot(full_step).item(), max_kl)
    assert metrics["trpo/accepted"] == 1.0
    set_flat_params(params, theta0 + step)
    with torch.no_grad():
        assert mean_kl().item() <= max_kl
        assert surrogate().item() > base.item()


def test_line_search_rejects_when_no_step_is_acceptable():
    step, metrics = backtracking_line_search(lambda s: (-1.0, 0.0), torch.ones(3), 1.0, 0.01, max_backtracks=4)
    assert torch.equal(step, torch.zeros(3))
    assert metrics["trpo/accepted"] == 0.0
    # KL too large at the full step, fine after two halvings
    calls = []

    def evaluate(s):
        calls.append(s[0].item())
        return s[0].item(), s[0].item() ** 2

    step, metrics = backtracking_line_search(evaluate, torch.ones(1), 1.0, max_kl=0.1)
    assert calls == [1.0, 0.5, 0.25]
    assert step.item() == 0.25 and metrics["trpo/backtracks"] == 2.0
