import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grouprl.algos import compute_advantages, group_advantages, reinforce_advantages, rloo_advantages
from grouprl.registry import UnknownNameError


def test_worked_example_raw_and_normalised():
    # mean 0.3; centred [0.6, -0.2, -0.2, -0.2]; population std sqrt((0.36 + 3*0.04)/4) = sqrt(0.12)
    r = torch.tensor([0.9, 0.1, 0.1, 0.1])
    raw = group_advantages(r, 4, scale="none")
    torch.testing.assert_close(raw, torch.tensor([0.6, -0.2, -0.2, -0.2]), atol=1e-6, rtol=0)
    norm = group_advantages(r, 4)
    expected = torch.tensor([1.7320508, -0.5773503, -0.5773503, -0.5773503])
    torch.testing.assert_close(norm, expected, atol=1e-6, rtol=0)


def test_two_groups_are_independent_and_prompt_major():
    r = torch.tensor([1.0, 0.0, 5.0, 7.0])  # groups [1,0] and [5,7]
    torch.testing.assert_close(group_advantages(r, 2), torch.tensor([1.0, -1.0, -1.0, 1.0]))


def test_batch_scale_divides_by_one_shared_std():
    r = torch.tensor([1.0, 0.0, 5.0, 7.0])
    # centred per group: [0.5, -0.5, -1, 1]; population std over the batch: sqrt((0.25*2 + 1*2)/4) = sqrt(0.625)
    s = math.sqrt(0.625)
    expected = torch.tensor([0.5, -0.5, -1.0, 1.0]) / s
    torch.testing.assert_close(group_advantages(r, 2, scale="batch"), expected)


def test_group_sample_scale_is_the_sample_std_as_trl_computes_it():
    r = torch.tensor([1.0, 0.0, 0.0, 2.0, 2.0, float("nan"), 5.0])  # groups [1,0,0] and [2,2,nan,5] (ids)
    ids = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    # [1,0,0]: centred [2/3,-1/3,-1/3], squares sum 6/9, sample var (6/9)/2 = 1/3.
    # [2,2,5] (the NaN left out): mean 3, centred [-1,-1,2], squares sum 6, sample var 6/2 = 3.
    s1, s2 = math.sqrt(1 / 3), math.sqrt(3)
    expected = torch.tensor([2 / 3 / s1, -1 / 3 / s1, -1 / 3 / s1, -1 / s2, -1 / s2, 0.0, 2 / s2])
    got = compute_advantages("grpo", r, scale="group-sample", eps=1e-4, group_ids=ids)
    torch.testing.assert_close(got, expected * torch.tensor([s1 / (s1 + 1e-4)] * 3 + [s2 / (s2 + 1e-4)] * 4))
    trl = (r[:3] - r[:3].mean()) / (r[:3].std() + 1e-4)  # TRL's formula on the first group
    torch.testing.assert_close(got[:3], trl)


def test_all_equal_group_is_exactly_zero_even_with_float_residue():
    # 0.1 * 3 / 3 != 0.1 in floating point: a std-based test would produce +-1 here.
    r = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.7, 0.7, 0.0, 1.0, 0.0], dtype=torch.float64)
    adv = group_advantages(r, 3)
    assert torch.equal(adv[:6], torch.zeros(6))
    assert torch.isfinite(adv).all()
    assert adv[7] > 0 > adv[6]


def test_eps_damps_the_division():
    r = torch.tensor([1.0, 0.0])
    # centred [0.5, -0.5], std 0.5, divisor 0.5 + 1 = 1.5
    torch.testing.assert_close(group_advantages(r, 2, eps=1.0), torch.tensor([1 / 3, -1 / 3]))


def test_nan_reward_is_left_out_and_gets_zero():
    r = torch.tensor([1.0, float("nan"), 0.0, 0.0])
    adv = group_advantages(r, 4)
    # statistics over [1, 0, 0]: mean 1/3, std sqrt(2)/3
    s = math.sqrt(2) / 3
    expected = torch.tensor([(2 / 3) / s, 0.0, (-1 / 3) / s, (-1 / 3) / s])
    torch.testing.assert_close(adv, expected)
    # A group with a single valid reward has nothing to compare with.
    assert torch.equal(group_advantages(torch.tensor([float("nan"), 3.0]), 2), torch.zeros(2))


def test_group_of_one_is_rejected():
    with pytest.raises(ValueError, match="group_size must be >= 2"):
        group_advantages(torch.tensor([1.0, 2.0]), 1)


def test_batch_not_made_of_whole_groups_is_rejected():
    with pytest.raises(ValueError, match="whole groups of 4"):
        group_advantages(torch.ones(6), 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_input_gives_float32_result(dtype):
    adv = group_advantages(torch.tensor([0.9, 0.1, 0.1, 0.1], dtype=dtype), 4)
    assert adv.dtype == torch.float32
    # 0.9 and 0.1 are not exact in bf16, but the normalised advantages are scale-free.
    torch.testing.assert_close(adv, torch.tensor([1.7320508, -0.5773503, -0.5773503, -0.5773503]), atol=1e-5, rtol=0)


def test_rloo_hand_values():
    # baselines: [0.1, (0.9+0.1+0.1)/3, ...] -> advantages [0.8, -0.2667, -0.2667, -0.2667]
    adv = rloo_advantages(torch.tensor([0.9, 0.1, 0.1, 0.1]), 4)
    torch.testing.assert_close(adv, torch.tensor([0.8, -0.8 / 3, -0.8 / 3, -0.8 / 3]))
    # equals G/(G-1) times the centred reward
    torch.testing.assert_close(adv, 4 / 3 * reinforce_advantages(torch.tensor([0.9, 0.1, 0.1, 0.1]), 4))


def test_rloo_skips_nan_rows():
    adv = rloo_advantages(torch.tensor([1.0, float("nan"), 0.0, 0.0]), 4)
    torch.testing.assert_close(adv, torch.tensor([1.0, 0.0, -0.5, -0.5]))


def test_registry_lookup_and_unknown_name():
    r = torch.tensor([0.9, 0.1, 0.1, 0.1])
    torch.testing.assert_close(compute_advantages("grpo", r, 4, "group"), group_advantages(r, 4))
    with pytest.raises(UnknownNameError, match="valid names: gigpo, grpo, rank, reinforce, rloo"):
        compute_advantages("ppo", r, 4, "group")
    # a per-step estimator is in the registry, but its advantages need the turns, not rewards [B]
    with pytest.raises(ValueError, match="'gigpo' gives one advantage per step.*rewards \\[B\\]: grpo, rank, "
                                         "reinforce, rloo"):
        compute_advantages("gigpo", r, 4)
    with pytest.raises(UnknownNameError, match="valid names: batch, group, group-sample, none"):
        compute_advantages("grpo", r, 4, "global")


rewards_strategy = st.lists(st.floats(-100, 100, allow_nan=False, width=32), min_size=8, max_size=8)


@settings(max_examples=200, deadline=None)
@given(rewards_strategy, st.sampled_from(["grpo", "rloo"]), st.sampled_from(["group", "batch", "none"]))
def test_group_advantages_sum_to_zero(values, name, scale):
    r = torch.tensor(values)
    adv = compute_advantages(name, r, 4, scale).view(2, 4)
    assert torch.isfinite(adv).all()
    assert adv.sum(-1).abs().max() <= 1e-3 * max(1.0, adv.abs().max().item())


@settings(max_examples=100, deadline=None)
@given(rewards_strategy)
def test_group_scaled_advantages_have_unit_population_std(values):
    r = torch.tensor(values, dtype=torch.float64)
    adv = group_advantages(r, 4).view(2, 4)
    for row, group in zip(adv, r.view(2, 4)):
        if group.max() > group.min() and group.std(unbiased=False) > 1e-3:
            assert abs(row.std(unbiased=False).item() - 1.0) < 1e-4


def test_default_scale_is_the_estimators_own():
    r = torch.tensor([0.9, 0.1, 0.1, 0.1])
    # rloo and reinforce are not divided by the group std unless asked; grpo is
    torch.testing.assert_close(compute_advantages("rloo", r, 4), rloo_advantages(r, 4, scale="none"))
    torch.testing.assert_close(compute_advantages("reinforce", r, 4), torch.tensor([0.6, -0.2, -0.2, -0.2]))
    torch.testing.assert_close(compute_advantages("grpo", r, 4), group_advantages(r, 4, scale="group"))
    assert not torch.allclose(compute_advantages("rloo", r, 4), compute_advantages("rloo", r, 4, "group"))
