"""Loss on the high-entropy tokens only: the quantile by hand, TRL's formula on the same inputs, and q = 1
leaving the loss exactly as it was."""

import pytest
import torch

from grouprl.algos import entropy_threshold, grpo_loss, top_entropy_weights


def test_threshold_and_selection_by_hand():
    entropy = torch.tensor([[0.0, 1.0, 2.0], [3.0, 4.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # the 9.0 is padding
    valid = entropy[mask > 0]  # [0, 1, 2, 3, 4]
    # q = 0.2: the 0.8 quantile of 5 values sits at index 0.8 * 4 = 3.2: 3 + 0.2 * (4 - 3) = 3.2 -> only the 4
    assert float(entropy_threshold(valid, 0.2)) == pytest.approx(3.2)
    torch.testing.assert_close(top_entropy_weights(entropy, mask, entropy_threshold(valid, 0.2)),
                               torch.tensor([[0.0, 0.0, 0.0], [0.0, 1.0, 0.0]]))
    # q = 0.4: index 0.6 * 4 = 2.4 -> 2.4: the 3 and the 4
    torch.testing.assert_close(top_entropy_weights(entropy, mask, entropy_threshold(valid, 0.4)),
                               torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]))
    # q = 1: every valid token, padding never
    assert torch.equal(top_entropy_weights(entropy, mask, entropy_threshold(valid, 1.0)), mask)
    assert float(entropy_threshold(torch.zeros(0), 0.2)) == float("-inf")  # no tokens: nothing to rank
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="top_entropy_quantile must be in \\(0, 1\\]"):
            entropy_threshold(valid, bad)


@pytest.mark.parametrize("q", [0.2, 0.5, 0.8])
def test_selection_equals_trls_get_high_entropy_mask(q):
    # TRL: threshold = torch.quantile(entropies[mask.bool()], 1 - q); mask = (entropies * mask >= threshold) & mask
    torch.manual_seed(0)
    entropy, mask = torch.rand(5, 7) * 3, (torch.rand(5, 7) > 0.3).float()
    trl = ((entropy * mask >= torch.quantile(entropy[mask.bool()], 1 - q)) & mask.bool()).float()
    ours = top_entropy_weights(entropy, mask, entropy_threshold(entropy[mask > 0], q))
    assert torch.equal(ours, trl), f"{int((ours != trl).sum())} tokens differ"
    assert abs(float(ours.sum()) / float(mask.sum()) - q) <= 1 / float(mask.sum())  # q of the tokens, +- one


def test_quantile_one_leaves_the_loss_exactly_as_it_was():
    torch.manual_seed(1)
    logp = (torch.randn(3, 4) - 1).requires_grad_()
    old, ref = logp.detach() + 0.2 * torch.randn(3, 4), logp.detach() - 0.1
    adv, mask, entropy = torch.tensor([1.0, -0.5, 0.3]), torch.ones(3, 4), torch.rand(3, 4)
    weights = top_entropy_weights(entropy, mask, entropy_threshold(entropy[mask > 0], 1.0))
    plain, _ = grpo_loss(logp, old, ref, adv, mask, beta=0.04)
    selected, _ = grpo_loss(logp, old, ref, adv.unsqueeze(-1) * weights, mask, beta=0.04)
    assert torch.equal(plain, selected)
    # q < 1: an unselected token carries no policy gradient, every selected one does
    weights = top_entropy_weights(entropy, mask, entropy_threshold(entropy[mask > 0], 0.25))
    (g,) = torch.autograd.grad(grpo_loss(logp, old, None, adv.unsqueeze(-1) * weights, mask)[0], logp)
    assert torch.equal(g[weights == 0], torch.zeros(int((weights == 0).sum())))
    assert (g[weights > 0] != 0).all()
