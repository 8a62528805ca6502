"""Decode products: the three layouts compute the same product, the fastest is learnt per shape and row
count from the calls' own timings (a layout the CPU cannot run is left out), and decoding gives the same
completions whichever is chosen."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import grouprl.rollout.cpu.skinny as skinny
from grouprl.rollout.cpu.skinny import (
    LAYOUTS,
    MAX_ROWS,
    PACKED,
    PLAIN,
    SAMPLES,
    TRANSPOSED,
    PackedWeights,
    SkinnyProducts,
    Timings,
    model_linears,
)
from grouprl.rollout.sampler import Sampler
from grouprl.types import SamplingParams
from tests.helpers.rollout import PROMPTS, encode, make_model, make_tokenizer


def bf16_reorder_available() -> bool:
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.ones(8, 8, dtype=torch.bfloat16), None)
        return True
    except (RuntimeError, AttributeError):
        return False


@pytest.mark.parametrize("layout", [TRANSPOSED, PACKED])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(3, 16), (2, 1, 16), (1, 16)])
def test_each_layout_is_the_same_product(layout, bias, shape):
    torch.manual_seed(0)
    layer = nn.Linear(16, 40, bias=bias)
    x = torch.randn(*shape)
    y = LAYOUTS[layout](layer, x, PackedWeights())
    assert y.shape == (*shape[:-1], 40)
    torch.testing.assert_close(y, layer(x), rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not bf16_reorder_available(), reason="this CPU cannot reorder bf16 weights for oneDNN")
def test_the_packed_layout_in_bf16_is_autocasts_product():
    """bf16 weights under autocast, an fp32 input (autocast casts it): the packed product is bf16 and
    agrees with autocast's own to bf16 rounding."""
    torch.manual_seed(0)
    layer = nn.Linear(64, 96, bias=True).to(torch.bfloat16)
    x = torch.randn(5, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = layer(x)
        got = LAYOUTS[PACKED](layer, x, PackedWeights())
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


def count_reorders(monkeypatch) -> list[torch.Tensor]:
    """The weights oneDNN reorders from now on, in order."""
    made, reorder = [], torch.ops.mkldnn._reorder_linear_weight

    def counting(w, batch_size):
        made.append(w)
        return reorder(w, batch_size)

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", counting)
    return made


def test_a_weight_is_reordered_once_per_decode_loop(monkeypatch):
    calls = count_reorders(monkeypatch)
    a, b, packs = nn.Linear(8, 4), nn.Linear(8, 6), PackedWeights()
    for rows in (1, 3, 1):
        for layer in (a, b):
            LAYOUTS[PACKED](layer, torch.randn(rows, 8), packs)
    assert [w.shape for w in calls] == [a.weight.shape, b.weight.shape]


def fake_layouts(monkeypatch, costs, used, now):
    """Layouts that advance the fake clock by ``costs[i]`` (100 on a layout's first call ever)."""
    def layout(which):
        def run(module, x, packs):
            now[0] += 100.0 if which not in used else costs[which]
            used.append(which)
            return x @ module.weight.t()
        return run

    monkeypatch.setattr(skinny, "LAYOUTS", tuple(layout(i) for i in range(len(costs))))


def test_each_layout_is_timed_then_the_fastest_kept(monkeypatch):
    """Calls go round the layouts until each has SAMPLES timings (the first call of each, slow here, not
    counted); then only the fastest runs."""
    now, used = [0.0], []
    fake_layouts(monkeypatch, [3.0, 2.0, 1.0], used, now)
    products = SkinnyProducts(clock=lambda: now[0])
    layer, x = nn.Linear(16, 40, bias=False), torch.randn(2, 16)
    trial = 3 * (SAMPLES + 1)
    for _ in range(trial + 3):
        products.linear(layer, x, PackedWeights())
    assert [used[:trial].count(i) for i in (PLAIN, TRANSPOSED, PACKED)] == [SAMPLES + 1] * 3
    assert used[trial:] == [PACKED] * 3
    assert products.table[(40, 16, 2, torch.float32)].seconds == [3.0 * SAMPLES, 2.0 * SAMPLES, 1.0 * SAMPLES]
    assert products.chosen() == {(40, 16, 2, torch.float32): "oneDNN packed"}


def test_the_reorder_is_not_counted_as_the_layouts_time(monkeypatch):
    """The copy is made before the clock starts: a slow reorder does not make the packed layout lose."""
    now = [0.0]
    reorder = torch.ops.mkldnn._reorder_linear_weight

    def slow(w, batch_size):
        now[0] += 1000.0
        return reorder(w, batch_size)

    def timed(cost, layout):
        def run(module, x, packs):
            now[0] += cost
            return layout(module, x, packs)
        return run

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", slow)
    monkeypatch.setattr(skinny, "LAYOUTS", (timed(3.0, LAYOUTS[PLAIN]), timed(2.0, LAYOUTS[TRANSPOSED]),
                                            timed(1.0, LAYOUTS[PACKED])))
    products = SkinnyProducts(clock=lambda: now[0])
    layer, x = nn.Linear(16, 40, bias=False), torch.randn(2, 16)
    for _ in range(3 * (SAMPLES + 1)):
        products.linear(layer, x, PackedWeights())  # a new decode loop each call: a reorder each time
    timings = products.table[(40, 16, 2, torch.float32)]
    assert timings.decided and timings.seconds[PACKED] == 1.0 * SAMPLES
    assert products.chosen() == {(40, 16, 2, torch.float32): "oneDNN packed"}


def test_a_format_the_cpu_cannot_reorder_is_left_out(monkeypatch):
    """Where oneDNN refuses the reorder (bf16 without AVX-512 BW), the other two layouts are learnt and
    every call still returns the product."""
    def refuse(w, batch_size):
        raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx512bw")

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", refuse)
    now = [0.0]
    products = SkinnyProducts(clock=lambda: now[0])
    packs = PackedWeights()
    layer, x = nn.Linear(16, 40, bias=False), torch.randn(2, 16)
    for _ in range(2 * (SAMPLES + 1) + 2):
        torch.testing.assert_close(products.linear(layer, x, packs), layer(x), rtol=1e-6, atol=1e-6)
        now[0] += 1.0
    timings = products.table[(40, 16, 2, torch.float32)]
    assert timings.left_out == {PACKED} and timings.decided and timings.calls[PACKED] == 0
    assert not packs.supports(layer.weight)
    # a left-out layout is never chosen, though it has no timings at all
    assert Timings(left_out={PACKED}, calls=[SAMPLES + 1, SAMPLES + 1, 0], seconds=[1.0, 2.0, 0.0]).layout() == PLAIN


def test_which_steps_are_rerouted():
    """fp32 weights outside autocast and bf16 weights under bf16 autocast, up to MAX_ROWS rows; fp32
    weights under autocast run as they are; the forward is put back after a failing step too."""
    model = make_model(make_tokenizer())
    linears = model_linears(model)
    products, packs = SkinnyProducts(), PackedWeights()
    rerouted = lambda: all("forward" in m.__dict__ for m in linears)  # noqa: E731
    untouched = lambda: not any("forward" in m.__dict__ for m in linears)  # noqa: E731
    with products.step(linears, MAX_ROWS, packs):
        assert rerouted()
    assert untouched()
    with products.step(linears, MAX_ROWS + 1, packs):
        assert untouched()
    with torch.autocast("cpu", dtype=torch.bfloat16), products.step(linears, 2, packs):
        assert untouched()
    model.to(torch.bfloat16)
    with products.step(linears, 2, packs):
        assert untouched()
    with torch.autocast("cpu", dtype=torch.bfloat16), products.step(linears, 2, packs):
        assert rerouted()
    with pytest.raises(RuntimeError), products.step(linears, 2, packs):
        raise RuntimeError("a failing step")
    assert untouched()


def decided(layout):
    """A table that has settled on ``layout`` for every shape at every row count."""
    seconds = [2.0, 2.0, 2.0]
    seconds[layout] = 1.0
    products = SkinnyProducts()
    products.table = _AlwaysDecided(seconds)
    return products


class _AlwaysDecided(dict):
    def __init__(self, seconds):
        super().__init__()
        self.seconds, self.lookups = seconds, 0

    def setdefault(self, key, default=None):
        self.lookups += 1
        return Timings(calls=[SAMPLES + 1] * 3, seconds=list(self.seconds))


def test_decoding_gives_the_same_completions_in_any_layout():
    tok = make_tokenizer()
    model = make_model(tok, seed=1)
    ids = encode(tok, PROMPTS[:2])
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    outs = []
    for layout in (PLAIN, TRANSPOSED, PACKED):
        sampler = Sampler(model, tok)
        sampler.products = decided(layout)
        outs.append(sampler.generate(ids, 3, params, seed=7))  # 6 rows: every step is rerouted
        assert sampler.products.table.lookups > 0  # the decode steps did go through the chosen layout
    plain = outs[0]
    for other in outs[1:]:
        assert torch.equal(plain.completion_ids, other.completion_ids)
        torch.testing.assert_close(plain.sampling_logprobs, other.sampling_logprobs, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not bf16_reorder_available(), reason="this CPU cannot reorder bf16 weights for oneDNN")
def test_bf16_decoding_goes_through_the_packed_layout(monkeypatch):
    """A bf16 rollout's decode steps run on reordered copies of the rollout's bf16 weights, one per
    weight per rollout (a layer's stacked q, k, v one, its stacked gate, up one), and sample what plain
    bf16 products give to bf16 rounding."""
    made = count_reorders(monkeypatch)
    tok = make_tokenizer()
    model = make_model(tok, seed=1)
    ids = encode(tok, PROMPTS[:2])
    params = SamplingParams(max_new_tokens=12, temperature=1.0, format="bf16")
    outs = []
    for layout in (PLAIN, PACKED):
        sampler = Sampler(model, tok)
        sampler.products = decided(layout)
        outs.append(sampler.generate(ids, 3, params, seed=7))
    stacked = 3 * len(model.model.layers)  # five products a layer run as two
    assert [w.dtype for w in made] == [torch.bfloat16] * (len(model_linears(model)) - stacked)
    plain, packed = outs
    same = plain.completion_ids == packed.completion_ids
    first_difference = int(same.all(0).logical_not().nonzero()[0]) if not same.all() else same.shape[1]
    assert first_difference >= 1
    torch.testing.assert_close(plain.sampling_logprobs[:, :first_difference],
                               packed.sampling_logprobs[:, :first_difference], rtol=0.05, atol=0.05)


def test_copies_stop_at_the_budget_and_the_rest_run_plain():
    """A loop's copies fit in its budget; a weight past it runs ``x @ W.T`` untimed, and the layout stays
    on trial for later loops (with room) rather than being left out."""
    a, b = nn.Linear(8, 4), nn.Linear(8, 4)
    packs = PackedWeights(budget=a.weight.numel() * 4)  # room for one float32 weight of 4 x 8
    assert packs.of(a) is not None and packs.of(b) is None and packs.used == a.weight.numel() * 4
    now = [0.0]
    products = SkinnyProducts(clock=lambda: now[0])
    x = torch.randn(2, 8)
    timings = products.table.setdefault((4, 8, 2, torch.float32), Timings(calls=[2, 2, 0]))  # packed's turn
    y = products.linear(b, x, packs)
    torch.testing.assert_close(y, b(x), rtol=1e-6, atol=1e-6)
    assert timings.calls == [2, 2, 0] and timings.left_out == set()
    products.linear(b, x, PackedWeights(budget=None))  # the default budget: a share of the free memory
    assert timings.calls == [2, 2, 1]


def test_the_default_budget_is_a_share_of_the_available_memory(monkeypatch):
    if Path("/proc/meminfo").exists():
        assert 0 < skinny.available_memory() < 1 << 50
    monkeypatch.setattr(skinny, "available_memory", lambda: 1000)
    assert PackedWeights().budget == int(1000 * skinny.PACK_SHARE)
    monkeypatch.setattr(skinny, "available_memory", lambda: None)
    assert PackedWeights().budget is None


def test_row_counts_share_what_is_learnt_up_to_the_next_power_of_two():
    products, packs, layer = SkinnyProducts(), PackedWeights(), nn.Linear(8, 4)
    for rows in (1, 2, 3, 4, 5, 8, 9, 33, 64):
        products.linear(layer, torch.randn(rows, 8), packs)
    assert sorted(k[2] for k in products.table) == [1, 2, 4, 8, 16, 64]
    assert sum(products.table[(4, 8, 4, torch.float32)].calls) == 2  # rows 3 and 4
