"""The general grouping: any partition by group ids gives what the contiguous reshape gives on
equal groups, groups of different sizes by hand, and the rank estimator by hand."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grouprl.algos import compute_advantages, constant_groups, constant_rows, rank_advantages
from grouprl.algos.group_advantages import completion_estimators

NAN = float("nan")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, NAN]), min_size=12, max_size=12),
       st.sampled_from(["group", "batch", "none"]), st.sampled_from([2, 3, 4, 6]))
def test_ids_equal_the_reshape_on_equal_contiguous_groups(values, scale, g):
    rewards = torch.tensor(values)
    ids = torch.arange(12) // g * 7 + 3  # any labels, one per group of g consecutive rows
    for name in completion_estimators():
        torch.testing.assert_close(compute_advantages(name, rewards, group_ids=ids, scale=scale),
                                   compute_advantages(name, rewards, g, scale=scale), atol=1e-6, rtol=1e-6)
    assert torch.equal(constant_groups(rewards, group_ids=ids), constant_groups(rewards, g))


def test_groups_of_different_sizes_in_any_order_by_hand():
    # group 5: rows 0, 3, 4 with rewards 1, 0, 2 -> mean 1, std sqrt(2/3); group 9: rows 1, 2 with 4, 6 -> mean 5, std 1
    rewards = torch.tensor([1.0, 4.0, 6.0, 0.0, 2.0])
    ids = torch.tensor([5, 9, 9, 5, 5])
    s = math.sqrt(2 / 3)
    expected = torch.tensor([0.0, -1.0, 1.0, -1 / s, 1 / s])
    torch.testing.assert_close(compute_advantages("grpo", rewards, group_ids=ids), expected)
    # rloo: each row against the mean of the others in its group: row 0: 1 - (0 + 2)/2 = 0; row 3: 0 - 1.5
    torch.testing.assert_close(compute_advantages("rloo", rewards, group_ids=ids),
                               torch.tensor([0.0, -2.0, 2.0, -1.5, 1.5]))
    # the order of groups is the order of first appearance
    assert constant_groups(torch.tensor([3.0, 1.0, 1.0, 3.0]), group_ids=torch.tensor([8, 2, 2, 8])).tolist() == \
        [True, True]
    assert constant_rows(torch.tensor([3.0, 1.0, 0.0, 3.0]), group_ids=torch.tensor([8, 2, 2, 8])).tolist() == \
        [True, False, False, True]


def test_a_group_reduced_to_one_row_gets_zero():
    # a dropped trajectory left group 1 with a single row: nothing to compare it with
    adv = compute_advantages("grpo", torch.tensor([1.0, 0.0, 7.0]), group_ids=torch.tensor([0, 0, 1]))
    assert adv.tolist() == [1.0, -1.0, 0.0]


def test_rank_by_hand():
    # rewards 3, 10, 10, 0: average ranks 2, 3.5, 3.5, 1; mean rank 2.5 -> centred -0.5, 1, 1, -1.5
    r = torch.tensor([3.0, 10.0, 10.0, 0.0])
    torch.testing.assert_close(rank_advantages(r, 4, scale="none"), torch.tensor([-0.5, 1.0, 1.0, -1.5]))
    # scaled by the group std of the centred ranks: sqrt((0.25 + 1 + 1 + 2.25) / 4) = sqrt(1.125)
    torch.testing.assert_close(rank_advantages(r, 4), torch.tensor([-0.5, 1.0, 1.0, -1.5]) / math.sqrt(1.125))
    # only the order counts: any increasing transform of the rewards gives the same advantages
    torch.testing.assert_close(rank_advantages(r.exp(), 4), rank_advantages(r, 4))
    # a NaN row is left out: ranks among 3, 10, 0 are 2, 3, 1 -> centred 0, 1, -1
    torch.testing.assert_close(rank_advantages(torch.tensor([3.0, 10.0, NAN, 0.0]), 4, scale="none"),
                               torch.tensor([0.0, 1.0, 0.0, -1.0]))


def test_a_grouping_is_needed():
    with pytest.raises(ValueError, match="give group_size"):
        compute_advantages("grpo", torch.ones(4))
    with pytest.raises(ValueError, match="must match rewards"):
        compute_advantages("grpo", torch.ones(4), group_ids=torch.zeros(3))
