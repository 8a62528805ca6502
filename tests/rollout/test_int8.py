"""int8 decode steps: the quantization worked by hand, the product against its dequantized definition, which
products are rerouted and when (what the weight-only formats share: test_weight_only.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from grouprl.rollout import int8 as int8_module
from grouprl.rollout.int8 import int8_linear, quantize_rows, supported
from grouprl.rollout.runner import Runner, check_format
from grouprl.rollout.sampler import Sampler
from grouprl.rollout.weight_only import Copies, weight_only_products
from grouprl.types import SamplingParams
from tests.helpers.rollout import encode, make_model


@pytest.fixture()
def model(tok):
    return make_model(tok, seed=1, head_scale=4.0)


def test_rows_quantize_to_their_own_scale():
    w = torch.tensor([[127 / 64, -1.0, 0.5, 1 / 128],      # s = 1/64: 127, -64, 32, and 0.5 rounds to even
                      [0.0, 0.0, 0.0, 0.0],                # an all-zero row keeps scale 1
                      [-127 / 32, 1 / 32, 3 / 64, 0.0]])   # the largest magnitude negative: s = 1/32, 1.5 -> 2
    q, s = quantize_rows(w)
    assert q.dtype == torch.int8 and s.dtype == torch.bfloat16
    assert q.tolist() == [[127, -64, 32, 0], [0, 0, 0, 0], [-127, 1, 2, 0]]
    assert s.float().tolist() == [1 / 64, 1.0, 1 / 32]


def test_chunks_quantize_as_one(monkeypatch):
    w = torch.randn(37, 32)
    whole = quantize_rows(w)
    monkeypatch.setattr(int8_module, "CHUNK_ROWS", 5)
    assert all(torch.equal(a, b) for a, b in zip(whole, quantize_rows(w)))


def test_values_stay_within_half_a_step_of_their_row():
    w = torch.randn(64, 48) * torch.logspace(-3, 1, 64)[:, None]  # rows of very different sizes
    q, s = quantize_rows(w)
    err = (q.float() * s.float()[:, None] - w).abs()
    # half a step, plus what the scale's bf16 rounding (3 significant digits) moves the largest value by
    assert (err <= s.float()[:, None] * (0.5 + 127 * 2 ** -8)).all()
    assert (q.abs() <= 127).all()


def test_the_product_is_the_dequantized_weights_times_bf16_inputs():
    torch.manual_seed(0)
    layer = nn.Linear(64, 40, bias=True)
    x = torch.randn(2, 3, 64)  # [..., in] with two leading dimensions
    q, s = quantize_rows(layer.weight)
    y = int8_linear(layer, x, (q, s))
    want = x.bfloat16().float() @ (q.float() * s.float()[:, None]).t() + layer.bias
    assert y.shape == (2, 3, 40) and y.dtype == torch.float32
    # the kernel rounds its output to bf16 before the bias: a relative 2^-8 of each output
    torch.testing.assert_close(y, want, atol=1e-2, rtol=2 ** -7)
    assert (y - layer(x)).abs().max() > 1e-4  # and it is not the fp32 product


def test_copies_are_made_once_per_weight():
    layer, weights = nn.Linear(32, 8), Copies("int8")
    first = weights.of(layer)
    assert weights.of(layer)[0] is first[0] and weights.nbytes == 8 * 32 + 2 * 8


def test_only_widths_the_kernel_reads_correctly_are_rerouted():
    wide, narrow, frozen_bf16 = nn.Linear(32, 8), nn.Linear(24, 8), nn.Linear(32, 8).bfloat16()
    assert supported(wide) and not supported(narrow) and not supported(frozen_bf16)
    weights = Copies("int8")
    x = torch.randn(3, 32)
    with weight_only_products([wide, narrow, frozen_bf16], weights):
        torch.testing.assert_close(wide(x), int8_linear(wide, x, weights.of(wide)))
        assert torch.equal(narrow(torch.ones(3, 24)), nn.functional.linear(torch.ones(3, 24), narrow.weight,
                                                                           narrow.bias))
    assert "forward" not in wide.__dict__ and torch.equal(wide(x), nn.functional.linear(x, wide.weight, wide.bias))


def test_forwards_come_back_after_an_error():
    layer = nn.Linear(32, 8)
    with pytest.raises(RuntimeError, match="boom"), weight_only_products([layer], Copies("int8")):
        raise RuntimeError("boom")
    assert "forward" not in layer.__dict__


def count_int8_calls(monkeypatch) -> list[int]:
    """Rows of each int8 product call."""
    calls, real = [], torch.ops.aten._weight_int8pack_mm

    class Ops:
        @staticmethod
        def _weight_int8pack_mm(a, q, s):
            calls.append(a.shape[0])
            return real(a, q, s)

    monkeypatch.setattr(int8_module.torch.ops, "aten", Ops)
    return calls


def test_only_one_token_steps_multiply_int8_weights(model, tok, ids, monkeypatch):
    calls = count_int8_calls(monkeypatch)
    params = SamplingParams(max_new_tokens=6, temperature=1.0, format="int8")
    batch = Sampler(model, tok).generate(ids[:2], 2, params, seed=0)
    linears = 2 * 7 + 1  # per step: two layers' seven projections and the LM head
    assert len(calls) % linears == 0 and len(calls) // linears == batch.lengths.max().item() - 1  # no prefill
    assert max(calls) <= 4  # the running rows, never the prompts' positions


def test_formats_are_checked():
    with pytest.raises(ValueError, match="format must be one of fp32, bf16, bf16-weights, int8, got 'fp8'"):
        check_format("fp8", torch.device("cpu"))
    with pytest.raises(ValueError, match="int8 runs on a CPU"):
        check_format("int8", torch.device("cuda"))
    check_format("int8", torch.device("cpu"))


def test_multi_turn_rollouts_decode_in_int8_and_feed_replies_in_fp32(tok, model, monkeypatch):
    from grouprl.rollout.runner import left_pad
    from grouprl.rollout.turns import Reply, TurnLimits, decode_conversations

    calls = count_int8_calls(monkeypatch)
    kinds = []  # per Runner.forward: (new positions, int8 products it ran)
    forward = Runner.forward

    def spy(self, ids, mask, positions):
        before = len(calls)
        out = forward(self, ids, mask, positions)
        kinds.append((ids.shape[1], len(calls) - before))
        return out

    monkeypatch.setattr(Runner, "forward", spy)
    ids, mask = left_pad(encode(tok, ["Hi", "Say something"]), tok.pad_token_id, torch.device("cpu"))
    limits = TurnLimits(4, 3, 120)
    params = SamplingParams(max_new_tokens=limits.max_new_tokens, temperature=1.0, format="int8")

    answered: set[int] = set()

    def respond(rows, turns, stopped):  # every trajectory gets one reply, then ends
        replies = [Reply(None) if r in answered else Reply(encode(tok, ["ok then"])[0]) for r in rows]
        answered.update(rows)
        return replies

    with torch.inference_mode():
        out = decode_conversations(model, ids, mask, 2, params, limits, respond, list(range(4)),
                                   torch.tensor([tok.eos_token_id]), tok.pad_token_id)
    assert out.turns == [2, 2, 2, 2]
    assert sum(q > 1 for q, _ in kinds) >= 2  # the prompts' prefill and at least one feed of replies
    assert all(n == 0 for q, n in kinds if q > 1)  # those run in fp32
    assert all(n == 15 for q, n in kinds if q == 1)  # one-token steps: every product in int8
