"""CISPO, SAPO and GMPO against hand-worked numbers, their limits, and the peers' formulas (TRL's, verl's,
the papers') written out from their documentation on the same inputs."""

import math

import pytest
import torch

from grouprl.algos import POLICY_LOSSES, cispo_loss, clipped_surrogate_loss, gmpo_loss, grpo_loss, sapo_loss
from tests.helpers.messages import named


def _logits_case(seed=0, b=4, t=5, v=7):
    torch.manual_seed(seed)
    logits = torch.randn(b, t, v, requires_grad=True)
    tokens = torch.randint(0, v, (b, t))
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.float32)
    adv = torch.tensor([0.7, -1.2, 0.4, -0.3])

    def logp_fn():
        return torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

    return logits, logp_fn, mask, adv


def _grad(loss, wrt):
    (g,) = torch.autograd.grad(loss, wrt)
    return g


# ------------------------------------------------------------------------------------------- CISPO
def test_cispo_by_hand_clipped_tokens_keep_their_gradient():
    # pi_old [0.4, 0.3, 0.05], pi [0.2, 0.3, 0.3] -> rho [0.5, 1, 6]; A [1, -2, 1]
    logp = torch.log(torch.tensor([[0.2], [0.3], [0.3]])).requires_grad_()
    old = torch.log(torch.tensor([[0.4], [0.3], [0.05]]))
    adv, mask = torch.tensor([1.0, -2.0, 1.0]), torch.ones(3, 1)
    loss, m = cispo_loss(logp, old, adv, mask, eps_low=None, eps_high=4.0)
    # weights sg(clip(rho, -, 5)) = [0.5, 1, 5]; loss = -w * A * log pi:
    #   -0.5 * 1 * ln 0.2 = 0.8047190;  -1 * -2 * ln 0.3 = -2.4079456;  -5 * 1 * ln 0.3 = 6.0198640
    torch.testing.assert_close(loss, torch.tensor([[0.8047190], [-2.4079456], [6.0198640]]), atol=1e-6, rtol=0)
    loss.sum().backward()
    # d loss / d log pi = -w * A = [-0.5, 2, -5]: the capped token (rho = 6) still learns, damped to 5
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.5], [2.0], [-5.0]]))
    assert float(m["clip_high"]) == pytest.approx(1 / 3) and float(m["clip_low"]) == 0.0
    # the clipped surrogate gives that token no gradient at all (rho = 6 > 1.2 with A > 0)
    plain = logp.detach().clone().requires_grad_()
    clipped, _ = clipped_surrogate_loss(plain, old, adv, mask, 0.2)
    clipped.sum().backward()
    assert plain.grad[2].item() == 0.0
    # a lower bound 0.8 lifts the first weight from 0.5 to 0.8
    low = logp.detach().clone().requires_grad_()
    loss, m = cispo_loss(low, old, adv, mask, eps_low=0.2, eps_high=4.0)
    loss.sum().backward()
    assert low.grad[0].item() == pytest.approx(-0.8) and float(m["clip_low"]) == pytest.approx(1 / 3)


def test_cispo_gradient_is_reinforce_where_no_weight_is_clipped():
    logits, logp_fn, mask, adv = _logits_case()
    logp = logp_fn()
    reinforce = _grad(-(adv.unsqueeze(-1) * logp_fn() * mask).sum(), logits)
    on_policy, _ = cispo_loss(logp, logp.detach(), adv, mask)  # rho = 1 everywhere
    torch.testing.assert_close(_grad((on_policy * mask).sum(), logits), reinforce)
    # off-policy inside the bounds: REINFORCE weighted by each token's ratio, sg(rho) * A * grad log pi
    old = logp.detach() + 0.3 * torch.randn(4, 5).clamp(-1, 1)  # |log rho| <= 0.3: rho in [0.74, 1.35]
    loss, m = cispo_loss(logp_fn(), old, adv, mask, eps_low=0.5, eps_high=0.5)
    assert float(m["clip_low"]) == float(m["clip_high"]) == 0.0
    rho = torch.exp(logp.detach() - old)
    weighted = _grad(-(rho * adv.unsqueeze(-1) * logp_fn() * mask).sum(), logits)
    torch.testing.assert_close(_grad((loss * mask).sum(), logits), weighted)


def test_cispo_equals_trl_and_verl_formulas():
    torch.manual_seed(1)
    logp = (torch.randn(3, 6) - 1.5).requires_grad_()
    old = logp.detach() + 2.0 * torch.randn(3, 6)  # ratios from e^-5 to e^5: many clipped
    adv, mask = torch.randn(3), torch.ones(3, 6)
    # TRL: per_token_loss = -clamp(coef_1, max=epsilon_high).detach() * A * logp, epsilon_high = 5.0 (ScaleRL)
    trl = -torch.clamp(torch.exp(logp - old), max=5.0).detach() * adv.unsqueeze(-1) * logp
    ours, _ = cispo_loss(logp, old, adv, mask, eps_low=None, eps_high=4.0)
    torch.testing.assert_close(ours, trl)
    # verl: -clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high).detach() * A * logp, (0.2, 0.28)
    verl = -torch.clamp(torch.exp(logp - old), 1 - 0.2, 1 + 0.28).detach() * adv.unsqueeze(-1) * logp
    ours, _ = cispo_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    torch.testing.assert_close(ours, verl)
    torch.testing.assert_close(_grad(ours.sum(), logp), _grad(verl.sum(), logp))


# -------------------------------------------------------------------------------------------- SAPO
def test_sapo_by_hand():
    # rho [1, 1.5, 0.5], A [1, 1, -1]: tau [1, 1, 1.05]
    logp = torch.log(torch.tensor([[1.0], [1.5], [0.5]])).requires_grad_()
    loss, m = sapo_loss(logp, torch.zeros(3, 1), torch.tensor([1.0, 1.0, -1.0]), torch.ones(3, 1))
    # f = sigmoid(tau (rho - 1)) * 4 / tau; loss = -f A
    #   0.5 * 4 = 2 -> -2;  sigmoid(0.5) = 0.6224593, * 4 = 2.4898373 -> -2.4898373
    #   sigmoid(-0.525) = 0.3716838, * 4 / 1.05 = 1.4159383 -> +1.4159383
    torch.testing.assert_close(loss, torch.tensor([[-2.0], [-2.4898373], [1.4159383]]), atol=1e-6, rtol=0)
    loss.sum().backward()
    # d loss / d log pi = -A * 4 s (1 - s) * rho: -1 * 1 * 1 = -1;  -1 * 0.9400148 * 1.5 = -1.4100223;
    #   +1 * 0.9341398 * 0.5 = 0.4670699
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.0], [-1.4100223], [0.4670699]]), atol=1e-6, rtol=0)
    assert float(m["gate"]) == pytest.approx((1.0 + 0.9400148 + 0.9341398) / 3, abs=1e-6)


def test_sapo_limits_of_its_temperature():
    logits, logp_fn, mask, adv = _logits_case(2)
    logp = logp_fn()
    old = logp.detach() + torch.empty(4, 5).uniform_(0.1, 0.5) * torch.sign(torch.randn(4, 5))  # |log rho| >= 0.1
    rho = torch.exp(logp.detach() - old)
    # tau -> 0: weight sech^2 -> 1, the unclipped surrogate rho * A (here tau = 1e-3: 1 - weight < 1e-6)
    unclipped = _grad(-(torch.exp(logp_fn() - old) * adv.unsqueeze(-1) * mask).sum(), logits)
    soft, _ = sapo_loss(logp_fn(), old, adv, mask, tau_pos=1e-3, tau_neg=1e-3)
    torch.testing.assert_close(_grad((soft * mask).sum(), logits), unclipped, atol=1e-5, rtol=1e-5)
    # tau -> infinity: sech^2(tau (rho - 1) / 2) -> 0 wherever rho != 1: no off-policy update at all
    hard, m = sapo_loss(logp_fn(), old, adv, mask, tau_pos=1e4, tau_neg=1e4)
    assert float(_grad((hard * mask).sum(), logits).abs().max()) == 0.0 and float(m["gate"]) == 0.0
    # ... while on-policy (rho = 1) the gradient is REINFORCE's for any tau
    reinforce = _grad(-(adv.unsqueeze(-1) * logp_fn() * mask).sum(), logits)
    for tau in (1e-3, 1.0, 1e4):
        on, _ = sapo_loss(logp_fn(), logp.detach(), adv, mask, tau_pos=tau, tau_neg=tau)
        torch.testing.assert_close(_grad((on * mask).sum(), logits), reinforce, msg=named(f"tau={tau}"))
    del rho


def test_sapo_equals_trl_formula():
    torch.manual_seed(3)
    logp = (torch.randn(4, 5) - 1).requires_grad_()
    old = logp.detach() + 0.5 * torch.randn(4, 5)
    adv = torch.tensor([1.3, -0.4, 0.0, 2.0])
    # TRL: get_sapo_token_loss(r, tau) = sigmoid(tau * (r - 1)) * 4 / tau, tau_pos where A > 0 else tau_neg;
    # per_token_loss = -that * A
    ratio, a = torch.exp(logp - old), adv.unsqueeze(-1).expand(4, 5)
    tau = torch.where(a > 0, torch.tensor(1.0), torch.tensor(1.05))
    trl = -(torch.sigmoid(tau * (ratio - 1)) * 4 / tau) * a
    ours, _ = sapo_loss(logp, old, adv, torch.ones(4, 5), tau_pos=1.0, tau_neg=1.05)
    torch.testing.assert_close(ours, trl)
    torch.testing.assert_close(_grad(ours.sum(), logp), _grad(trl.sum(), logp))


# -------------------------------------------------------------------------------------------- GMPO
def test_gmpo_by_hand():
    logp = torch.tensor([[0.1, 0.6, -0.2], [-0.6, 0.3, 9.0]]).requires_grad_()  # old = 0: these are log rho
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    loss, m = gmpo_loss(logp, torch.zeros(2, 3), torch.tensor([1.0, -2.0]), mask, eps_low=0.4)
    # row 0, A > 0: min(log rho, clip(log rho, -0.4, 0.4)) = [0.1, 0.4, -0.2]; mean 0.1; R = e^0.1 = 1.1051709
    # row 1, A < 0: max(...) = [-0.4, 0.3] (the 9.0 is padding); mean -0.05; R = e^-0.05 = 0.9512294
    # loss = -A R on every token: -1.1051709 and 1.9024588
    torch.testing.assert_close(loss, torch.tensor([[-1.1051709] * 3, [1.9024588] * 3]), atol=1e-6, rtol=0)
    # with seq-mean-token-mean each row counts once: d/d log rho_t = -A R / |o| on unclipped tokens, 0 on clipped
    rows = (loss * mask).sum(-1) / mask.sum(-1)
    rows.sum().backward()
    expected = torch.tensor([[-1.1051709 / 3, 0.0, -1.1051709 / 3], [0.0, 2 * 0.9512294 / 2, 0.0]])
    torch.testing.assert_close(logp.grad, expected, atol=1e-6, rtol=0)
    assert float(m["clip_high"]) == pytest.approx(1 / 5) and float(m["clip_low"]) == pytest.approx(1 / 5)
    assert float(m["geo_ratio_mean"]) == pytest.approx((1.1051709 + 0.9512294) / 2, abs=1e-6)


def test_gmpo_equals_the_papers_product_form():
    """The paper: sgn(A) * (prod_t |min(rho_t A, clip(rho_t, e^-eps, e^eps) A)|)^(1/|o|), averaged over the G
    sequences; here through grpo_loss with the paper's per-sequence aggregation."""
    torch.manual_seed(4)
    logp = (0.4 * torch.randn(4, 6)).requires_grad_()
    old = torch.zeros(4, 6)
    mask = torch.tensor([[1.0] * 6, [1.0] * 3 + [0.0] * 3, [1.0] * 5 + [0.0], [1.0] * 2 + [0.0] * 4])
    adv = torch.tensor([1.5, -0.5, 0.8, -2.0])
    ours, _ = grpo_loss(logp, old, None, adv, mask, policy_loss="gmpo", eps_low=0.4)
    rho, a = torch.exp(logp - old), adv.unsqueeze(-1)
    term = torch.minimum(rho * a, rho.clamp(math.exp(-0.4), math.exp(0.4)) * a).abs()
    term = torch.where(mask > 0, term, torch.ones_like(term))  # padding multiplies by 1
    objective = torch.sign(adv) * term.prod(-1) ** (1 / mask.sum(-1))
    paper = -objective.mean()
    assert ours.item() == pytest.approx(paper.item(), abs=1e-6)
    torch.testing.assert_close(_grad(ours, logp), _grad(paper, logp), atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------------------------------- together
@pytest.mark.parametrize("aggregation", ["seq-mean-token-mean", "token-mean"])
@pytest.mark.parametrize("name", ["cispo", "sapo", "gmpo"])
def test_on_policy_every_variant_takes_the_clipped_surrogates_step(name, aggregation):
    """rho = 1: clip, cispo and sapo all give -A grad log pi per token; gmpo's -A_i R_i with dR_i = R_i mean_t
    d log pi_t gives the same sum under either aggregation (token-mean weighs row i by |o_i|, undoing the mean)."""
    logits, logp_fn, mask, adv = _logits_case(5)
    clip, _ = grpo_loss(logp_fn(), None, None, adv, mask, aggregation=aggregation)
    other, _ = grpo_loss(logp_fn(), None, None, adv, mask, aggregation=aggregation, policy_loss=name)
    torch.testing.assert_close(_grad(other, logits), _grad(clip, logits))


def test_grpo_loss_names_an_unknown_variant_or_knob():
    logp = torch.zeros(2, 3, requires_grad=True)
    with pytest.raises(ValueError, match="unknown policy loss 'cisp' \\(did you mean 'cispo'"):
        grpo_loss(logp, None, None, torch.ones(2), torch.ones(2, 3), policy_loss="cisp")
    with pytest.raises(TypeError, match="tau_pos"):
        grpo_loss(logp, None, None, torch.ones(2), torch.ones(2, 3), policy_loss="cispo", tau_pos=1.0)
    with pytest.raises(ValueError, match="sapo needs finite tau_pos > 0"):
        sapo_loss(logp, logp.detach(), torch.ones(2), torch.ones(2, 3), tau_pos=0.0)
    assert POLICY_LOSSES.names() == ["cispo", "clip", "gmpo", "sapo"]
