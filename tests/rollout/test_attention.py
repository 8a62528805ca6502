"""The decode-step attention against PyTorch's SDPA on grouped heads expanded to every query head."""

import pytest
import torch
import torch.nn.functional as F

from grouprl.models import tiny_causal_lm
from grouprl.rollout.attention import NAME, decoding, grouped_attention, sdpa_configs


def expanded_sdpa(q, k, v, mask, scale):
    g, queries, length = q.shape[1] // k.shape[1], q.shape[2], k.shape[2]
    if mask is None:  # the new queries are the last ones: each sees the positions up to its own
        mask = torch.ones(queries, length, dtype=torch.bool).tril(length - queries)
    out = F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), attn_mask=mask,
                                         scale=scale)
    return out.transpose(1, 2)


@pytest.mark.parametrize("queries", [1, 3])
@pytest.mark.parametrize("mask_kind", ["bool", "float", "none"])
def test_grouped_heads_attend_as_sdpa_on_expanded_heads(queries, mask_kind):
    torch.manual_seed(0)
    b, h, kv, length, d = 3, 6, 2, 11, 8
    cache_k, cache_v = torch.randn(b, kv, 16, d), torch.randn(b, kv, 16, d)
    k, v = cache_k[:, :, :length], cache_v[:, :, :length]  # views of a larger cache, as the engine's are
    q = torch.randn(b, h, queries, d)
    mask = None
    if mask_kind != "none":
        keep = torch.ones(b, 1, queries, length, dtype=torch.bool)
        keep[1, :, :, :4] = False  # row 1 is left-padded by 4
        keep &= torch.ones(queries, length, dtype=torch.bool).tril(length - queries)  # causal among the new ones
        mask = keep if mask_kind == "bool" else torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    torch.testing.assert_close(grouped_attention(q, k, v, mask, d ** -0.5), expanded_sdpa(q, k, v, mask, d ** -0.5),
                               rtol=1e-5, atol=1e-6)


def test_a_query_with_nothing_to_attend_to_stays_finite():
    q, k, v = torch.randn(1, 2, 1, 4), torch.randn(1, 1, 5, 4), torch.randn(1, 1, 5, 4)
    assert torch.isfinite(grouped_attention(q, k, v, torch.zeros(1, 1, 1, 5, dtype=torch.bool), 0.5)).all()


def test_decoding_swaps_the_models_attention_and_restores_it():
    model, _ = tiny_causal_lm(seed=0)
    configs = sdpa_configs(model)
    assert configs and all(c._attn_implementation == "sdpa" for c in configs)
    ids = torch.randint(0, 100, (2, 7))
    with torch.no_grad():
        reference = model(ids).logits
        with decoding(configs):
            assert model.config._attn_implementation == NAME
            swapped = model(ids).logits  # 7 new positions: still SDPA, the same numbers
            last = model(ids[:, :1]).logits  # one position: the grouped path
    assert model.config._attn_implementation == "sdpa"
    torch.testing.assert_close(swapped, reference)
    torch.testing.assert_close(last, reference[:, :1], rtol=1e-5, atol=1e-5)
