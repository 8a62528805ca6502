"""The decode-step attention against PyTorch's SDPA on grouped heads expanded to every query head."""

from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from grouprl.models import tiny_causal_lm
from grouprl.rollout import attention
from grouprl.rollout.attention import NAME, decoding, grouped_attention, sdpa_configs


def expanded_sdpa(q, k, v, mask, scale):
    g, queries, length = q.shape[1] // k.shape[1], q.shape[2], k.shape[2]
    if mask is None:  # the new queries are the last ones: each sees the positions up to its own
        mask = torch.ones(queries, length, dtype=torch.bool).tril(length - queries)
    out = F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), attn_mask=mask,
                                         scale=scale)
    return out.transpose(1, 2)


def grouped_case(queries, mask_kind, dtype=torch.float32):
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
    return q.to(dtype), k.to(dtype), v.to(dtype), mask, d ** -0.5


@pytest.mark.parametrize("kernel", ["_fused", "_products"])
@pytest.mark.parametrize("queries", [1, 3])
@pytest.mark.parametrize("mask_kind", ["bool", "float", "none"])
def test_grouped_heads_attend_as_sdpa_on_expanded_heads(kernel, queries, mask_kind):
    q, k, v, mask, scale = grouped_case(queries, mask_kind)
    with mock.patch.object(attention, "_products", getattr(attention, kernel)):  # float32 on a CPU runs _products
        out = grouped_attention(q, k, v, mask, scale)
    torch.testing.assert_close(out, expanded_sdpa(q, k, v, mask, scale), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("queries", [1, 3])
@pytest.mark.parametrize("mask_kind", ["bool", "float", "none"])
def test_bf16_attends_as_float32_to_its_rounding(queries, mask_kind):
    q, k, v, mask, scale = grouped_case(queries, mask_kind)
    lowered = grouped_case(queries, mask_kind, torch.bfloat16)
    out = grouped_attention(*lowered)
    assert out.dtype == torch.bfloat16
    expected = expanded_sdpa(*(t.to(torch.bfloat16).float() for t in (q, k, v)), mask, scale)
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)


def test_each_format_runs_its_kernel():
    q, k, v, mask, scale = grouped_case(1, "bool")
    for dtype, kernel in ((torch.float32, "_products"), (torch.bfloat16, "_fused")):
        with mock.patch.object(attention, kernel, wraps=getattr(attention, kernel)) as spy:
            grouped_attention(q.to(dtype), k.to(dtype), v.to(dtype), mask, scale)
        assert spy.call_count == 1, (dtype, kernel)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kernel", ["_fused", "_products"])
@pytest.mark.parametrize("float_mask", [False, True])
def test_a_query_with_nothing_to_attend_to_stays_finite(dtype, kernel, float_mask):
    q, k, v = torch.randn(1, 2, 1, 4, dtype=dtype), torch.randn(1, 1, 5, 4, dtype=dtype), torch.randn(1, 1, 5, 4,
                                                                                                        dtype=dtype)
    nothing = torch.zeros(1, 1, 1, 5, dtype=torch.bool)
    mask = torch.full((1, 1, 1, 5), float("-inf")) if float_mask else nothing
    assert torch.isfinite(getattr(attention, kernel)(q, k, v, mask, 0.5)).all()


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
