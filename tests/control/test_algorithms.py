"""The classic-control updates against hand-worked values and against each other."""

import copy
from dataclasses import replace

import pytest
import torch

pytest.importorskip("gymnasium")

from grouprl.algos import group_advantages  # noqa: E402
from grouprl.control import (  # noqa: E402
    Agent,
    ControlGRPO,
    ControlPPO,
    ControlTRPO,
    ControlVPG,
    EnvBatch,
    GRPOControlConfig,
    PPOControlConfig,
    Trajectories,
    TRPOControlConfig,
    ValueNet,
    VPGControlConfig,
    critic_advantages,
    make_policy,
)


def constant_critic(value: float, obs_dim: int = 4) -> ValueNet:
    critic = ValueNet(obs_dim, (3,))
    with torch.no_grad():
        for p in critic.parameters():
            p.zero_()
        critic.net.layers[-1].bias.fill_(value)
    return critic


def three_step_rows(cut) -> Trajectories:
    """Two rows of three steps paying 1 each; row 1 is cut (bootstrapped), row 0 terminated."""
    return Trajectories(obs=torch.randn(2, 3, 4), actions=torch.zeros(2, 3, dtype=torch.long), logp=torch.zeros(2, 3),
                        rewards=torch.ones(2, 3), mask=torch.ones(2, 3), last_obs=torch.randn(2, 4),
                        cut=torch.tensor(cut))


def test_critic_advantages_bootstrap_cut_rows_by_hand():
    # V = 2 everywhere, gamma = 0.5. Terminated row: returns 1.75, 1.5, 1 -> advantages -0.25, -0.5, -1.
    # Cut row bootstraps V(last) = 2: returns 1.75 + 0.125*2, 1.5 + 0.25*2, 1 + 0.5*2 = 2, 2, 2 -> advantages 0.
    critic, batch = constant_critic(2.0), three_step_rows([False, True])
    adv, returns, values = critic_advantages(critic, batch, "mc", gamma=0.5)
    torch.testing.assert_close(returns, torch.tensor([[1.75, 1.5, 1.0], [2.0, 2.0, 2.0]]))
    torch.testing.assert_close(adv, torch.tensor([[-0.25, -0.5, -1.0], [0.0, 0.0, 0.0]]))
    torch.testing.assert_close(values, torch.full((2, 3), 2.0))
    # GAE with lambda = 1 is the Monte Carlo advantage
    gae_adv, gae_returns, _ = critic_advantages(critic, batch, "gae", gamma=0.5, lam=1.0)
    torch.testing.assert_close(gae_adv, adv)
    torch.testing.assert_close(gae_returns, returns)
    # one-step returns r + gamma V(s'): 1 + 0.5*2 = 2 except after the terminal step (1)
    n1_adv, _, _ = critic_advantages(critic, batch, "nstep", gamma=0.5, n=1)
    torch.testing.assert_close(n1_adv, torch.tensor([[0.0, 0.0, -1.0], [0.0, 0.0, 0.0]]))
    # reward_scale scales the rewards only: returns of 0.5 per step with gamma 0.5 -> 0.875, 0.75, 0.5
    _, scaled, _ = critic_advantages(critic, batch, "mc", gamma=0.5, reward_scale=0.5)
    torch.testing.assert_close(scaled[0], torch.tensor([0.875, 0.75, 0.5]))


def cartpole_setup(seed=0, critic=True):
    torch.manual_seed(seed)
    envs = EnvBatch("CartPole-v1", 4)
    policy = make_policy(envs.obs_dim, envs.action_space, (8,))
    return envs, Agent(policy, ValueNet(envs.obs_dim, (8,)) if critic else None)


def sgd(params):
    return torch.optim.SGD(params, lr=1.0)


def test_first_ppo_step_is_the_vpg_step():
    # On the first minibatch the ratio is 1, so the clipped loss has exactly the REINFORCE gradient:
    # one epoch, one minibatch and no value/entropy terms move the policy as VPG's single step does.
    envs, agent = cartpole_setup()
    ppo_cfg = PPOControlConfig(num_envs=4, steps_per_env=16, mu=1, minibatch_size=64, vf_coef=0.0, max_grad_norm=0.0)
    vpg_cfg = VPGControlConfig(num_envs=4, steps_per_env=16, advantage="gae", gae_lambda=0.95, value_epochs=0,
                               max_grad_norm=0.0)
    ppo = ControlPPO(ppo_cfg, agent, envs, gamma=0.99, reward_scale=1.0, seed=0)
    batch = ppo.collect(torch.Generator().manual_seed(0))
    twin, initial = copy.deepcopy(agent), copy.deepcopy(agent)
    vpg = ControlVPG(vpg_cfg, twin, envs, gamma=0.99, reward_scale=1.0, seed=0)
    ppo.update(batch, sgd(agent.policy.parameters()), torch.Generator())
    vpg.update(batch, sgd(twin.policy.parameters()), torch.Generator())
    for a, b in zip(agent.policy.parameters(), twin.policy.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert max((a - c).abs().max() for a, c in zip(agent.policy.parameters(), initial.policy.parameters())) > 1e-3


def test_grpo_step_is_reinforce_with_group_normalised_returns():
    envs, agent = cartpole_setup(critic=False)
    cfg = GRPOControlConfig(prompts_per_step=2, group_size=2, mu=1, minibatch_size=4, max_grad_norm=0.0)
    grpo = ControlGRPO(cfg, agent, envs, gamma=1.0, reward_scale=1.0, seed=0)
    batch = grpo.collect(torch.Generator().manual_seed(3))
    # groups: rows (0, 1) and (2, 3) start from the same state
    assert torch.equal(batch.obs[0, 0], batch.obs[1, 0]) and torch.equal(batch.obs[2, 0], batch.obs[3, 0])
    before = copy.deepcopy(agent.policy)
    grpo.update(batch, sgd(agent.policy.parameters()), torch.Generator())
    # by hand: gradient of -(1/N) sum_i A_i sum_t log pi(a_it | s_it), N = all steps (token-mean)
    adv = group_advantages(batch.row_returns(), 2)  # [B]
    logp = before.distribution(batch.obs).log_prob(batch.actions)  # [B, T]
    loss = -(adv.unsqueeze(-1) * logp * batch.mask).sum() / batch.mask.sum()
    grads = torch.autograd.grad(loss, list(before.parameters()))
    for new, old, grad in zip(agent.policy.parameters(), before.parameters(), grads):
        torch.testing.assert_close(new.detach(), old.detach() - grad, atol=1e-6, rtol=1e-5)


def test_grpo_group_of_equal_returns_does_not_move_the_policy():
    envs, agent = cartpole_setup(critic=False)
    cfg = GRPOControlConfig(prompts_per_step=1, group_size=2, mu=1, minibatch_size=2, max_grad_norm=0.0)
    grpo = ControlGRPO(cfg, agent, envs, gamma=1.0, reward_scale=1.0, seed=0)
    batch = grpo.collect(torch.Generator().manual_seed(0))
    rewards = torch.zeros_like(batch.rewards)
    rewards[:, 0] = 1.0  # every episode returns exactly 1, whatever its length
    batch = replace(batch, rewards=rewards)
    before = [p.detach().clone() for p in agent.policy.parameters()]
    metrics = grpo.update(batch, sgd(agent.policy.parameters()), torch.Generator())
    assert metrics["rollout/zero_std_frac"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, agent.policy.parameters()))


def test_vpg_mc_equals_gae_with_lambda_one():
    envs, agent = cartpole_setup()
    twin = copy.deepcopy(agent)
    base = VPGControlConfig(num_envs=4, steps_per_env=16, value_epochs=0, max_grad_norm=0.0)
    mc = ControlVPG(replace(base, advantage="mc"), agent, envs, gamma=0.9, reward_scale=1.0, seed=0)
    batch = mc.collect(torch.Generator().manual_seed(0))
    lam1 = ControlVPG(replace(base, advantage="gae", gae_lambda=1.0), twin, envs, gamma=0.9, reward_scale=1.0, seed=0)
    mc.update(batch, sgd(agent.parameters()), torch.Generator())
    lam1.update(batch, sgd(twin.parameters()), torch.Generator())
    for a, b in zip(agent.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_trpo_step_is_the_exact_natural_gradient_step_inside_the_trust_region():
    # A policy small enough to build its Fisher matrix: 4 -> 2 linear logits (10 parameters).
    torch.manual_seed(0)
    envs = EnvBatch("CartPole-v1", 4)
    policy = make_policy(envs.obs_dim, envs.action_space, ())
    agent = Agent(policy, ValueNet(envs.obs_dim, (8,)))
    cfg = TRPOControlConfig(num_envs=4, steps_per_env=32, max_kl=0.01, damping=0.1, cg_iters=50, value_epochs=1)
    trpo = ControlTRPO(cfg, agent, envs, gamma=0.99, reward_scale=1.0, seed=0)
    batch = trpo.collect(torch.Generator().manual_seed(0))
    before = copy.deepcopy(policy)
    theta0 = torch.cat([p.detach().reshape(-1) for p in before.parameters()])
    adv, _, _ = critic_advantages(agent.critic, batch, "gae", 0.99, cfg.gae_lambda)
    metrics = trpo.update(batch, torch.optim.Adam(trpo.trainable(), lr=1e-3), torch.Generator())
    assert metrics["trpo/accepted"] == 1.0 and metrics["trpo/improvement"] > 0

    # the expected step, built densely: F = Hessian of the mean KL at theta_0, x = (F + 0.1 I)^-1 g
    from grouprl.algos import whiten

    obs, actions = batch.flat(batch.obs), batch.flat(batch.actions)
    a_flat = batch.flat(whiten(adv, batch.mask))
    weight_shape = before.net.layers[0].weight.shape

    def logits(theta):
        w, b = theta[:8].view(weight_shape), theta[8:]
        return obs @ w.T + b

    old_logp_all = torch.log_softmax(logits(theta0), -1).detach()

    def mean_kl(theta):
        logp_all = torch.log_softmax(logits(theta), -1)
        return (old_logp_all.exp() * (old_logp_all - logp_all)).sum(-1).mean()

    def surrogate(theta):
        logp = torch.log_softmax(logits(theta), -1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        return (torch.exp(logp - batch.flat(batch.logp)) * a_flat).mean()

    fisher = torch.autograd.functional.hessian(mean_kl, theta0) + 0.1 * torch.eye(10)
    g = torch.autograd.functional.jacobian(surrogate, theta0)
    x = torch.linalg.solve(fisher, g)
    expected = metrics["trpo/step_frac"] * torch.sqrt(2 * 0.01 / (x @ fisher @ x)) * x
    theta1 = torch.cat([p.detach().reshape(-1) for p in policy.parameters()])
    # conjugate gradient stops at a squared residual of 1e-10, about 1e-3 of this gradient's norm
    assert ((theta1 - theta0) - expected).norm() / expected.norm() < 5e-3
    # and the step respects the trust region, measured afresh
    assert mean_kl(theta1).item() <= 0.01 + 1e-6
    assert metrics["trpo/kl"] == pytest.approx(mean_kl(theta1).item(), rel=1e-4)


def test_gigpo_step_gives_each_step_its_own_advantage_from_rounded_states():
    from grouprl.algos.gigpo import gigpo_advantages, rounded_state_keys

    envs, agent = cartpole_setup(critic=False)
    cfg = GRPOControlConfig(prompts_per_step=1, group_size=4, mu=1, minibatch_size=4, max_grad_norm=0.0,
                            advantage="gigpo", state_key_decimals=1)
    gigpo = ControlGRPO(cfg, agent, envs, gamma=1.0, reward_scale=1.0, seed=0)
    batch = gigpo.collect(torch.Generator().manual_seed(3))
    keys = rounded_state_keys(batch.obs, batch.mask, 1)
    # the first step of the G episodes of one reset is one state: one anchor group
    assert len(set(keys[:, 0].tolist())) == 1 and (keys[batch.mask == 0] == -1).all()
    before = copy.deepcopy(agent.policy)
    metrics = gigpo.update(batch, sgd(agent.policy.parameters()), torch.Generator())
    assert metrics["gigpo/step_groups"] >= 2 and 0 <= metrics["gigpo/singleton_frac"] < 1
    adv, _ = gigpo_advantages(batch.row_returns(), torch.zeros(4, dtype=torch.long), batch.rewards, keys, batch.mask)
    assert not torch.allclose(adv * batch.mask, adv[:, :1] * batch.mask)  # not one value per episode
    logp = before.distribution(batch.obs).log_prob(batch.actions)  # [B, T]
    loss = -(adv * logp * batch.mask).sum() / batch.mask.sum()
    grads = torch.autograd.grad(loss, list(before.parameters()))
    for new, old, grad in zip(agent.policy.parameters(), before.parameters(), grads):
        torch.testing.assert_close(new.detach(), old.detach() - grad, atol=1e-6, rtol=1e-5)
