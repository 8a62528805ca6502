"""What the weight-only rollout format (bf16-weights) does: rollouts score like the copy of the weights
of the moment (a changed model is copied again), near the fp32 model's log-probs by the format's rounding; the
decode steps run eagerly; the model's weights and forwards are left as they were."""

from __future__ import annotations

import pytest
import torch

from grouprl.rollout.cpu import bf16_weights
from grouprl.rollout.cpu.compiled import CompiledStep
from grouprl.rollout.logprobs import token_logprobs
from grouprl.rollout.runner import Runner
from grouprl.rollout.sampler import Sampler
from grouprl.types import SamplingParams
from tests.helpers.rollout import make_model

FORMATS = [pytest.param("bf16-weights", marks=pytest.mark.skipif(
    bf16_weights.unavailable() is not None, reason=f"bf16-weights kernel: {bf16_weights.unavailable()}"))]
GAPS = {"bf16-weights": (0.01, 0.1, 1e-5)}
"""Format -> bounds on |sampling log-prob - fp32 log-prob| over the completion tokens: (mean below, max below,
max above). bf16 rounding of the weights moves a token's log-prob by thousandths of a nat."""


@pytest.fixture()
def model(tok):
    return make_model(tok, seed=1, head_scale=4.0)


@pytest.mark.parametrize("fmt", FORMATS)
def test_rollouts_score_like_the_copies_of_the_weights_of_the_moment(model, tok, ids, fmt):
    sampler = Sampler(model, tok)
    params = SamplingParams(max_new_tokens=16, temperature=1.0, format=fmt)
    mean_below, max_below, max_above = GAPS[fmt]
    for change in range(2):
        if change:
            with torch.no_grad():
                model.lm_head.weight.mul_(-1.0)  # far from the first weights: stale copies would score badly
        batch = sampler.generate(ids, 2, params, seed=3)
        logp, _ = token_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                 batch.completion_mask)
        gap = (batch.sampling_logprobs - logp).abs()[batch.completion_mask.bool()]
        # the prefill's first tokens are fp32's; the one-token steps' are the copy's
        assert gap.mean() < mean_below and max_above < gap.max() < max_below


@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_steps_run_eagerly_and_leave_the_model_alone(model, tok, ids, fmt):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    runner = Runner(model, capacity=8, compiled=CompiledStep(), fmt=fmt)
    assert runner.compiled is None and runner.copies is not None
    Sampler(model, tok, compile_steps=True).generate(ids[:2], 2, SamplingParams(max_new_tokens=5, format=fmt),
                                                     seed=0)
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())
    assert not any("forward" in m.__dict__ for m in model.modules())
    assert Runner(model, capacity=8, compiled=CompiledStep(), fmt="fp32").copies is None
