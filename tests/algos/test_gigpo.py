"""GiGPO's two levels by hand: one reset, three trajectories, repeated states."""

import pytest
import torch

from grouprl.algos.gigpo import gigpo_advantages, step_group_ids

# One reset (episode group 0), three trajectories, gamma 0.5, w 1.
#   traj 1: states s0, s1      rewards 0, 1     step returns 0 + .5*1 = .5, 1          return 1
#   traj 2: states s0, s2      rewards 0, 0     step returns 0, 0                      return 0
#   traj 3: states s0, s1, s3  rewards 0, 0, 1  step returns .25, .5, 1               return 1
# Episode level (mean only): returns 1, 0, 1, mean 2/3 -> 1/3, -2/3, 1/3 (over trajectories, not steps).
# Anchor s0: returns .5, 0, .25, mean .25 -> .25, -.25, 0.   Anchor s1: returns 1, .5 -> .25, -.25.
# s2 and s3 occur once: A_step = 0.
# Sum: traj 1: 1/3 + .25, 1/3 + .25;  traj 2: -2/3 - .25, -2/3;  traj 3: 1/3, 1/3 - .25, 1/3.
REWARDS = torch.tensor([[0., 1., 0.], [0., 0., 0.], [0., 0., 1.]])
KEYS = torch.tensor([[0, 1, -1], [0, 2, -1], [0, 1, 3]])
MASK = torch.tensor([[1., 1., 0.], [1., 1., 0.], [1., 1., 1.]])


def run(scale="none", weight=1.0, groups=(0, 0, 0), returns=(1., 0., 1.)):
    return gigpo_advantages(torch.tensor(returns), torch.tensor(groups), REWARDS, KEYS, MASK, gamma=0.5,
                            step_weight=weight, scale=scale)


def test_hand_worked_mean_normalised():
    adv, metrics = run()
    third = 1 / 3
    want = [[third + .25, third + .25, 0.], [-2 * third - .25, -2 * third, 0.], [third, third - .25, third]]
    torch.testing.assert_close(adv, torch.tensor(want))
    assert metrics == {"gigpo/step_groups": 2.0, "gigpo/step_group_size_mean": 2.5,
                       "gigpo/singleton_frac": pytest.approx(2 / 7)}


def test_the_step_weight_scales_only_the_step_level():
    base, _ = run(weight=0.0)
    torch.testing.assert_close(base, torch.tensor([[1 / 3, 1 / 3, 0], [-2 / 3, -2 / 3, 0], [1 / 3, 1 / 3, 1 / 3]]))
    double, _ = run(weight=2.0)
    assert double[0, 0].item() == pytest.approx(1 / 3 + 0.5)


def test_std_normalisation_divides_each_level_by_its_own_group_std():
    adv, _ = run(scale="group")
    episode = (torch.tensor([1., 0., 1.]) - 2 / 3) / torch.tensor([1., 0., 1.]).std(unbiased=False)
    s0 = torch.tensor([.5, 0., .25])
    s0 = (s0 - s0.mean()) / s0.std(unbiased=False)
    assert adv[0, 0].item() == pytest.approx(float(episode[0] + s0[0]))
    assert adv[1, 1].item() == pytest.approx(float(episode[1]))  # s2 alone: episode level only
    assert adv[0, 1].item() == pytest.approx(float(episode[0] + 1.0))  # s1: two returns, one std each side


def test_anchor_groups_never_span_resets():
    # the same keys in two different resets: no state is shared, every step is alone
    adv, metrics = gigpo_advantages(torch.tensor([1., 0.]), torch.tensor([0, 1]), torch.tensor([[0., 1.], [0., 0.]]),
                                    torch.tensor([[0, 1], [0, 1]]), torch.ones(2, 2), gamma=0.5)
    assert metrics["gigpo/step_groups"] == 0.0 and metrics["gigpo/singleton_frac"] == 1.0
    assert adv.abs().sum() == 0  # each reset's only trajectory: no episode signal either


def test_long_trajectories_do_not_weigh_more_in_the_episode_mean():
    # returns 1 (10 steps) and 0 (1 step): the episode baseline is 0.5, not the mean over 11 step rows
    mask = torch.zeros(2, 10)
    mask[0] = 1
    mask[1, 0] = 1
    keys = torch.full((2, 10), -1)
    adv, _ = gigpo_advantages(torch.tensor([1., 0.]), torch.tensor([0, 0]), torch.zeros(2, 10), keys, mask,
                              scale="none")
    assert adv[0, 0].item() == pytest.approx(0.5) and adv[1, 0].item() == pytest.approx(-0.5)


def test_step_group_ids_number_by_first_appearance_and_give_singletons_their_own():
    ids = step_group_ids(torch.tensor([0, 0, 1]), torch.tensor([[7, -1], [7, 8], [7, 8]]), torch.ones(3, 2))
    # (0, 7) first -> 0; (0, 8) -> 1; (1, 7) -> 2; (1, 8) -> 3; the keyless step -> 4
    assert ids.tolist() == [[0, 4], [0, 1], [2, 3]]


def test_rounded_state_keys_by_hand():
    from grouprl.algos.gigpo import rounded_state_keys

    # episode 0 visits (0.12, 1.0) then (0.31, 1.0); episode 1 visits (0.14, 1.0) then (0.38, 1.0);
    # at one decimal the first steps are one state (0.1, 1.0), the second ones differ (0.3 vs 0.4);
    # at zero decimals all four are (0, 1)
    obs = torch.tensor([[[0.12, 1.0], [0.31, 1.0]], [[0.14, 1.0], [0.38, 1.0]]])
    mask = torch.ones(2, 2)
    assert rounded_state_keys(obs, mask, 1).tolist() == [[0, 1], [0, 2]]
    assert rounded_state_keys(obs, mask, 0).tolist() == [[0, 0], [0, 0]]
    assert rounded_state_keys(obs, torch.zeros(2, 2), 1).tolist() == [[-1, -1], [-1, -1]]
