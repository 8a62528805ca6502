"""The sampled distribution is the one ``transformers``' logits warpers define."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from grouprl.rollout.sampler import Sampler
from grouprl.types import SamplingParams
from tests.helpers.rollout import encode, make_model, make_tokenizer

DRAWS = 20_000


@pytest.fixture(scope="module")
def setup():
    tok = make_tokenizer()
    model = make_model(tok, seed=1, init_range=0.2)  # peaked enough for top-p / min-p to bite
    ids = encode(tok, ["What is 7+5?"])
    with torch.no_grad():
        logits = model(torch.tensor(ids)).logits[:, -1].float()  # [1, V]
    return tok, model, ids, logits


def reference_distribution(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """softmax after the ``transformers`` warpers, in their order; [V]."""
    scores = TemperatureLogitsWarper(params.temperature)(None, logits.clone())
    if params.top_k:
        scores = TopKLogitsWarper(params.top_k)(None, scores)
    if params.top_p < 1:
        scores = TopPLogitsWarper(params.top_p)(None, scores)
    if params.min_p:
        scores = MinPLogitsWarper(params.min_p)(None, scores)
    return scores.softmax(-1)[0]


def chi_square_bound(df: int, z: float = 4.26) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile at normal score z (p ~ 1e-5)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_new_tokens=1, temperature=1.0),
        SamplingParams(max_new_tokens=1, temperature=0.7, top_k=10),
        SamplingParams(max_new_tokens=1, temperature=1.5, top_p=0.7),
        SamplingParams(max_new_tokens=1, temperature=1.0, min_p=0.2),
        SamplingParams(max_new_tokens=1, temperature=0.8, top_k=20, top_p=0.9, min_p=0.05),
    ],
    ids=["plain", "top_k", "top_p", "min_p", "all"],
)
def test_one_step_distribution_matches_warpers(setup, params):
    tok, model, ids, logits = setup
    expected = reference_distribution(logits, params)  # [V]
    batch = Sampler(model, tok).generate(ids, DRAWS, params, seed=0)
    first = batch.completion_ids[:, 0]
    counts = torch.bincount(first, minlength=expected.numel()).double()

    assert (expected[first] > 0).all(), "a filtered-out token was drawn"
    # Each draw's log-prob is its probability under the filtered, renormalised distribution.
    torch.testing.assert_close(batch.sampling_logprobs[:, 0], expected[first].log(), atol=1e-4, rtol=0)

    big = expected * DRAWS >= 5  # pool the rare tokens into one bin, as the test needs
    exp_bins = torch.cat([expected[big] * DRAWS, (expected[~big].sum() * DRAWS).view(1)]).double()
    obs_bins = torch.cat([counts[big], counts[~big].sum().view(1)])
    keep = exp_bins > 0
    stat = (((obs_bins - exp_bins) ** 2)[keep] / exp_bins[keep]).sum().item()
    df = int(keep.sum()) - 1
    assert df >= 4, "the distribution is too peaked to test"
    assert stat < chi_square_bound(df), f"chi-square {stat:.1f} with {df} degrees of freedom"
