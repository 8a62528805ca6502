"""Classic-control building blocks: the environment batch, the two collectors, the policies."""

import math

import numpy as np
import pytest
import torch

pytest.importorskip("gymnasium")

from grouprl.control import EnvBatch, SegmentCollector, make_policy, run_episodes  # noqa: E402
from grouprl.control.policies import CategoricalPolicy, GaussianPolicy  # noqa: E402


def cartpole_policy(seed=0):
    torch.manual_seed(seed)
    envs = EnvBatch("CartPole-v1", 1)
    return make_policy(envs.obs_dim, envs.action_space, (16,))


def test_same_reset_seed_gives_the_same_start_and_only_named_envs_move():
    envs = EnvBatch("CartPole-v1", 3)
    obs = envs.reset([0, 1, 2], [5, 5, 6])
    assert np.array_equal(obs[0], obs[1]) and not np.array_equal(obs[0], obs[2])
    nxt, rewards, term, trunc = envs.step([1], np.array([0]))
    assert nxt.shape == (1, 4) and rewards.tolist() == [1.0] and not term[0] and not trunc[0]
    # env 0 did not move: stepping it with the same action reproduces env 1's transition
    again, *_ = envs.step([0], np.array([0]))
    assert np.array_equal(again, nxt)


def test_box_actions_are_clipped_to_the_bounds():
    # Pendulum's reward is -(theta^2 + 0.1 thetadot^2 + 0.001 u^2) with u clipped to [-2, 2]
    envs = EnvBatch("Pendulum-v1", 2)
    envs.reset([0, 1], [3, 3])
    _, rewards, _, _ = envs.step([0, 1], np.array([[2.0], [50.0]], dtype=np.float32))
    assert rewards[0] == rewards[1]


def test_run_episodes_rows_follow_the_seeds_and_hold_whole_episodes():
    envs = EnvBatch("CartPole-v1", 4)
    policy = cartpole_policy()
    batch = run_episodes(envs, policy, [11, 11, 12, 12], torch.Generator().manual_seed(0), group_size=2)
    lengths = batch.mask.sum(-1)
    assert batch.obs.shape[:2] == batch.mask.shape == (4, int(lengths.max()))
    assert torch.equal(batch.obs[0, 0], batch.obs[1, 0]) and not torch.equal(batch.obs[0, 0], batch.obs[2, 0])
    # CartPole pays 1 per step, so each return is the episode's length; nothing is truncated early
    assert batch.row_returns().tolist() == lengths.tolist() == batch.episode_returns
    assert batch.env_steps == int(lengths.sum()) and not batch.cut.any()
    # padding is zero, and each sampled log-prob is the policy's log-prob of that action
    assert batch.obs[batch.mask == 0].abs().sum() == 0
    with torch.no_grad():
        again = policy.distribution(batch.flat(batch.obs)).log_prob(batch.flat(batch.actions))
    torch.testing.assert_close(again, batch.flat(batch.logp))


def test_greedy_episodes_from_one_seed_are_identical():
    envs = EnvBatch("CartPole-v1", 2)
    batch = run_episodes(envs, cartpole_policy(), [4, 4], torch.Generator(), deterministic=True)
    assert torch.equal(batch.obs[0], batch.obs[1]) and batch.episode_returns[0] == batch.episode_returns[1]


def test_time_limit_marks_rows_cut():
    envs = EnvBatch("Pendulum-v1", 2)  # 200-step time limit, never terminates
    torch.manual_seed(0)
    policy = make_policy(envs.obs_dim, envs.action_space, (8,))
    batch = run_episodes(envs, policy, [0, 1], torch.Generator().manual_seed(0))
    assert batch.mask.sum(-1).tolist() == [200.0, 200.0] and batch.cut.all()
    assert batch.actions.shape == (2, 200, 1)


def test_segments_cover_every_step_once_and_continue_across_windows():
    envs = EnvBatch("CartPole-v1", 3)
    collector = SegmentCollector(envs, seed=0)
    policy, gen = cartpole_policy(), torch.Generator().manual_seed(0)
    first = collector.collect(policy, 10, gen)
    second = collector.collect(policy, 10, gen)
    assert first.env_steps == second.env_steps == 30
    # Rows are ordered by environment then time. A random CartPole policy never reaches the time
    # limit, so the cut rows are exactly the three window ends, one per environment...
    cut_rows = first.cut.nonzero().squeeze(-1).tolist()
    assert len(cut_rows) == 3 and cut_rows[-1] == first.num_rows - 1
    # ...and each continues in the next window: its last_obs is the next window's first observation
    second_starts = [0] + [r + 1 for r in second.cut.nonzero().squeeze(-1).tolist()[:-1]]
    for row, start in zip(cut_rows, second_starts):
        torch.testing.assert_close(first.last_obs[row], second.obs[start, 0])
    # episodes of ~20 steps span windows of 10, and their returns are counted across windows
    more = [collector.collect(policy, 10, gen) for _ in range(8)]
    assert max(length for b in more for length in b.episode_lengths) > 10
    assert all(r == float(length) for b in more for r, length in zip(b.episode_returns, b.episode_lengths))


def test_categorical_sample_and_mode():
    policy = CategoricalPolicy(2, _Discrete(3), (4,))
    obs = torch.randn(5, 2)
    actions, logp = policy.sample(obs, torch.Generator().manual_seed(1))
    torch.testing.assert_close(logp, policy.distribution(obs).log_prob(actions))
    assert torch.equal(policy.mode(obs), policy.distribution(obs).probs.argmax(-1))


def test_gaussian_log_prob_by_hand():
    # zero network -> mean 0; log_std = log 2 -> N(0, 4). log N(1; 0, 4) = -1/8 - log 2 - log(2 pi)/2 = -1.7371
    policy = GaussianPolicy(3, _Box(1), (4,))
    with torch.no_grad():
        for p in policy.net.parameters():
            p.zero_()
        policy.log_std.fill_(math.log(2.0))
    logp = policy.distribution(torch.zeros(1, 3)).log_prob(torch.tensor([[1.0]]))
    assert logp.item() == pytest.approx(-0.125 - math.log(2.0) - 0.5 * math.log(2 * math.pi), abs=1e-6)
    assert logp.item() == pytest.approx(-1.7371, abs=1e-4)
    actions, sampled_logp = policy.sample(torch.zeros(4, 3), torch.Generator().manual_seed(0))
    assert actions.shape == (4, 1)
    torch.testing.assert_close(sampled_logp, policy.distribution(torch.zeros(4, 3)).log_prob(actions))


def _Discrete(n):
    import gymnasium as gym

    return gym.spaces.Discrete(n)


def _Box(dim):
    import gymnasium as gym

    return gym.spaces.Box(-1.0, 1.0, (dim,), dtype=np.float32)
