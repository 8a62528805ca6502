"""The fused LM-head scores: the same log-probs, entropies and gradients as autograd through the
plain formulas, whichever of the two outputs the loss uses."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from grouprl.rollout import head as head_module
from grouprl.rollout.head import HeadScores, chunk_scores, score_chunks


def setup(seed=0, c=7, hidden=5, vocab=11):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(c, hidden, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(vocab, hidden, generator=g, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(0, vocab, (c,), generator=g)
    weights = torch.randn(2, c, generator=g, dtype=torch.float64)
    return h, w, tokens, weights


@pytest.mark.parametrize("reduce_rows", [32, 2])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("use", ["logp", "entropy", "both"])
def test_fused_matches_autograd_through_the_formulas(temperature, use, reduce_rows, monkeypatch):
    """Whole chunks and chunks reduced a few rows at a time (2: blocks of 2, 2 and 1 rows in a chunk of 3)."""
    monkeypatch.setattr(head_module, "REDUCE_ROWS", reduce_rows)
    h, w, tokens, weights = setup()

    def loss(logp, ent):
        terms = {"logp": (weights[0] * logp).sum(), "entropy": (weights[1] * ent).sum()}
        return terms["logp"] + terms["entropy"] if use == "both" else terms[use]

    lp, ent = HeadScores.apply(h, w, tokens, temperature, True, 3)  # chunks of 3, 3 and 1
    got = torch.autograd.grad(loss(lp, ent), (h, w))
    lp_ref, ent_ref = chunk_scores(lambda x: x @ w.t(), temperature, True, h, tokens)
    want = torch.autograd.grad(loss(lp_ref, ent_ref), (h, w))
    torch.testing.assert_close(lp, lp_ref)
    torch.testing.assert_close(ent, ent_ref)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_fused_gradient_against_finite_differences():
    h, w, tokens, weights = setup(seed=3, c=3, hidden=4, vocab=6)
    fn = lambda h, w: HeadScores.apply(h, w, tokens, 0.8, True, 2)
    assert torch.autograd.gradcheck(lambda h, w: sum((x * y).sum() for x, y in zip(fn(h, w), weights[:, :3])), (h, w))


def test_entropy_of_a_uniform_head_is_log_v():
    h = torch.zeros(2, 3)
    w = torch.randn(8, 3)
    _, ent = HeadScores.apply(h, w, torch.tensor([0, 5]), 1.0, True, 8)
    torch.testing.assert_close(ent, torch.full((2,), float(torch.log(torch.tensor(8.0)))))


class BiasedHead(nn.Linear):
    """Not a plain nn.Linear: takes the checkpointed path."""


def test_chunking_and_both_paths_agree():
    torch.manual_seed(0)
    plain = nn.Linear(6, 13, bias=False)
    other = BiasedHead(6, 13, bias=False)
    other.weight = plain.weight
    feats = torch.randn(10, 6, requires_grad=True)
    tokens = torch.randint(0, 13, (10,))
    results = []
    for head, size in ((plain, 3), (plain, 10), (other, 4)):
        feats.grad = None
        plain.weight.grad = None
        lp, ent = score_chunks(head, feats, tokens, 0.9, True, size)
        (lp.sum() + 0.5 * ent.sum()).backward()
        results.append((lp.detach(), ent.detach(), feats.grad.clone(), plain.weight.grad.clone()))
    for r in results[1:]:
        for a, b in zip(r, results[0]):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    with torch.no_grad():
        lp, ent = score_chunks(plain, feats, tokens, 0.9, False, 4)
    torch.testing.assert_close(lp, results[0][0])
    assert (ent == 0).all()


def _scores_and_grads(head, weight, feats, tokens, autocast: bool):
    feats = feats.detach().clone().requires_grad_(True)
    weight.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        lp, ent = score_chunks(head, feats, tokens, 0.9, True, 5)
    (lp.sum() + 0.5 * ent.sum()).backward()
    return lp.detach(), ent.detach(), feats.grad, weight.grad


def test_under_autocast_the_fused_head_multiplies_as_autocast_does(monkeypatch):
    """bf16 autocast over float32 weights: the fused head gives what autograd under checkpointing gives
    (products in bf16, log-softmax in float32), not the float32 results, and its weight gradient
    reaches the float32 weight."""
    torch.manual_seed(0)
    plain = nn.Linear(64, 300, bias=False)
    other = BiasedHead(64, 300, bias=False)
    other.weight = plain.weight
    feats, tokens = torch.randn(12, 64), torch.randint(0, 300, (12,))
    calls = []
    apply = HeadScores.apply
    monkeypatch.setattr(HeadScores, "apply", lambda *a: calls.append(a[1].dtype) or apply(*a))
    fused = _scores_and_grads(plain, plain.weight, feats, tokens, autocast=True)
    assert calls == [torch.bfloat16]  # one call for the 12 positions (chunks of 5), one weight cast
    checkpointed = _scores_and_grads(other, plain.weight, feats, tokens, autocast=True)
    float32 = _scores_and_grads(plain, plain.weight, feats, tokens, autocast=False)
    assert fused[3].dtype == torch.float32 and fused[2].dtype == torch.float32
    for a, b, c in zip(fused[:3], checkpointed[:3], float32[:3]):
        # the same bf16 products (summed in another order), at least 10x closer than the float32 results
        assert float((a - b).abs().max()) <= 0.1 * float((a - c).abs().max())
    # The weight gradient sums the chunks' products in bf16, as autograd sums the checkpointed chunks'
    # gradients, in another order (one accumulating product per chunk): its distance from the float32
    # gradient is the checkpointed path's (within 1.5x), and not zero.
    fused_error = float((fused[3] - float32[3]).abs().max())
    assert 0 < fused_error <= 1.5 * float((checkpointed[3] - float32[3]).abs().max())
