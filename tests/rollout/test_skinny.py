"""Few-row decode products: both layouts compute the same product, the faster is learnt per shape and row
count from the calls' own timings, and decoding gives the same completions whichever is chosen."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from grouprl.rollout.sampler import Sampler
from grouprl.rollout.skinny import (
    MAX_ROWS,
    PLAIN,
    SAMPLES,
    TRANSPOSED,
    SkinnyProducts,
    Timings,
    model_linears,
    transposed_linear,
)
from grouprl.types import SamplingParams
from tests.helpers.rollout import PROMPTS, encode, make_model, make_tokenizer


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(3, 16), (2, 1, 16), (1, 16)])
def test_the_transposed_layout_is_the_same_product(bias, shape):
    torch.manual_seed(0)
    layer = nn.Linear(16, 40, bias=bias)
    x = torch.randn(*shape)
    y = transposed_linear(layer, x)
    assert y.shape == (*shape[:-1], 40)
    torch.testing.assert_close(y, layer(x), rtol=1e-6, atol=1e-6)


def test_each_layout_is_timed_then_the_faster_kept(monkeypatch):
    """Calls alternate between the layouts until each has SAMPLES timings (the first call of each, slow
    here, not counted); then only the faster runs."""
    import grouprl.rollout.skinny as skinny

    now, used = [0.0], []

    def layout(which, cost):
        def run(module, x):
            first = which not in used
            used.append(which)
            now[0] += 100.0 if first else cost
            return x @ module.weight.t()
        return run

    monkeypatch.setattr(skinny, "LAYOUTS", (layout(PLAIN, 3.0), layout(TRANSPOSED, 1.0)))
    products = SkinnyProducts(clock=lambda: now[0])
    layer, x = nn.Linear(16, 40, bias=False), torch.randn(2, 16)
    for _ in range(2 * (SAMPLES + 1) + 3):
        products.linear(layer, x)
    trial = used[: 2 * (SAMPLES + 1)]
    assert trial.count(PLAIN) == trial.count(TRANSPOSED) == SAMPLES + 1
    assert used[2 * (SAMPLES + 1):] == [TRANSPOSED] * 3
    assert products.table[(40, 16, 2)].seconds == [3.0 * SAMPLES, 1.0 * SAMPLES]
    assert products.chosen() == {(40, 16, 2): "(W @ x.T).T"}


def test_only_few_row_float32_steps_outside_autocast_are_rerouted():
    model = make_model(make_tokenizer())
    linears = model_linears(model)
    products = SkinnyProducts()
    with products.step(linears, MAX_ROWS):
        assert all("forward" in m.__dict__ for m in linears)
    assert not any("forward" in m.__dict__ for m in linears)  # put back
    with products.step(linears, MAX_ROWS + 1):
        assert not any("forward" in m.__dict__ for m in linears)
    with torch.autocast("cpu", dtype=torch.bfloat16), products.step(linears, 2):
        assert not any("forward" in m.__dict__ for m in linears)
    with pytest.raises(RuntimeError), products.step(linears, 2):
        raise RuntimeError("a failing step")
    assert not any("forward" in m.__dict__ for m in linears)


def decided(layout):
    """A table that has settled on ``layout`` for every shape at every few-row count."""
    seconds = [1.0, 2.0] if layout == PLAIN else [2.0, 1.0]
    products = SkinnyProducts()
    products.table = _AlwaysDecided(seconds)
    return products


class _AlwaysDecided(dict):
    def __init__(self, seconds):
        super().__init__()
        self.seconds, self.lookups = seconds, 0

    def setdefault(self, key, default=None):
        self.lookups += 1
        return Timings(calls=[SAMPLES + 1] * 2, seconds=list(self.seconds))


def test_decoding_gives_the_same_completions_in_either_layout():
    tok = make_tokenizer()
    model = make_model(tok, seed=1)
    ids = encode(tok, PROMPTS[:2])
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    outs = []
    for layout in (PLAIN, TRANSPOSED):
        sampler = Sampler(model, tok)
        sampler.products = decided(layout)
        outs.append(sampler.generate(ids, 3, params, seed=7))  # 6 rows: every step is a few-row step
        assert sampler.products.table.lookups > 0  # the decode steps did go through the chosen layout
    plain, transposed = outs
    assert torch.equal(plain.completion_ids, transposed.completion_ids)
    torch.testing.assert_close(plain.sampling_logprobs, transposed.sampling_logprobs, rtol=1e-5, atol=1e-5)
