"""The FLOP counts ``benchmarks/limit.py`` divides by, on a model small enough to count by hand."""

import importlib
import pathlib
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def limit():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module("limit")
    finally:
        sys.path.remove(str(BENCHMARKS))


def tiny(limit):
    # per layer and token: 2 * (q, o: 2*2*2 + k, v: 2*2*2 + MLP: 3*2*3 = 34) = 68, attention 4 * 2 * context
    return limit.Shape(hidden=2, intermediate=3, layers=1, kv_dim=2, vocab=5)  # head: 2 * 2 * 5 = 20 a prediction


def test_a_row_out_of_the_loss_costs_nothing_in_the_passes(limit):
    # one prompt of 2 tokens, G = 2 completions of 2 and 1 tokens, the second row out of the loss
    flops = limit.phase_flops(tiny(limit), [2], [2, 1], 2, [True, False])
    # prompt at contexts 1, 2: 2 * 68 + 8 * 3 = 160; the first completion's first token fed at context 3:
    # 68 + 24 = 92; its 2 predictions: 40
    assert flops["logprobs"] == 292
    assert flops["update"] == 3 * 292
    # generation reads every row: prompt 160, completion tokens at contexts 3, 4 and 3: 3 * 68 + 8 * 10 = 284,
    # 1 + 3 predictions: 80
    assert flops["generation"] == 524


def test_every_row_in_the_loss_and_none(limit):
    shape = tiny(limit)
    assert limit.phase_flops(shape, [2], [2, 1], 2)["logprobs"] == 292 + 20  # the second row's one prediction
    assert limit.phase_flops(shape, [2], [2, 1], 2, [False, False])["update"] == 0
