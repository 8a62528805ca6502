import pytest
import torch

from grouprl.algos import discounted_returns, gae, nstep_returns, whiten


def test_gae_hand_built_episode():
    # One episode r = [0, 0, 1], V = [0.5, 0.6, 0.7], gamma 0.9, lambda 0.8, terminal after step 2.
    # deltas: t2 = 1 - 0.7 = 0.3 ; t1 = 0.9*0.7 - 0.6 = 0.03 ; t0 = 0.9*0.6 - 0.5 = 0.04
    # A2 = 0.3 ; A1 = 0.03 + 0.72*0.3 = 0.246 ; A0 = 0.04 + 0.72*0.246 = 0.21712
    # A second row is the same episode cut to 2 steps and right-padded with garbage.
    r = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 9.0]])
    v = torch.tensor([[0.5, 0.6, 0.7], [0.5, 0.6, 9.0]])
    m = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = gae(r, v, m, gamma=0.9, lam=0.8)
    torch.testing.assert_close(adv[0], torch.tensor([0.21712, 0.246, 0.3]))
    torch.testing.assert_close(ret[0], torch.tensor([0.71712, 0.846, 1.0]))
    # row 2 terminates after step 1: A1 = 0 - 0.6 ; A0 = (0.54 - 0.5) + 0.72 * -0.6
    torch.testing.assert_close(adv[1], torch.tensor([0.04 - 0.432, -0.6, 0.0]))


def test_gae_with_gamma_lambda_one_is_return_minus_value():
    torch.manual_seed(0)
    r = torch.randn(3, 6)
    v = torch.randn(3, 6)
    m = torch.ones(3, 6)
    m[1, 4:] = 0
    m[2, 1:] = 0
    adv, ret = gae(r, v, m, gamma=1.0, lam=1.0)
    mc = discounted_returns(r, m, 1.0)
    torch.testing.assert_close(adv, (mc - v) * m)
    torch.testing.assert_close(ret, mc)


def test_gae_lambda_zero_is_one_step_td():
    r = torch.tensor([[1.0, 2.0]])
    v = torch.tensor([[0.5, 0.25]])
    adv, _ = gae(r, v, torch.ones(1, 2), gamma=0.5, lam=0.0)
    torch.testing.assert_close(adv, torch.tensor([[1.0 + 0.125 - 0.5, 2.0 - 0.25]]))


def test_bootstrap_of_a_cut_off_row():
    r = torch.tensor([[1.0, 1.0]])
    v = torch.tensor([[0.0, 0.0]])
    adv, _ = gae(r, v, torch.ones(1, 2), gamma=0.5, lam=1.0, last_values=torch.tensor([4.0]))
    # A1 = 1 + 0.5*4 = 3 ; A0 = 1 + 0.5*3 = 2.5
    torch.testing.assert_close(adv, torch.tensor([[2.5, 3.0]]))
    torch.testing.assert_close(discounted_returns(r, torch.ones(1, 2), 0.5, torch.tensor([4.0])),
                               torch.tensor([[2.5, 3.0]]))


def test_discounted_returns_respect_padding():
    r = torch.tensor([[1.0, 1.0, 1.0], [2.0, 5.0, 5.0]])
    m = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    torch.testing.assert_close(discounted_returns(r, m, 0.5), torch.tensor([[1.75, 1.5, 1.0], [2.0, 0.0, 0.0]]))


def test_nstep_returns():
    r = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    v = torch.tensor([[10.0, 20.0, 30.0, 40.0]])
    m = torch.ones(1, 4)
    g = 0.5
    # n = 2: R_t = r_t + g r_{t+1} + g^2 V_{t+2}; past the end there is no value (terminal)
    expected = torch.tensor([[1 + g * 2 + g * g * 30, 2 + g * 3 + g * g * 40, 3 + g * 4, 4.0]])
    torch.testing.assert_close(nstep_returns(r, v, m, g, 2), expected)
    # n = 1 is the TD target
    torch.testing.assert_close(nstep_returns(r, v, m, g, 1), torch.tensor([[1 + 10.0, 2 + 15.0, 3 + 20.0, 4.0]]))
    # n >= T is Monte Carlo
    torch.testing.assert_close(nstep_returns(r, v, m, g, 10), discounted_returns(r, m, g))
    # a cut-off row bootstraps from last_values with the right discount
    boot = nstep_returns(r, v, m, g, 2, last_values=torch.tensor([8.0]))
    assert boot[0, 3].item() == pytest.approx(4 + g * 8)
    assert boot[0, 2].item() == pytest.approx(3 + g * 4 + g * g * 8)
    with pytest.raises(ValueError):
        nstep_returns(r, v, m, g, 0)


def test_whiten():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    w = whiten(x, m)
    valid = w[m > 0]
    assert valid.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert valid.var(unbiased=False).item() == pytest.approx(1.0, abs=1e-5)
    assert w[0, 3].item() == 0.0


def test_gae_over_a_trajectory_skips_the_environment_tokens():
    # policy tokens at 0, 1 and 4 (2, 3 are the environment's reply): GAE runs over the three policy
    # steps as if they were consecutive, and leaves 0 on the environment's positions
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 0.0]])
    rewards = torch.tensor([[0.0, 0.0, 5.0, 5.0, 1.0, 0.0]])  # rewards on environment tokens never count
    values = torch.tensor([[0.2, 0.4, 9.0, 9.0, 0.5, 0.0]])
    adv, returns = gae(rewards, values, mask, 0.9, 0.8)
    dense_adv, dense_ret = gae(torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.2, 0.4, 0.5]]), torch.ones(1, 3),
                               0.9, 0.8)
    torch.testing.assert_close(adv[0, [0, 1, 4]], dense_adv[0])
    torch.testing.assert_close(returns[0, [0, 1, 4]], dense_ret[0])
    assert adv[0, [2, 3, 5]].abs().sum() == 0 and returns[0, [2, 3, 5]].abs().sum() == 0
    # by hand: deltas 0.9*0.4-0.2 = 0.16, 0.9*0.5-0.4 = 0.05, 1-0.5 = 0.5; A_2 = 0.5, A_1 = 0.05 + 0.72*0.5 = 0.41,
    # A_0 = 0.16 + 0.72*0.41 = 0.4552
    torch.testing.assert_close(adv[0, [0, 1, 4]], torch.tensor([0.4552, 0.41, 0.5]))
