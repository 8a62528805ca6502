"""The rollout/trainer mismatch corrections, truncated (token, sequence) and masked (icepop, sequence-mask),
against hand-worked numbers, their limits, and the peers' formulas (TRL's token_mask, verl's geometric
rejection) written out from their documentation."""

import math

import pytest
import torch

from grouprl.algos.losses import clipped_surrogate_loss
from grouprl.algos.rollout_correction import (
    ROLLOUT_IS_LEVELS,
    rollout_is_weights,
    rollout_mismatch,
    truncated_is_weights,
)

LN2 = math.log(2.0)


def _logs(*probs):
    return torch.tensor([probs]).log()


def test_token_weights_are_the_capped_per_token_ratios():
    # pi_train = [0.5, 0.2, 0.9], pi_rollout = [0.25, 0.4, 0.9] -> ratios [2, 0.5, 1]; cap 1.5 -> [1.5, 0.5, 1]
    w, m = truncated_is_weights(_logs(0.5, 0.2, 0.9), _logs(0.25, 0.4, 0.9), torch.ones(1, 3), level="token", cap=1.5)
    torch.testing.assert_close(w, torch.tensor([[1.5, 0.5, 1.0]]))
    assert float(m["rollout/is_capped_frac"]) == pytest.approx(1 / 3)
    assert float(m["rollout/is_weight_mean"]) == pytest.approx(3.0 / 3)


def test_sequence_weight_is_the_capped_product_on_every_token_and_zero_on_padding():
    train = torch.cat([_logs(0.5, 0.2, 0.9), _logs(0.5, 0.5, 0.7)])
    rollout = torch.cat([_logs(0.25, 0.4, 0.9), _logs(0.25, 0.25, 0.1)])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    # row 0: 2 * 0.5 * 1 = 1 (under the cap); row 1: 2 * 2 = 4 (the padded 7x ratio is ignored) -> cap 1.5
    w, m = truncated_is_weights(train, rollout, mask, level="sequence", cap=1.5)
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.0, 1.0], [1.5, 1.5, 0.0]]))
    assert float(m["rollout/is_capped_frac"]) == pytest.approx(2 / 5)  # the two tokens of row 1
    assert float(m["rollout/is_weight_mean"]) == pytest.approx((3 * 1.0 + 2 * 1.5) / 5)


def test_mismatch_kl_by_hand():
    # r = pi_train / pi_rollout = [2, 0.5, 1]
    # k1 = mean(-log r) = (-ln2 + ln2 + 0) / 3 = 0
    # k3 = mean(r - 1 - log r) = ((1 - ln2) + (-0.5 + ln2) + 0) / 3 = 0.5 / 3
    m = rollout_mismatch(_logs(0.5, 0.2, 0.9), _logs(0.25, 0.4, 0.9), torch.ones(1, 3))
    assert float(m["rollout/mismatch_k1"]) == pytest.approx(0.0, abs=1e-7)
    assert float(m["rollout/mismatch_kl"]) == pytest.approx(((1 - LN2) + (-0.5 + LN2)) / 3, rel=1e-6)


def test_identical_engines_give_weight_one_and_zero_mismatch():
    logp = torch.randn(4, 5).clamp(max=0)
    w, m = truncated_is_weights(logp, logp.clone(), torch.ones(4, 5), level="sequence", cap=2.0)
    assert torch.equal(w, torch.ones(4, 5))
    assert float(m["rollout/mismatch_kl"]) == 0.0 and float(m["rollout/is_capped_frac"]) == 0.0


def test_huge_log_ratios_are_capped_without_overflow():
    w, _ = truncated_is_weights(torch.zeros(1, 2), torch.tensor([[-500.0, -500.0]]), torch.ones(1, 2),
                                level="sequence", cap=3.0)
    assert torch.equal(w, torch.full((1, 2), 3.0))


def test_folding_the_weight_into_the_advantage_weights_the_policy_term():
    torch.manual_seed(0)
    logp, old = torch.randn(3, 4) * 0.3 - 1, torch.randn(3, 4) * 0.3 - 1
    adv, mask = torch.tensor([1.0, -2.0, 0.5]), torch.ones(3, 4)
    w = torch.rand(3, 4) * 2
    plain, _ = clipped_surrogate_loss(logp, old, adv, mask, 0.2, dual_clip=3.0)
    folded, _ = clipped_surrogate_loss(logp, old, adv.unsqueeze(-1) * w, mask, 0.2, dual_clip=3.0)
    torch.testing.assert_close(folded, w * plain)


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="cap must be > 0"):
        truncated_is_weights(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), cap=0.0)
    with pytest.raises(ValueError, match="one shape"):
        truncated_is_weights(torch.zeros(1, 2), torch.zeros(1, 3), torch.ones(1, 2))
    with pytest.raises(ValueError, match="icepop, sequence, sequence-mask, token"):
        ROLLOUT_IS_LEVELS.get("seq")
    with pytest.raises(ValueError, match="0 <= low <= high, got low=2.0, high=1.0"):
        rollout_is_weights(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), level="icepop", low=2.0, high=1.0)
    with pytest.raises(TypeError, match="cap"):
        rollout_is_weights(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), level="icepop", cap=2.0)


def test_icepop_keeps_the_ratio_inside_its_band_and_drops_the_rest():
    # r = pi_train / pi_rollout = [0.5/0.25, 0.3/0.5, 0.9/0.9, 0.05/0.5] = [2, 0.6, 1, 0.1]; band [0.5, 5]
    w, m = rollout_is_weights(_logs(0.5, 0.3, 0.9, 0.05), _logs(0.25, 0.5, 0.9, 0.5), torch.ones(1, 4),
                              level="icepop", low=0.5, high=5.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.6, 1.0, 0.0]]))  # not capped: 2 stays 2
    assert float(m["rollout/is_masked_frac"]) == pytest.approx(1 / 4)
    assert float(m["rollout/is_weight_mean"]) == pytest.approx(3.6 / 4)
    # a tighter upper bound drops the 2 instead of capping it at 1.5 as truncation would
    w, _ = rollout_is_weights(_logs(0.5, 0.3, 0.9, 0.05), _logs(0.25, 0.5, 0.9, 0.5), torch.ones(1, 4),
                              level="icepop", low=0.5, high=1.5)
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.6, 1.0, 0.0]]))


def test_icepop_with_an_open_band_is_untruncated_token_is_and_no_correction_where_engines_agree():
    torch.manual_seed(0)
    train, rollout = torch.randn(3, 5) - 2, torch.randn(3, 5) - 2
    mask = torch.tensor([[1.0] * 5, [1.0] * 2 + [0.0] * 3, [1.0] * 4 + [0.0]])
    open_band, m = rollout_is_weights(train, rollout, mask, level="icepop", low=0.0, high=math.inf)
    untruncated, _ = rollout_is_weights(train, rollout, mask, level="token", cap=math.inf)
    torch.testing.assert_close(open_band, untruncated)
    torch.testing.assert_close(open_band, torch.exp(train - rollout) * mask)
    assert float(m["rollout/is_masked_frac"]) == 0.0
    same, _ = rollout_is_weights(train, train.clone(), mask, level="icepop")
    assert torch.equal(same, mask)  # r = 1 everywhere: weight 1, as no correction


def test_icepop_equals_trls_token_mask():
    # TRL's token_mask: 1[r <= C] * r (upper side only) = icepop with low = 0, high = C
    torch.manual_seed(1)
    train, rollout, mask = torch.randn(4, 6) - 1, torch.randn(4, 6) - 1, torch.ones(4, 6)
    r = torch.exp(train - rollout)
    trl = (r <= 2.0).float() * r
    ours, _ = rollout_is_weights(train, rollout, mask, level="icepop", low=0.0, high=2.0)
    torch.testing.assert_close(ours, trl)


def test_sequence_mask_drops_rows_whose_geometric_mean_ratio_leaves_the_band():
    train = torch.cat([_logs(0.5, 0.2, 0.9), _logs(0.5, 0.5, 0.7)])
    rollout = torch.cat([_logs(0.25, 0.4, 0.9), _logs(0.25, 0.25, 0.1)])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    # row 0: (2 * 0.5 * 1)^(1/3) = 1, inside [0.999, 1.001]: weight 1 (no IS weight);
    # row 1: (2 * 2)^(1/2) = 2 (the padded 7x ignored): dropped
    w, m = rollout_is_weights(train, rollout, mask, level="sequence-mask")
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    assert float(m["rollout/is_masked_frac"]) == pytest.approx(2 / 5)
    # an open band is no correction at all
    w, _ = rollout_is_weights(train, rollout, mask, level="sequence-mask", low=0.0, high=math.inf)
    assert torch.equal(w, mask)


def test_sequence_mask_equals_verls_geometric_rejection():
    # verl rollout_rs=geometric: reject when exp(mean_t log r_t) is outside [lower, upper]; no IS weight
    torch.manual_seed(2)
    train = torch.randn(6, 8) * 0.01 - 1
    rollout = train + torch.randn(6, 8) * 0.002
    mask = (torch.arange(8) < torch.tensor([8, 3, 5, 8, 1, 6]).unsqueeze(-1)).float()
    geo = torch.exp(((train - rollout) * mask).sum(-1) / mask.sum(-1))
    verl = ((geo >= 0.9995) & (geo <= 1.0005)).float().unsqueeze(-1) * mask
    ours, _ = rollout_is_weights(train, rollout, mask, level="sequence-mask", low=0.9995, high=1.0005)
    torch.testing.assert_close(ours, verl)
    assert 0 < float(verl.sum()) < float(mask.sum())  # both sides of the band are exercised
