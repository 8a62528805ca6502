import math

import pytest
import torch

from grouprl.algos import AGGREGATIONS, aggregate

VALUES = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 0.0, 0.0], [7.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]], dtype=torch.float32)
# row means: 2.5, 5.5, 7, 1 ; row sums: 10, 11, 7, 3 ; tokens: 4+2+1+3 = 10


@pytest.mark.parametrize(
    "mode, kwargs, expected",
    [
        ("seq-mean-token-mean", {}, (2.5 + 5.5 + 7 + 1) / 4),  # 4.0
        ("token-mean", {}, (10 + 11 + 7 + 3) / 10),  # 3.1
        ("seq-mean-token-sum-norm", {"max_tokens": 8}, (10 + 11 + 7 + 3) / (4 * 8)),
        ("group-sum", {"group_size": 2}, ((2.5 + 5.5) + (7 + 1)) / 2),  # 8.0
        ("group-sqrt", {"group_size": 2}, ((2.5 + 5.5) + (7 + 1)) / (2 * math.sqrt(2))),
    ],
)
def test_modes_against_hand_values(mode, kwargs, expected):
    assert aggregate(VALUES, MASK, mode, **kwargs).item() == pytest.approx(expected)


def test_padding_values_are_ignored():
    noisy = VALUES.clone()
    noisy[MASK == 0] = 1e6
    for mode in AGGREGATIONS:
        kw = {"max_tokens": 8, "group_size": 2}
        assert aggregate(noisy, MASK, mode, **kw).item() == pytest.approx(aggregate(VALUES, MASK, mode, **kw).item())


@pytest.mark.parametrize("mode", sorted(["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm",
                                         "group-sum", "group-sqrt"]))
def test_micro_batches_sum_to_the_whole(mode):
    """The accumulation invariant: with the minibatch's totals as denominators, the loss of the
    whole batch equals the sum of its micro-batch losses (and so do the gradients)."""
    torch.manual_seed(0)
    v = torch.randn(8, 6, requires_grad=True)
    mask = (torch.rand(8, 6) > 0.3).float()
    mask[:, 0] = 1
    kw = {"max_tokens": 6, "group_size": 2}
    whole = aggregate(v, mask, mode, **kw)
    (g_whole,) = torch.autograd.grad(whole, v)
    total = torch.zeros(())
    for rows in (slice(0, 2), slice(2, 6), slice(6, 8)):
        total = total + aggregate(v[rows], mask[rows], mode, num_rows=8, num_tokens=mask.sum().item(), **kw)
    (g_parts,) = torch.autograd.grad(total, v)
    assert total.item() == pytest.approx(whole.item(), abs=1e-6)
    torch.testing.assert_close(g_parts, g_whole)


def test_token_mean_weights_tokens_not_rows():
    # A 1-token row and a 3-token row: token-mean gives the long row 3/4 of the weight.
    v = torch.tensor([[4.0, 0, 0], [0.0, 0.0, 0.0]])
    m = torch.tensor([[1.0, 0, 0], [1.0, 1.0, 1.0]])
    assert aggregate(v, m, "token-mean").item() == pytest.approx(1.0)
    assert aggregate(v, m, "seq-mean-token-mean").item() == pytest.approx(2.0)


def test_missing_parameters_and_unknown_mode():
    with pytest.raises(ValueError, match="needs max_tokens"):
        aggregate(VALUES, MASK, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="needs group_size"):
        aggregate(VALUES, MASK, "group-sqrt")
    with pytest.raises(ValueError, match="valid names"):
        aggregate(VALUES, MASK, "mean")


def test_bf16_values():
    out = aggregate(VALUES.bfloat16(), MASK, "token-mean")
    assert out.item() == pytest.approx(3.1, rel=1e-2)
