"""The two-level draw of :mod:`grouprl.rollout.picking` over vocabularies that span many blocks."""

from __future__ import annotations

import pytest
import torch

from grouprl.rollout.picking import BLOCK, _invert_cdf, pick_tokens
from grouprl.types import SamplingParams
from tests.rollout.test_distribution import chi_square_bound


def weights_with_gaps(vocab: int, seed: int = 0) -> torch.Tensor:
    """[1, vocab] weights in [0.05, 1.05) with zero runs: a whole empty block, scattered zeros, an empty tail.

    No weight is tiny: a token whose weight is below its block's float32 rounding (~1e-7 of the
    block) keeps its probability but not the exact position of its interval.
    """
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(1, vocab, generator=g) + 0.05
    w[:, BLOCK : 2 * BLOCK] = 0.0
    w[:, torch.randperm(vocab, generator=g)[: vocab // 5]] = 0.0
    w[:, -7:] = 0.0
    return w


@pytest.mark.parametrize("vocab", [3 * BLOCK, 3 * BLOCK + 100, 100])
def test_a_uniform_inside_a_tokens_interval_draws_that_token(vocab):
    w = weights_with_gaps(vocab)
    cdf = w[0].double().cumsum(0)
    total = cdf[-1]
    with_mass = (w[0] > 0).nonzero().flatten()
    # u at the middle of each token's interval [cdf[i] - w[i], cdf[i]) / total
    u = (cdf[with_mass] - w[0, with_mass].double() / 2) / total
    drawn, mass = _invert_cdf(w.expand(len(with_mass), -1).contiguous(), u)
    assert torch.equal(drawn, with_mass)
    assert torch.allclose(mass, total.expand(len(with_mass)), rtol=1e-6)
    # The ends: u = 0 takes the first token with mass, u just below 1 the last one (never the empty tail).
    ends, _ = _invert_cdf(w.expand(2, -1).contiguous(), torch.tensor([0.0, 1.0 - 1e-16], dtype=torch.float64))
    assert ends.tolist() == [int(with_mass[0]), int(with_mass[-1])]


@pytest.mark.slow  # 200,000 draws over five blocks of the vocabulary
def test_the_draw_follows_the_distribution_across_blocks():
    vocab, draws = 5 * BLOCK + 37, 200_000
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(1, vocab, generator=g) * 2.0
    u = torch.rand(draws, generator=g, dtype=torch.float64)
    tokens, _ = pick_tokens(logits.expand(draws, -1), SamplingParams(max_new_tokens=1), u)
    expected = logits.double().softmax(-1)[0] * draws
    counts = torch.bincount(tokens, minlength=vocab).double()
    # Pool the rarest tokens so every cell expects at least 5 draws (chi-square's usual condition).
    rare = expected < 5
    chi2 = (((counts - expected) ** 2 / expected)[~rare]).sum()
    chi2 += (counts[rare].sum() - expected[rare].sum()) ** 2 / expected[rare].sum()
    assert float(chi2) < chi_square_bound(int((~rare).sum()))


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_new_tokens=1, temperature=1.0),
        SamplingParams(max_new_tokens=1, temperature=0.7, top_k=40),
        SamplingParams(max_new_tokens=1, temperature=1.2, top_p=0.8, min_p=0.01),
        SamplingParams(max_new_tokens=1, temperature=0.0),
    ],
    ids=["plain", "top_k", "top_p_min_p", "greedy"],
)
def test_a_row_draws_the_same_alone_in_a_batch_or_column_major(params):
    vocab, rows = 49_152, 16
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(rows, vocab, generator=g) * 3.0
    u = torch.rand(rows, generator=g, dtype=torch.float64)
    tokens, logp = pick_tokens(logits, params, u)
    alone = [pick_tokens(logits[i : i + 1], params, u[i : i + 1]) for i in range(rows)]
    assert torch.equal(torch.cat([t for t, _ in alone]), tokens)
    assert torch.equal(torch.cat([lp for _, lp in alone]), logp)
    # A head in the transposed layout hands over [b, V] logits with strides (1, b).
    column_major = logits.t().contiguous().t()
    tokens_cm, logp_cm = pick_tokens(column_major, params, u)
    assert torch.equal(tokens_cm, tokens) and torch.equal(logp_cm, logp)


def test_log_probs_are_log_softmax_renormalised_over_the_kept_tokens():
    vocab, rows = 3 * BLOCK + 11, 8
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(rows, vocab, generator=g) * 2.0
    u = torch.rand(rows, generator=g, dtype=torch.float64)
    plain = SamplingParams(max_new_tokens=1, temperature=0.8)
    tokens, logp = pick_tokens(logits, plain, u)
    expected = torch.log_softmax(logits / 0.8, -1).gather(-1, tokens[:, None])[:, 0]
    assert torch.allclose(logp, expected, atol=1e-5)
    top_k = SamplingParams(max_new_tokens=1, temperature=0.8, top_k=5)
    tokens, logp = pick_tokens(logits, top_k, u)
    kept = torch.log_softmax(logits / 0.8, -1).topk(5, -1).values  # [rows, 5]
    expected = torch.log_softmax(logits / 0.8, -1).gather(-1, tokens[:, None])[:, 0] - kept.logsumexp(-1)
    assert torch.allclose(logp, expected, atol=1e-5)
    greedy_tokens, greedy_logp = pick_tokens(logits, SamplingParams(max_new_tokens=1, temperature=0.0), None)
    assert torch.equal(greedy_tokens, logits.argmax(-1))
    assert torch.allclose(greedy_logp, torch.log_softmax(logits, -1).max(-1).values, atol=1e-5)
