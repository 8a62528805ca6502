import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grouprl.algos import (
    AdaptiveKLController,
    clipped_surrogate_loss,
    entropy_from_logits,
    group_advantages,
    grpo_loss,
    kl_per_token,
    value_loss,
)

# The worked example: four outputs of one prompt, one token each.
# Some write-ups of this example take min(r*A, r*A) (no clip at all) and then invert the ratio
# (pi_old / pi_theta) in the final formula; we follow the paper: rho = pi_theta / pi_old and
# min(rho*A, clip(rho, 1-eps, 1+eps)*A).
ADV = torch.tensor([1.7320508, -0.5773503, -0.5773503, -0.5773503])
RATIOS = torch.tensor([1.25, 1.0, 0.75, 0.75])


def _one_token(x):
    return x.view(4, 1)


def test_worked_example_surrogate_per_output():
    logp = _one_token(torch.log(RATIOS))
    loss, m = clipped_surrogate_loss(logp, torch.zeros_like(logp), ADV, torch.ones(4, 1), eps_low=0.2)
    # clipped ratios [1.2, 1.0, 0.8, 0.8]:
    #   o1: min(1.25*1.732, 1.2*1.732)   = 2.0784610
    #   o2: 1.0*(-0.577)                 = -0.5773503
    #   o3: min(0.75*-0.577, 0.8*-0.577) = -0.4618802 (the clipped term is the smaller)
    expected = torch.tensor([2.0784610, -0.5773503, -0.4618802, -0.4618802])
    torch.testing.assert_close(-loss.view(4), expected, atol=1e-6, rtol=0)
    # o1 is clipped high (A>0, rho>1.2); o3, o4 clipped low (A<0, rho<0.8)
    assert m["clip_high"].item() == pytest.approx(0.25)
    assert m["clip_low"].item() == pytest.approx(0.5)
    assert m["ratio_mean"].item() == pytest.approx(0.9375)


def test_worked_example_k3_sum():
    pi_theta = torch.tensor([0.4, 0.2, 0.2, 0.2])
    pi_ref = torch.tensor([0.5, 0.2, 0.15, 0.15])
    # k3 = pi_ref/pi - log(pi_ref/pi) - 1: 0.0268564 + 0 + 2 * 0.0376821
    kl = kl_per_token(torch.log(pi_theta), torch.log(pi_ref), "k3")
    assert kl.sum().item() == pytest.approx(0.1022206, abs=1e-6)


def test_k1_k2_hand_values():
    logp, ref = torch.log(torch.tensor([0.4])), torch.log(torch.tensor([0.5]))
    d = math.log(0.5 / 0.4)
    assert kl_per_token(logp, ref, "k1").item() == pytest.approx(-d, abs=1e-6)
    assert kl_per_token(logp, ref, "k2").item() == pytest.approx(d * d / 2, abs=1e-6)


def test_k3_is_unbiased_for_kl_on_samples_from_the_policy():
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(6), 0)
    q = torch.softmax(torch.randn(6), 0)
    exact = (p * (p.log() - q.log())).sum()
    samples = torch.multinomial(p, 200_000, replacement=True)
    est = kl_per_token(p.log()[samples], q.log()[samples], "k3").mean()
    assert est.item() == pytest.approx(exact.item(), rel=0.03)


@settings(max_examples=200, deadline=None)
@given(st.floats(-30, 30), st.floats(-30, 30))
def test_k3_is_non_negative(a, b):
    assert kl_per_token(torch.tensor([a]), torch.tensor([b]), "k3").item() >= 0.0


def test_gradient_at_rho_one_is_reinforce():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 7, requires_grad=True)
    tokens = torch.randint(0, 7, (3, 5))
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]], dtype=torch.float32)
    adv = torch.tensor([0.7, -1.2, 0.4])

    def logp_fn():
        return torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

    logp = logp_fn()
    loss, _ = clipped_surrogate_loss(logp, logp.detach(), adv, mask)
    (g_clip,) = torch.autograd.grad((loss * mask).sum(), logits)
    reinforce = -(adv.unsqueeze(-1) * logp_fn() * mask).sum()
    (g_pg,) = torch.autograd.grad(reinforce, logits)
    torch.testing.assert_close(g_clip, g_pg)


def test_clipped_tokens_have_no_gradient():
    logp = torch.log(torch.tensor([[1.5], [0.5]])).requires_grad_()
    loss, _ = clipped_surrogate_loss(logp, torch.zeros(2, 1), torch.tensor([1.0, -1.0]), torch.ones(2, 1))
    loss.sum().backward()
    assert torch.equal(logp.grad, torch.zeros(2, 1))


def test_eps_high_is_asymmetric():
    logp = torch.log(torch.tensor([[1.25]]))
    loss, _ = clipped_surrogate_loss(logp, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1),
                                     eps_low=0.2, eps_high=0.28)
    assert -loss.item() == pytest.approx(1.25)  # 1.25 < 1.28: not clipped


def test_dual_clip_bounds_negative_advantage_loss():
    logp = torch.log(torch.tensor([[10.0], [10.0]]))
    adv = torch.tensor([-1.0, 1.0])
    loss, m = clipped_surrogate_loss(logp, torch.zeros(2, 1), adv, torch.ones(2, 1), dual_clip=3.0)
    # A<0: -min(10*-1, 0.8*-1) = 10 without the dual clip; bounded at c*|A| = 3.
    assert loss[0].item() == pytest.approx(3.0)
    assert loss[1].item() == pytest.approx(-1.2)  # A>0 untouched: clipped at 1.2
    assert m["clip_dual"].item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        clipped_surrogate_loss(logp, torch.zeros(2, 1), adv, torch.ones(2, 1), dual_clip=0.5)


def test_sequence_level_ratio_is_gspo():
    # row log-ratios [0.1, 0.3, (pad 5.0)] -> sequence log-ratio 0.2 on every token
    logp = torch.tensor([[0.1, 0.3, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, m = clipped_surrogate_loss(logp, torch.zeros(1, 3), torch.tensor([1.0]), mask, eps_low=0.5, level="sequence")
    torch.testing.assert_close(-loss, torch.full((1, 3), math.exp(0.2)))


def test_grpo_loss_composes_surrogate_kl_and_aggregation():
    logp = torch.log(RATIOS).view(4, 1).requires_grad_()
    old = torch.zeros(4, 1)
    pi_theta = torch.tensor([0.4, 0.2, 0.2, 0.2]).view(4, 1)
    pi_ref = torch.tensor([0.5, 0.2, 0.15, 0.15]).view(4, 1)
    # Use log pi_theta as the "current" log-probs for the KL part by shifting old accordingly:
    logp2 = torch.log(pi_theta).requires_grad_()
    old2 = logp2.detach() - torch.log(RATIOS).view(4, 1)  # ratios stay [1.25, 1, .75, .75]
    loss, m = grpo_loss(logp2, old2, torch.log(pi_ref), ADV, torch.ones(4, 1), eps_low=0.2, beta=0.04,
                        aggregation="seq-mean-token-mean")
    surrogate = torch.tensor([2.0784610, -0.5773503, -0.4618802, -0.4618802]).mean()
    expected = -surrogate + 0.04 * 0.1022206 / 4
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    assert m["policy/kl"].item() == pytest.approx(0.1022206 / 4, abs=1e-6)
    assert m["loss/kl"].item() == pytest.approx(0.04 * 0.1022206 / 4, abs=1e-7)
    del logp, old


def test_grpo_loss_without_reference_when_beta_zero():
    logp = torch.randn(4, 3, requires_grad=True)
    loss, m = grpo_loss(logp, None, None, group_advantages(torch.tensor([1.0, 0, 0, 1]), 2), torch.ones(4, 3))
    assert "policy/kl" not in m and torch.isfinite(loss)
    with pytest.raises(ValueError, match="needs ref_logp"):
        grpo_loss(logp, None, None, torch.zeros(4), torch.ones(4, 3), beta=0.1)


def test_grpo_loss_entropy_bonus_lowers_loss():
    logp = torch.randn(2, 3, requires_grad=True)
    ent = torch.full((2, 3), 2.0)
    base, _ = grpo_loss(logp, None, None, torch.zeros(2), torch.ones(2, 3))
    bonus, m = grpo_loss(logp, None, None, torch.zeros(2), torch.ones(2, 3), entropy=ent, entropy_coef=0.01)
    assert bonus.item() == pytest.approx(base.item() - 0.02)
    assert m["policy/entropy"].item() == pytest.approx(2.0)


def test_value_loss_clipping():
    values = torch.tensor([[2.0, 0.0]])
    old = torch.tensor([[0.0, 0.0]])
    ret = torch.tensor([[3.0, 1.0]])
    loss, m = value_loss(values, old, ret, torch.ones(1, 2), clip=0.5)
    # token 0: unclipped (2-3)^2=1, clipped (0.5-3)^2=6.25 -> max 6.25 -> 3.125; token 1: (0-1)^2 -> 0.5
    torch.testing.assert_close(loss, torch.tensor([[3.125, 0.5]]))
    assert m["value/clip_frac"].item() == pytest.approx(0.5)
    plain, _ = value_loss(values, old, ret, torch.ones(1, 2))
    torch.testing.assert_close(plain, torch.tensor([[0.5, 0.5]]))


def test_entropy_from_logits_matches_naive():
    torch.manual_seed(0)
    logits = torch.randn(5, 4, 11) * 3
    mask = torch.ones(5, 4)
    mask[1, 2:] = 0
    p = torch.softmax(logits, -1)
    naive = -(p * torch.log_softmax(logits, -1)).sum(-1) * mask
    torch.testing.assert_close(entropy_from_logits(logits, mask, chunk_rows=2), naive)
    uniform = entropy_from_logits(torch.zeros(1, 1, 8))
    assert uniform.item() == pytest.approx(math.log(8))
    assert entropy_from_logits(torch.zeros(1, 1, 8, dtype=torch.bfloat16)).dtype == torch.float32


def test_adaptive_kl_controller():
    c = AdaptiveKLController(beta=0.1, target=6.0, horizon=10_000)
    c.update(current_kl=3.0, n_steps=1000)  # error clipped to -0.2 -> beta * (1 - 0.02)
    assert c.beta == pytest.approx(0.098)
    c.update(current_kl=6.6, n_steps=1000)  # error 0.1 -> * 1.01
    assert c.beta == pytest.approx(0.098 * 1.01)
    d = AdaptiveKLController(beta=0, target=1, horizon=1)
    d.load_state_dict(c.state_dict())
    assert d == c
