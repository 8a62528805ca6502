"""The in-place KV buffer behaves like transformers' growing DynamicLayer."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

from grouprl.rollout.cache import BufferLayer, make_cache
from tests.helpers.rollout import make_model, make_tokenizer


def states(b: int, q: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(b, 2, q, 8, generator=gen), torch.randn(b, 2, q, 8, generator=gen)


def same(a: DynamicLayer, b: DynamicLayer) -> bool:
    return a.get_seq_length() == b.get_seq_length() and torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_buffer_layer_matches_dynamic_layer_through_a_rollout():
    ref, buf = DynamicLayer(), BufferLayer(capacity=12)
    for layer in (ref, buf):
        layer.update(*states(3, 5, 0))  # prefill of 3 prompts
        layer.batch_repeat_interleave(2)  # their groups
        layer.update(*states(6, 1, 1))
        layer.batch_select_indices(torch.tensor([0, 2, 3, 5]))  # two rows finished
        layer.update(*states(4, 1, 2))
        layer.reorder_cache(torch.tensor([1, 1, 0, 3]))  # a beam step
    assert same(ref, buf) and buf.keys.shape == (4, 2, 7, 8)
    ref.crop(-2)
    buf.crop(-2)
    assert same(ref, buf)
    buf.reset()
    assert buf.get_seq_length() == 0 and not buf.is_initialized


def test_buffer_layer_grows_past_its_capacity_keeping_what_it_held():
    ref, buf = DynamicLayer(), BufferLayer(capacity=4)
    for step, q in enumerate((4, 1, 6)):  # 4 fills it, 1 doubles it to 8, 6 more (11) doubles it to 16
        k, v = states(1, q, step)
        rk, rv = ref.update(k, v)
        bk, bv = buf.update(k, v)
        assert torch.equal(bk, rk) and torch.equal(bv, rv)
    assert buf.capacity == 16 and buf.get_seq_length() == 11


def test_make_cache_replaces_full_attention_layers():
    cache = make_cache(make_model(make_tokenizer()), capacity=10)
    assert len(cache.layers) == 2 and all(type(layer) is BufferLayer for layer in cache.layers)
